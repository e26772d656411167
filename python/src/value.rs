//! micrograd's `Value`: a number, its gradient, and the op and operands that made it. Every
//! operator computes `data` at once (as micrograd does), with tapejit's formulas
//! (`tapejit::op`), so what Python sees is what the interpreter and the JIT compute. Derived
//! operators are built from the same primitives as micrograd builds them (`a - b` is
//! `a + (-b)`, `-a` is `a * -1`, `a / b` is `a * b**-1`), so the numbers match micrograd's.
//!
//! micrograd's `Value` is a plain Python object, and programs use it so: they set attributes
//! on values (`attrs.rs`), copy and pickle them (`pickle.rs`), and add ops of their own whose
//! backward is a Python function (`custom.rs`). `data` keeps its Python type where
//! micrograd's does (`number.rs`). Dropping a value releases its graph without recursion
//! (`release.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PySet, PyString};
use tapejit::op::{Op, F64};

use crate::attrs::{Extra, ExtraCell};
use crate::number::{int_flag, int_result};
pub use crate::number::{number, python_float, Number};

/// A value's flags ([`Value::flags`]).
pub mod flag {
    /// `data` reads as an int (`number.rs`).
    pub const INT: u64 = 1;
    /// A power whose exponent was written as an int (micrograd names the op `**2`, not
    /// `**2.0`).
    pub const INT_EXPONENT: u64 = 2;
    /// A leaf an operator made of a number (`2` in `2 * x`): a constant to `compile`.
    pub const CONSTANT: u64 = 4;
    /// It and every value under it are tracked by Python's cycle collector (`attrs.rs`).
    pub const GRAPH_TRACKED: u64 = 8;
    /// Its backward must run micrograd's algorithm (`custom.rs`): a node made by
    /// `Value(data, children, op)`, or one whose `_backward` the program set.
    pub const PYTHON_BACKWARD: u64 = 16;
    /// Its attributes hold a `_backward` the program set.
    pub const USER_BACKWARD: u64 = 32;
    /// Anomaly mode recorded where it was made (`anomaly.rs`), until it is dropped.
    pub const SITED: u64 = 64;
    /// How many low bits of [`super::Value::serial_and_flags`] the flags take.
    pub const BITS: u32 = 8;
}

/// A scalar and its gradient, as micrograd's `Value`. Immutable but for `data`, `grad`, its
/// attributes and some flags (and `mark`, `backward`'s own).
///
/// Its size is the drop-in's speed: a graph is built of hundreds of thousands of them, each
/// step anew. This is 72 bytes, 112 with Python's header and a weak reference's slot, as
/// before attributes and weak references (a `#[pyclass(dict)]` would cost an empty dict per
/// value too, made at once by CPython 3.11 and 3.12: see `attrs.rs`).
#[pyclass(name = "Value", module = "tapejit", frozen, weakref)]
pub struct Value {
    pub data: Number,
    pub grad: Number,
    /// The op that made it; `None` for a leaf (`Value(x)`, or a number an operator met) and
    /// for a node of the program's op (`custom.rs`).
    pub op: Option<Op>,
    /// Its operands, in order (every op here takes one or two).
    pub(crate) operands: [Option<Py<Value>>; 2],
    /// What few values have, made when first needed: a node of the program's op, its name
    /// and children; attributes (`attrs.rs`).
    pub extra: ExtraCell,
    /// Which `backward` last visited this value and where it put it (see `drop_in.rs`).
    pub mark: AtomicU64,
    /// When it was made (values are numbered as they are made, so operands come first) above
    /// the low [`flag::BITS`] bits, its flags ([`flag`]) in them: one word, for the size.
    serial_and_flags: AtomicU64,
}

/// The next value's serial. Values are made with the GIL held (each is a Python object), one
/// at a time, so a load and a store number them uniquely: a `fetch_add` is a locked
/// instruction, about 20 cycles a value.
static MADE: AtomicU64 = AtomicU64::new(0);

impl Value {
    /// A new value (the next serial) with `flags`, its gradient 0.
    fn with(data: f64, flags: u64, op: Option<Op>, operands: [Option<Py<Value>>; 2]) -> Value {
        let serial = MADE.load(Ordering::Relaxed);
        MADE.store(serial + 1, Ordering::Relaxed);
        Value {
            data: Number::new(data),
            grad: Number::new(0.0),
            op,
            operands,
            extra: ExtraCell::new(),
            mark: AtomicU64::new(0),
            serial_and_flags: AtomicU64::new(serial << flag::BITS | flags),
        }
    }

    /// `Value(x)`: a leaf, which Python's collector tracks (pyo3 tracks what it allocates).
    pub fn leaf(data: f64, int: bool) -> Value {
        let flags = flag::GRAPH_TRACKED | int_flag(data, int);
        Value::with(data, flags, None, [None, None])
    }

    /// A node of the program's op (`custom.rs`), with `extra`'s attributes.
    pub fn custom_node(data: f64, int: bool, extra: Extra) -> Value {
        let node = Value::with(
            data,
            flag::PYTHON_BACKWARD | int_flag(data, int),
            None,
            [None, None],
        );
        node.extra.get_or_init(|| extra);
        node
    }

    /// A value as a copy or a pickle describes it (`pickle.rs`): its flags but the
    /// collector's, its gradient 0.
    pub fn restored(
        data: f64,
        flags: u64,
        op: Option<Op>,
        operands: [Option<Py<Value>>; 2],
    ) -> Value {
        let flags = flags & (flag::INT | flag::INT_EXPONENT | flag::CONSTANT);
        Value::with(data, flags, op, operands)
    }

    /// A leaf made of a number an operator met.
    fn constant(data: f64, int: bool) -> Value {
        Value::with(
            data,
            flag::CONSTANT | int_flag(data, int),
            None,
            [None, None],
        )
    }

    /// When it was made: operands before the values made of them.
    pub fn serial(&self) -> u64 {
        self.serial_and_flags() >> flag::BITS
    }

    /// Its serial and its flags in one word (see [`Value::serial`]): orders values as their
    /// serials do.
    pub fn serial_and_flags(&self) -> u64 {
        self.serial_and_flags.load(Ordering::Relaxed)
    }

    /// [`Value::serial_and_flags`] for sorting, a plain read: a sort reads it a dozen times
    /// per value, and atomic reads are each done anew (micrograd's demo: 1.5% more
    /// instructions a step).
    pub fn sort_key(&self, _: Python<'_>) -> u64 {
        // SAFETY: the word is written only with the GIL held (a value is made, or its data,
        // attributes or `_backward` set, by Python code), and the `Python` token says the
        // caller holds it: no write runs while this reads.
        unsafe { *self.serial_and_flags.as_ptr() }
    }

    /// Its [`flag`]s.
    pub fn flags(&self) -> u64 {
        self.serial_and_flags.load(Ordering::Relaxed) & ((1 << flag::BITS) - 1)
    }

    pub fn has(&self, f: u64) -> bool {
        self.flags() & f != 0
    }

    /// Sets the flags `f`; returns whether they all were.
    pub fn set_flags(&self, f: u64) -> bool {
        self.serial_and_flags.fetch_or(f, Ordering::Relaxed) & f == f
    }

    pub fn clear_flags(&self, f: u64) {
        self.serial_and_flags.fetch_and(!f, Ordering::Relaxed);
    }

    /// Sets `data` to `x`, an int if `int` (and `x` holds it exactly: `number.rs`).
    pub fn set_number(&self, x: f64, int: bool) {
        self.data.set(x);
        match int_flag(x, int) {
            0 => self.clear_flags(flag::INT),
            _ => {
                self.set_flags(flag::INT);
            }
        }
    }

    /// Its data as Python's `repr` prints it.
    pub fn data_repr(&self) -> String {
        crate::number::repr(self.data.get(), self.has(flag::INT))
    }

    /// Its operands, in order (none for a node of the program's op: see
    /// [`Value::children`]).
    pub fn prev(&self) -> impl Iterator<Item = &Py<Value>> {
        self.operands.iter().flatten()
    }

    /// Every value it was made of: its operands, or the program's op's children.
    pub fn children(&self) -> impl Iterator<Item = &Py<Value>> {
        let custom = self.custom().into_iter().flat_map(|c| c.children.iter());
        self.prev().chain(custom)
    }

    /// What the program's op made it of, if it is a node of one.
    pub fn custom(&self) -> Option<&crate::custom::Custom> {
        self.extra.get()?.custom.as_ref()
    }

    /// Whether its backward is a Python function (see [`flag::PYTHON_BACKWARD`]).
    pub fn runs_python(&self) -> bool {
        self.has(flag::PYTHON_BACKWARD)
    }

    /// Whether it is a leaf: no op, not the program's op.
    pub fn is_leaf(&self) -> bool {
        self.op.is_none() && self.custom().is_none()
    }

    /// `op` applied to its `N` (one or two) operands, its data computed now.
    #[inline]
    fn made<const N: usize>(py: Python<'_>, op: Op, operands: [&Py<Value>; N]) -> Value {
        let x: [f64; 2] =
            std::array::from_fn(|i| operands.get(i).map_or(0.0, |v| v.get().data.get()));
        let data = op.forward(&mut F64, &x[..N]);
        // An op of one operand reads as if its second were an int.
        let int = |i: usize| operands.get(i).is_none_or(|v| v.get().has(flag::INT));
        let int = int_flag(data, int_result(op, x, int));
        let operands = std::array::from_fn(|i| operands.get(i).map(|v| v.clone_ref(py)));
        Value::with(data, int, Some(op), operands)
    }

    /// In anomaly mode: where this value is being made, recorded, and an op that made a
    /// NaN or an infinity of finite operands refused ([`crate::anomaly`]).
    fn check_anomaly(&self, py: Python<'_>) -> PyResult<()> {
        if crate::anomaly::record(py, self.serial()) {
            self.set_flags(flag::SITED);
        }
        let Some(op) = self.op else {
            return Ok(());
        };
        let operands: Vec<f64> = self.prev().map(|p| p.get().data.get()).collect();
        crate::anomaly::check_made(op.name(), &operands, self.data.get())
    }

    /// [`Value::made`] of one or two operands, as a Python object.
    fn apply(py: Python<'_>, op: Op, operands: &[&Py<Value>]) -> PyResult<Py<Value>> {
        match *operands {
            [a] => Value::made(py, op, [a]),
            [a, b] => Value::made(py, op, [a, b]),
            _ => unreachable!("an op of Value takes one or two operands"),
        }
        .into_untracked(py)
    }

    /// The value as a Python object that Python's cycle collector does not track. A value
    /// without attributes cannot be part of a cycle: it refers only to its operands, made
    /// before it, and never changes them. Yet pyo3 makes every class a collected one, so each
    /// of a graph's values would be traversed by every collection its allocations set off:
    /// half the time of a drop-in step of micrograd's demo (39 ms, 18.5 untracked). Setting
    /// an attribute tracks the value (`attrs.rs`).
    #[inline]
    pub fn into_untracked(self, py: Python<'_>) -> PyResult<Py<Value>> {
        if crate::anomaly::on() {
            self.check_anomaly(py)?;
        }
        self.into_untracked_as_it_is(py)
    }

    /// [`Value::into_untracked`] for a copy of a value made before (`copy`, `deepcopy`,
    /// `pickle.loads`): anomaly mode checks ops where they are computed, not where a number
    /// they made is copied.
    pub fn into_untracked_as_it_is(self, py: Python<'_>) -> PyResult<Py<Value>> {
        let value = Py::new(py, self)?;
        // SAFETY: `value` is a live object of a garbage-collected type (pyo3 gives every class
        // `Py_TPFLAGS_HAVE_GC`), and we hold the GIL; untracking an object that nothing
        // cyclic refers through only keeps the collector from visiting it, and its
        // deallocation untracks again, which CPython allows.
        unsafe { pyo3::ffi::PyObject_GC_UnTrack(value.as_ptr().cast()) };
        Ok(value)
    }
}

/// What an operator's other operand is: a `Value`, or a number made a leaf.
fn operand(py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Option<Py<Value>>> {
    if let Ok(v) = other.cast::<Value>() {
        return Ok(Some(v.clone().unbind()));
    }
    match number(other) {
        Ok((x, int)) => Ok(Some(Value::constant(x, int).into_untracked(py)?)),
        Err(_) => Ok(None),
    }
}

/// `a op b` for an operator that returns `NotImplemented` for operands it does not know.
fn binary(py: Python<'_>, op: Op, a: &Py<Value>, b: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    match operand(py, b)? {
        Some(b) => Ok(Value::made(py, op, [a, &b]).into_untracked(py)?.into_any()),
        None => Ok(py.NotImplemented()),
    }
}

/// `a ** c`, micrograd's name for it (`**2` for an int exponent, `**0.5` for a float).
fn power(py: Python<'_>, a: &Py<Value>, c: &Bound<'_, PyAny>) -> PyResult<Py<Value>> {
    let exponent: f64 = c.extract().map_err(|_| {
        PyTypeError::new_err("only supporting int/float powers for now (as micrograd)")
    })?;
    let power = Value::made(py, Op::Powf(exponent), [a]);
    if c.is_instance_of::<PyInt>() {
        power.set_flags(flag::INT_EXPONENT);
        // An int to a non-negative int's power is an int.
        let int = a.get().has(flag::INT) && exponent >= 0.0;
        power.set_number(power.data.get(), int);
    }
    power.into_untracked(py)
}

fn negate(py: Python<'_>, a: &Py<Value>) -> PyResult<Py<Value>> {
    let minus_one = Value::constant(-1.0, true).into_untracked(py)?;
    Value::apply(py, Op::Mul, &[a, &minus_one])
}

#[pymethods]
impl Value {
    /// `Value(data)`: a leaf. `Value(data, children, 'name')`, micrograd's way of adding an
    /// op, makes a node whose `_backward` the program sets (`custom.rs`).
    #[new]
    #[pyo3(signature = (data, _children = None, _op = None))]
    fn new(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        _children: Option<&Bound<'_, PyAny>>,
        _op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Value> {
        let (x, int) = number(data)?;
        crate::custom::new(py, x, int, _children, _op)
    }

    /// Its number: an int where micrograd's would be one (`number.rs`), else a float.
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> Bound<'py, PyAny> {
        crate::number::to_python(py, self.data.get(), self.has(flag::INT))
    }

    #[setter]
    fn set_data(&self, x: &Bound<'_, PyAny>) -> PyResult<()> {
        let (x, int) = number(x)?;
        self.set_number(x, int);
        Ok(())
    }

    #[getter]
    fn grad(&self) -> f64 {
        self.grad.get()
    }

    #[setter]
    fn set_grad(&self, x: f64) {
        self.grad.set(x)
    }

    /// The op that made this value, as micrograd names it (`''` for a leaf).
    #[getter]
    pub(crate) fn _op(&self) -> String {
        match self.op {
            None => self.custom().map_or(String::new(), |c| c.name.clone()),
            Some(Op::Add) => "+".into(),
            Some(Op::Mul) => "*".into(),
            Some(Op::Powf(c)) if self.has(flag::INT_EXPONENT) => format!("**{}", c as i64),
            Some(Op::Powf(c)) => format!("**{}", python_float(c)),
            Some(Op::Relu) => "ReLU".into(),
            Some(op) => op.name().into(),
        }
    }

    /// The operands, as a set (as micrograd's).
    #[getter]
    fn _prev<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PySet>> {
        PySet::new(py, self.children().map(|v| v.bind(py)))
    }

    /// What this node's backward does, as micrograd's closure: the function the program set,
    /// or one that adds this node's local derivatives into its operands' `grad`.
    #[getter]
    fn _backward<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        crate::custom::get_backward(slf)
    }

    #[setter(_backward)]
    fn set_backward(slf: &Bound<'_, Self>, f: &Bound<'_, PyAny>) -> PyResult<()> {
        crate::custom::set_backward(slf, Some(f))
    }

    #[deleter(_backward)]
    fn delete_backward(slf: &Bound<'_, Self>) -> PyResult<()> {
        crate::custom::set_backward(slf, None)
    }

    /// The graph under this value in the order micrograd's `backward` builds it (depth
    /// first, operands before the values made of them): `reversed(v.topo())` is the order
    /// the nodes' `_backward`s run in.
    fn topo(slf: &Bound<'_, Self>) -> Vec<Py<Value>> {
        crate::custom::topo(slf)
    }

    /// The value's attributes (`attrs.rs`).
    #[getter]
    fn __dict__<'py>(slf: &Bound<'py, Self>) -> Bound<'py, PyDict> {
        crate::attrs::dict(slf)
    }

    /// Attributes, as on micrograd's values (`attrs.rs`).
    fn __setattr__(
        slf: &Bound<'_, Self>,
        name: &Bound<'_, PyString>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        crate::attrs::set(slf, name, Some(value))
    }

    fn __delattr__(slf: &Bound<'_, Self>, name: &Bound<'_, PyString>) -> PyResult<()> {
        crate::attrs::set(slf, name, None)
    }

    /// What the cycle collector follows from a tracked value: the values it was made of,
    /// and its attributes.
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        self.children().try_for_each(|v| visit.call(v))?;
        visit.call(self.extra.get().map(|e| &e.attrs))
    }

    /// A pickle of the value and the graph under it, flattened (`pickle.rs`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        crate::pickle::reduce(slf)
    }

    fn __setstate__(slf: &Bound<'_, Self>, state: &Bound<'_, PyAny>) -> PyResult<()> {
        crate::pickle::set_state(slf, state)
    }

    fn __copy__(slf: &Bound<'_, Self>) -> PyResult<Py<Value>> {
        crate::pickle::copy(slf)
    }

    fn __deepcopy__(slf: &Bound<'_, Self>, memo: &Bound<'_, PyDict>) -> PyResult<Py<PyAny>> {
        crate::pickle::deep_copy(slf, memo)
    }

    fn __add__(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, Op::Add, &slf, other)
    }

    fn __radd__(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, Op::Add, &slf, other)
    }

    fn __mul__(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, Op::Mul, &slf, other)
    }

    fn __rmul__(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        binary(py, Op::Mul, &slf, other)
    }

    fn __pow__(
        slf: Py<Self>,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        modulo: &Bound<'_, PyAny>,
    ) -> PyResult<Py<Value>> {
        if !modulo.is_none() {
            return Err(PyTypeError::new_err(
                "pow() with a modulus is not defined for Value",
            ));
        }
        power(py, &slf, other)
    }

    fn __neg__(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        negate(py, &slf)
    }

    /// `self + (-other)`
    fn __sub__(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let Some(other) = operand(py, other)? else {
            return Ok(py.NotImplemented());
        };
        let minus = negate(py, &other)?;
        Ok(Value::apply(py, Op::Add, &[&slf, &minus])?.into_any())
    }

    /// `other + (-self)`
    fn __rsub__(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let Some(other) = operand(py, other)? else {
            return Ok(py.NotImplemented());
        };
        let minus = negate(py, &slf)?;
        Ok(Value::apply(py, Op::Add, &[&other, &minus])?.into_any())
    }

    /// `self * other**-1`
    fn __truediv__(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let Some(other) = operand(py, other)? else {
            return Ok(py.NotImplemented());
        };
        let inverse = Value::apply(py, Op::Powf(-1.0), &[&other])?;
        Ok(Value::apply(py, Op::Mul, &[&slf, &inverse])?.into_any())
    }

    /// `other * self**-1`
    fn __rtruediv__(
        slf: Py<Self>,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyAny>> {
        let Some(other) = operand(py, other)? else {
            return Ok(py.NotImplemented());
        };
        let inverse = Value::apply(py, Op::Powf(-1.0), &[&slf])?;
        Ok(Value::apply(py, Op::Mul, &[&other, &inverse])?.into_any())
    }

    fn relu(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Relu, &[&slf])
    }

    fn tanh(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Tanh, &[&slf])
    }

    fn exp(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Exp, &[&slf])
    }

    fn log(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Log, &[&slf])
    }

    /// `log(1 + exp(self))`, computed stably (finite for any finite `self`).
    fn softplus(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Softplus, &[&slf])
    }

    /// `log(1 + self)`, accurate near 0.
    fn log1p(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Log1p, &[&slf])
    }

    /// `|self|`; no gradient at 0 (PyTorch's `sgn`).
    fn abs(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Abs, &[&slf])
    }

    fn __abs__(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Abs, &[&slf])
    }

    fn sin(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Sin, &[&slf])
    }

    fn cos(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Cos, &[&slf])
    }

    /// The square root: `self ** 0.5`'s numbers, value and gradient.
    fn sqrt(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<Value>> {
        Value::apply(py, Op::Sqrt, &[&slf])
    }

    /// The larger of `self` and `other` (a `Value` or a number); the gradient goes to the
    /// one picked, `self` on a tie.
    fn max(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<Value>> {
        let Some(b) = operand(py, other)? else {
            let kind = other.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "max() takes a Value or a number, not {kind}"
            )));
        };
        Value::apply(py, Op::Max, &[&slf, &b])
    }

    /// The smaller of `self` and `other` (a `Value` or a number); the gradient goes to the
    /// one picked, `self` on a tie (as `max`).
    fn min(slf: Py<Self>, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<Py<Value>> {
        let Some(b) = operand(py, other)? else {
            let kind = other.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "min() takes a Value or a number, not {kind}"
            )));
        };
        Value::apply(py, Op::Min, &[&slf, &b])
    }

    /// The gradient of this value with respect to every value it was built from, added to
    /// their `grad` (this value's own is set to 1), as micrograd's `backward`. The graph's
    /// tape runs natively: see `drop_in.rs`.
    fn backward(slf: Py<Self>, py: Python<'_>) -> PyResult<()> {
        crate::drop_in::backward(py, &slf)
    }

    pub(crate) fn __repr__(&self) -> String {
        format!(
            "Value(data={}, grad={})",
            self.data_repr(),
            python_float(self.grad.get())
        )
    }
}
