//! `copy.copy`, `copy.deepcopy` and pickle of values: a value and the graph under it (data,
//! grad, op, operands, attributes), so that models (`tapejit.nn`, plain Python) copy and
//! pickle as micrograd's do.
//!
//! Both walk a graph iteratively, in the order its values were made (operands first): a chain
//! of 100,000 values (`x = x + 1` in a loop) is as deep as Python's recursion cannot go.
//!
//! `deepcopy` has the memo: [`deep_copy`] copies each value of the graph, in that order,
//! unless the memo already has it, so values shared with whatever else is copied stay shared.
//!
//! A pickler's memo is out of reach, so a value pickles as its whole graph flattened
//! ([`reduce`]): `_value(ancestors, data, grad, op, operands, constant)` with `ancestors` the
//! values under it in creation order (the pickler saves each before the value, so that each
//! one's operands are saved, and memoized, before it), and the attributes as its state. Each
//! ancestor pickles as one node (its `ancestors` empty: its operands are memoized by then):
//! so every value is saved once, a value and the values under it keep their identity however
//! they are reached, and no save recurses deeper than an attribute's nesting. A
//! thread-local stack holds the graphs being saved ([`FLATTENING`]); a guard at the end of
//! each `ancestors` takes its graph off when the pickler lets go of it.

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyFloat, PyInt, PyString, PyTuple};
use strum::IntoEnumIterator;
use tapejit::op::Op;

use crate::attrs::Extra;
use crate::custom::Custom;
use crate::value::{flag, number, Value};

/// The values under `root`, not `root` itself, in the order they were made.
fn graph(root: &Bound<'_, Value>) -> Vec<Py<Value>> {
    let py = root.py();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut stack: Vec<&Py<Value>> = root.get().children().collect();
    let mut found = Vec::new();
    while let Some(v) = stack.pop() {
        if seen.insert(v.get().serial()) {
            found.push(v.clone_ref(py));
            stack.extend(v.get().children());
        }
    }
    found.sort_unstable_by_key(|v| v.get().serial());
    found
}

/// Sets a value's attributes from `state` (a dict, or `None`), as `setattr` would: so the
/// collector tracks the value (`attrs.rs`), and a `_backward` is the program's.
pub fn set_state(slf: &Bound<'_, Value>, state: &Bound<'_, PyAny>) -> PyResult<()> {
    if state.is_none() {
        return Ok(());
    }
    for (name, value) in state.cast::<PyDict>()?.iter() {
        crate::attrs::set(slf, name.cast::<PyString>()?, Some(&value))?;
    }
    Ok(())
}

/// A new value like `v` (its data, grad, op), made of `children` (its operands, or its
/// op's children), without attributes.
fn like(py: Python<'_>, v: &Value, children: Vec<Py<Value>>) -> PyResult<Py<Value>> {
    let copy = match v.custom() {
        Some(c) => {
            let custom = Custom {
                name: c.name.clone(),
                children,
            };
            Value::custom_node(v.data.get(), v.has(flag::INT), Extra::new(py, Some(custom)))
        }
        None => {
            let mut operands = children.into_iter();
            let operands = [operands.next(), operands.next()];
            Value::restored(v.data.get(), v.flags(), v.op, operands)
        }
    };
    copy.grad.set(v.grad.get());
    copy.into_untracked_as_it_is(py)
}

/// `copy.copy(v)`: a new value of the same operands, data and grad, its attributes a shallow
/// copy of `v`'s (as micrograd's, whose attributes are all there is).
pub fn copy(slf: &Bound<'_, Value>) -> PyResult<Py<Value>> {
    let py = slf.py();
    let children = slf.get().children().map(|c| c.clone_ref(py)).collect();
    let copy = like(py, slf.get(), children)?;
    if let Some(dict) = crate::attrs::existing(slf) {
        set_state(copy.bind(py), dict.copy()?.as_any())?;
    }
    Ok(copy)
}

/// `copy.deepcopy(v, memo)`: see the module's comment. The originals stay alive through the
/// call (the graph under `v` holds them), so the memo's keys, their ids, stay theirs.
pub fn deep_copy(slf: &Bound<'_, Value>, memo: &Bound<'_, PyDict>) -> PyResult<Py<PyAny>> {
    let py = slf.py();
    let deepcopy = py.import("copy")?.getattr("deepcopy")?;
    let id = |v: &Bound<'_, Value>| v.as_ptr() as usize;
    let mut nodes = graph(slf);
    nodes.push(slf.clone().unbind());
    for v in &nodes {
        let v = v.bind(py);
        if memo.contains(id(v))? {
            continue;
        }
        let children = v
            .get()
            .children()
            .map(|c| {
                let copy = memo.get_item(id(c.bind(py)))?.expect("operands come first");
                Ok(copy.cast_into::<Value>()?.unbind())
            })
            .collect::<PyResult<_>>()?;
        let copy = like(py, v.get(), children)?;
        memo.set_item(id(v), &copy)?;
        if let Some(dict) = crate::attrs::existing(v) {
            set_state(copy.bind(py), &deepcopy.call1((dict, memo))?)?;
        }
    }
    Ok(memo.get_item(id(slf))?.expect("copied above").unbind())
}

thread_local! {
    /// The graphs being pickled, each its values' serials under its guard's token: a value
    /// among them pickles as one node, the pickler having saved, or being about to save,
    /// its operands.
    static FLATTENING: RefCell<Vec<(u64, HashSet<u64>)>> = const { RefCell::new(Vec::new()) };
}

static TOKENS: AtomicU64 = AtomicU64::new(0);

/// The last of a pickled value's `ancestors`: while the pickler holds it, the graph it ends
/// is being saved. It pickles as an empty tuple.
#[pyclass(module = "tapejit", frozen)]
struct GraphEnd {
    token: u64,
}

impl Drop for GraphEnd {
    fn drop(&mut self) {
        // A thread other than the one that pickled may drop it: its stack has no such token.
        let _ = FLATTENING.try_with(|f| f.borrow_mut().retain(|(token, _)| *token != self.token));
    }
}

#[pymethods]
impl GraphEnd {
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let tuple = py.get_type::<PyTuple>();
        (tuple, PyTuple::empty(py))
            .into_pyobject(py)
            .map(|t| t.into_any())
    }
}

/// `v.__reduce__()`: `(_value, (ancestors, data, grad, op, operands, constant), attributes)`,
/// `op` `None` for a leaf, the name for a node of the program's op, `(name, exponent)` for
/// tapejit's (see the module's comment).
pub fn reduce<'py>(slf: &Bound<'py, Value>) -> PyResult<Bound<'py, PyAny>> {
    let py = slf.py();
    let v = slf.get();
    let serial = v.serial();
    let saving = FLATTENING.with(|f| f.borrow().iter().any(|(_, s)| s.contains(&serial)));
    let ancestors = if saving || v.children().next().is_none() {
        PyTuple::empty(py)
    } else {
        let nodes = graph(slf);
        let token = TOKENS.fetch_add(1, Ordering::Relaxed);
        let serials = nodes.iter().map(|n| n.get().serial()).collect();
        FLATTENING.with(|f| f.borrow_mut().push((token, serials)));
        let end = Py::new(py, GraphEnd { token })?.into_any();
        let nodes: Vec<Py<PyAny>> = nodes
            .into_iter()
            .map(|n| n.into_any())
            .chain([end])
            .collect();
        PyTuple::new(py, nodes)?
    };
    // Names interned: the pickler writes each once and refers to it after.
    let op = match (v.custom(), v.op) {
        (Some(custom), _) => PyString::intern(py, &custom.name).into_any(),
        (None, None) => py.None().into_bound(py),
        (None, Some(op)) => (PyString::intern(py, op.name()), exponent(py, v))
            .into_pyobject(py)?
            .into_any(),
    };
    let operands = PyTuple::new(py, v.children().collect::<Vec<_>>())?;
    let data = crate::number::to_python(py, v.data.get(), v.has(flag::INT));
    let args = (
        ancestors,
        data,
        v.grad.get(),
        op,
        operands,
        v.has(flag::CONSTANT),
    );
    let state = match crate::attrs::existing(slf) {
        Some(dict) => dict.into_any(),
        None => py.None().into_bound(py),
    };
    static REBUILD: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let rebuild = REBUILD.import(py, "tapejit._tapejit", "_value")?;
    (rebuild, args, state)
        .into_pyobject(py)
        .map(|t| t.into_any())
}

/// `v`'s exponent if it is a power, as the program wrote it (an int or a float).
fn exponent<'py>(py: Python<'py>, v: &Value) -> Option<Bound<'py, PyAny>> {
    match v.op {
        Some(Op::Powf(c)) if v.has(flag::INT_EXPONENT) => Some(PyInt::new(py, c as i64).into_any()),
        Some(Op::Powf(c)) => Some(PyFloat::new(py, c).into_any()),
        _ => None,
    }
}

/// A value from its pickle ([`reduce`]'s arguments; `ancestors` are there only to have been
/// loaded first).
#[pyfunction]
#[pyo3(name = "_value")]
pub fn rebuild(
    py: Python<'_>,
    ancestors: &Bound<'_, PyAny>,
    data: &Bound<'_, PyAny>,
    grad: f64,
    op: &Bound<'_, PyAny>,
    operands: Vec<Py<Value>>,
    constant: bool,
) -> PyResult<Py<Value>> {
    let _ = ancestors;
    let (x, int) = number(data)?;
    let mut flags = if int { flag::INT } else { 0 };
    let value = if op.is_none() {
        if !operands.is_empty() {
            return Err(PyValueError::new_err("a pickled leaf with operands"));
        }
        if constant {
            flags |= flag::CONSTANT;
        }
        Value::restored(x, flags, None, [None, None])
    } else if let Ok(name) = op.extract::<String>() {
        let custom = Custom {
            name,
            children: operands,
        };
        Value::custom_node(x, int, Extra::new(py, Some(custom)))
    } else {
        let (name, exponent): (String, Option<Bound<'_, PyAny>>) = op.extract()?;
        let c = exponent.as_ref().map(|e| e.extract::<f64>()).transpose()?;
        let op = Op::iter()
            .find(|op| op.name() == name)
            .and_then(|op| made_op(op, c))
            .filter(|op| op.arity() == Some(operands.len()))
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "a pickled value of op {name:?} with {} operands: not an op of this tapejit",
                    operands.len()
                ))
            })?;
        if exponent.is_some_and(|e| e.is_instance_of::<PyInt>()) {
            flags |= flag::INT_EXPONENT;
        }
        let mut operands = operands.into_iter();
        Value::restored(x, flags, Some(op), [operands.next(), operands.next()])
    };
    value.grad.set(grad);
    value.into_untracked_as_it_is(py)
}

/// `op` (as `Op::iter` lists it, fields 0) with its field `c`, if it is an op an operator
/// makes.
fn made_op(op: Op, c: Option<f64>) -> Option<Op> {
    match op {
        Op::Powf(_) => c.map(Op::Powf),
        Op::Input(_) | Op::Param(_) | Op::Const(_) | Op::Sum => None,
        Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Neg | Op::Exp | Op::Log | Op::Tanh => Some(op),
        Op::Relu | Op::Sigmoid | Op::Max | Op::Min | Op::Softplus | Op::Log1p => Some(op),
        Op::Abs | Op::Sin | Op::Cos | Op::Sqrt => Some(op),
    }
}
