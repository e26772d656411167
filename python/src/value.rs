//! micrograd's `Value`: a number, its gradient, and the op and operands that made it. Every
//! operator computes `data` at once (as micrograd does), with tapejit's formulas
//! (`tapejit::op`), so what Python sees is what the interpreter and the JIT compute. Derived
//! operators are built from the same primitives as micrograd builds them (`a - b` is
//! `a + (-b)`, `-a` is `a * -1`, `a / b` is `a * b**-1`), so the numbers match micrograd's.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PySet;
use tapejit::op::{Op, F64};

/// An `f64` that Python may read and write through a shared reference.
pub struct Number(AtomicU64);

impl Number {
    fn new(x: f64) -> Number {
        Number(AtomicU64::new(x.to_bits()))
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    pub fn set(&self, x: f64) {
        self.0.store(x.to_bits(), Ordering::Relaxed)
    }
}

/// A scalar and its gradient, as micrograd's `Value`. Immutable but for `data` and `grad`
/// (and `mark`, `backward`'s own).
#[pyclass(name = "Value", module = "tapejit", frozen)]
pub struct Value {
    pub data: Number,
    pub grad: Number,
    /// The op that made it; `None` for a leaf (`Value(x)`, or a number an operator met).
    pub op: Option<Op>,
    /// Its operands, in order (every op here takes one or two).
    operands: [Option<Py<Value>>; 2],
    /// Whether a power's exponent was written as an int (micrograd names the op `**2`, not
    /// `**2.0`).
    int_exponent: bool,
    /// A leaf an operator made of a number (`2` in `2 * x`): a constant to `compile`.
    pub constant: bool,
    /// Which `backward` last visited this value and where it put it (see `drop_in.rs`).
    pub mark: AtomicU64,
    /// When it was made: values are numbered as they are made, so operands come first.
    pub serial: u64,
}

/// The next value's serial.
static MADE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Operands waiting to be released while a value is dropped (see `Drop for Value`).
    static RELEASING: RefCell<Option<Vec<Py<Value>>>> = const { RefCell::new(None) };
}

/// Releasing a value releases its operands, and Python frees each whose last reference that
/// was, dropping it in turn: down a chain of 100,000 values (`x = x + 1` in a loop) that
/// recursion overflows the stack. So the outermost drop collects operands in a list and
/// releases them one at a time; a drop inside it only adds its operands to the list.
impl Drop for Value {
    fn drop(&mut self) {
        let operands = std::mem::take(&mut self.operands).into_iter().flatten();
        let outermost = RELEASING.with(|list| {
            let mut list = list.borrow_mut();
            match list.as_mut() {
                Some(waiting) => {
                    waiting.extend(operands);
                    false
                }
                None => {
                    *list = Some(operands.collect());
                    true
                }
            }
        });
        if !outermost {
            return;
        }
        while let Some(operand) = RELEASING.with(|list| list.borrow_mut().as_mut()?.pop()) {
            drop(operand);
        }
        RELEASING.with(|list| list.borrow_mut().take());
    }
}

impl Value {
    /// A new value (the next serial), its gradient 0.
    fn with(data: f64, op: Option<Op>, operands: [Option<Py<Value>>; 2], constant: bool) -> Value {
        Value {
            data: Number::new(data),
            grad: Number::new(0.0),
            op,
            operands,
            int_exponent: false,
            constant,
            mark: AtomicU64::new(0),
            serial: MADE.fetch_add(1, Ordering::Relaxed),
        }
    }

    fn leaf(data: f64) -> Value {
        Value::with(data, None, [None, None], false)
    }

    /// A leaf made of a number an operator met.
    fn constant(data: f64) -> Value {
        Value::with(data, None, [None, None], true)
    }

    /// Its operands, in order.
    pub fn prev(&self) -> impl Iterator<Item = &Py<Value>> {
        self.operands.iter().flatten()
    }

    /// `op` applied to one or two `operands`, its data computed now.
    fn made(py: Python<'_>, op: Op, operands: &[&Py<Value>]) -> Value {
        let x: [f64; 2] =
            std::array::from_fn(|i| operands.get(i).map_or(0.0, |v| v.get().data.get()));
        let data = op.forward(&mut F64, &x[..operands.len()]);
        let operands = std::array::from_fn(|i| operands.get(i).map(|v| v.clone_ref(py)));
        Value::with(data, Some(op), operands, false)
    }

    /// [`Value::made`], as a Python object.
    fn apply(py: Python<'_>, op: Op, operands: &[&Py<Value>]) -> PyResult<Py<Value>> {
        Value::made(py, op, operands).into_untracked(py)
    }

    /// The value as a Python object that Python's cycle collector does not track. Values
    /// cannot be part of a cycle: a value refers only to its operands, made before it, and
    /// never changes them. Yet pyo3 makes every class a collected one, so each of a graph's
    /// values would be traversed by every collection its allocations set off: half the time
    /// of a drop-in step of micrograd's demo (39 ms, 18.5 untracked).
    fn into_untracked(self, py: Python<'_>) -> PyResult<Py<Value>> {
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
    match other.extract::<f64>() {
        Ok(x) => Ok(Some(Value::constant(x).into_untracked(py)?)),
        Err(_) => Ok(None),
    }
}

/// `a op b` for an operator that returns `NotImplemented` for operands it does not know.
fn binary(py: Python<'_>, op: Op, a: &Py<Value>, b: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    match operand(py, b)? {
        Some(b) => Ok(Value::apply(py, op, &[a, &b])?.into_any()),
        None => Ok(py.NotImplemented()),
    }
}

/// `a ** c`, micrograd's name for it (`**2` for an int exponent, `**0.5` for a float).
fn power(py: Python<'_>, a: &Py<Value>, c: &Bound<'_, PyAny>) -> PyResult<Py<Value>> {
    let exponent: f64 = c.extract().map_err(|_| {
        PyTypeError::new_err("only supporting int/float powers for now (as micrograd)")
    })?;
    let mut power = Value::made(py, Op::Powf(exponent), &[a]);
    power.int_exponent = c.is_instance_of::<pyo3::types::PyInt>();
    power.into_untracked(py)
}

fn negate(py: Python<'_>, a: &Py<Value>) -> PyResult<Py<Value>> {
    let minus_one = Value::constant(-1.0).into_untracked(py)?;
    Value::apply(py, Op::Mul, &[a, &minus_one])
}

#[pymethods]
impl Value {
    /// `Value(data)`: a leaf. micrograd's private `_children` and `_op` are not taken:
    /// values with operands come from operators.
    #[new]
    #[pyo3(signature = (data, _children = None, _op = None))]
    fn new(
        data: f64,
        _children: Option<&Bound<'_, PyAny>>,
        _op: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Value> {
        if _children.is_some() || _op.is_some() {
            return Err(PyTypeError::new_err(
                "Value(data) makes a leaf; values with operands come from operators",
            ));
        }
        Ok(Value::leaf(data))
    }

    #[getter]
    fn data(&self) -> f64 {
        self.data.get()
    }

    #[setter]
    fn set_data(&self, x: f64) {
        self.data.set(x)
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
    fn _op(&self) -> String {
        match self.op {
            None => String::new(),
            Some(Op::Add) => "+".into(),
            Some(Op::Mul) => "*".into(),
            Some(Op::Powf(c)) if self.int_exponent => format!("**{}", c as i64),
            Some(Op::Powf(c)) => format!("**{}", python_float(c)),
            Some(Op::Relu) => "ReLU".into(),
            Some(op) => op.name().into(),
        }
    }

    /// The operands, as a set (as micrograd's).
    #[getter]
    fn _prev<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PySet>> {
        PySet::new(py, self.prev().map(|v| v.bind(py)))
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

    fn __repr__(&self) -> String {
        format!(
            "Value(data={}, grad={})",
            python_float(self.data.get()),
            python_float(self.grad.get())
        )
    }
}

/// `x` as Python's `repr` prints a float.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else if x == x.trunc() && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        // Rust's shortest round-trip digits, as Python's repr; exponents as Python writes them.
        let s = format!("{x:?}");
        match s.split_once('e') {
            Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e:0>2}"),
            Some((m, e)) => format!("{m}e-{:0>2}", &e[1..]),
            None => s,
        }
    }
}
