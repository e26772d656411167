//! micrograd's way of adding an op, and its `backward` for graphs that hold one:
//!
//! ```python
//! out = Value(math.sin(self.data), (self,), 'sin')
//! def _backward():
//!     self.grad += math.cos(self.data) * out.grad
//! out._backward = _backward
//! ```
//!
//! Such a node's backward is a Python function, which no tape can run. So `backward` on a
//! graph that holds one (or a value whose `_backward` the program set) runs micrograd's own
//! algorithm over the whole graph ([`backward`]): the nodes in [`topo`]'s order, reversed,
//! each node's `_backward` called: the program's function for its nodes, and for tapejit's
//! ops their derivatives from tapejit's formulas (`Op::local_grads` with `F64`, the numbers
//! the tape computes). The drop-in's cache never sees such a graph.

use std::collections::HashSet;

use pyo3::exceptions::{PyAttributeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use tapejit::op::F64;

use crate::attrs::Extra;
use crate::value::{flag, Value};

/// A node of the program's own op: micrograd's `_op` and `_children`.
pub struct Custom {
    pub name: String,
    pub children: Vec<Py<Value>>,
}

/// `Value(x, _children, _op)`: a leaf, or, given children or an op's name, a node of the
/// program's op.
pub fn new(
    py: Python<'_>,
    x: f64,
    int: bool,
    children: Option<&Bound<'_, PyAny>>,
    op: Option<&Bound<'_, PyAny>>,
) -> PyResult<Value> {
    let children: Vec<Py<Value>> = match children {
        None => Vec::new(),
        Some(children) => children
            .try_iter()?
            .map(|c| Ok(c?.cast_into::<Value>()?.unbind()))
            .collect::<PyResult<_>>()
            .map_err(|_| {
                PyTypeError::new_err("Value(data, _children, _op): children are Values")
            })?,
    };
    let name: String = match op {
        None => String::new(),
        Some(op) => op
            .extract()
            .map_err(|_| PyTypeError::new_err("Value(data, _children, _op): _op is a str"))?,
    };
    if children.is_empty() && name.is_empty() {
        return Ok(Value::leaf(x, int));
    }
    let custom = Custom { name, children };
    Ok(Value::custom_node(x, int, Extra::new(py, Some(custom))))
}

/// The graph under `root` as micrograd's `backward` orders it: depth first, each node after
/// its children (in their order), each once. Iterative: a chain may be deeper than the stack.
pub fn topo(root: &Bound<'_, Value>) -> Vec<Py<Value>> {
    let py = root.py();
    let mut order = Vec::new();
    let mut seen: HashSet<u64> = HashSet::new();
    seen.insert(root.get().serial());
    // Each node on the path, and how many of its children were visited.
    let mut path: Vec<(Py<Value>, usize)> = vec![(root.clone().unbind(), 0)];
    while let Some((v, next)) = path.last_mut() {
        let child = v.get().children().nth(*next).map(|c| c.clone_ref(py));
        *next += 1;
        match child {
            Some(c) if seen.insert(c.get().serial()) => path.push((c, 0)),
            Some(_) => {}
            None => order.push(path.pop().expect("not empty").0),
        }
    }
    order
}

/// micrograd's `backward` from `root`: its `grad` set to 1, then each node's `_backward` in
/// reverse [`topo`] order.
pub fn backward(root: &Bound<'_, Value>) -> PyResult<()> {
    let order = topo(root);
    root.get().grad.set(1.0);
    for v in order.iter().rev() {
        local_backward(v.bind(root.py()))?;
    }
    Ok(())
}

/// One node's `_backward`: the program's function if it set one, else its op's local
/// derivatives times its `grad`, added into its operands' `grad` (nothing for a leaf, or a
/// node of the program's op it gave no `_backward`, as micrograd's `lambda: None`).
fn local_backward(v: &Bound<'_, Value>) -> PyResult<()> {
    if v.get().has(flag::USER_BACKWARD) {
        if let Some(f) = user_backward(v)? {
            f.call0()?;
        }
        return Ok(());
    }
    op_backward(v);
    Ok(())
}

/// The node's own backward (micrograd's closure): its op's local derivatives times its
/// `grad`, added into its operands' `grad`; nothing for a leaf.
fn op_backward(v: &Bound<'_, Value>) {
    let node = v.get();
    let Some(op) = node.op else { return };
    let x: Vec<f64> = node.prev().map(|p| p.get().data.get()).collect();
    let mut local = Vec::with_capacity(x.len());
    op.local_grads(&mut F64, &x, node.data.get(), node.grad.get(), &mut local);
    for (p, d) in node.prev().zip(local) {
        let grad = &p.get().grad;
        grad.set(grad.get() + d);
    }
}

/// The `_backward` the program set on `v`, from its attributes.
fn user_backward<'py>(v: &Bound<'py, Value>) -> PyResult<Option<Bound<'py, PyAny>>> {
    match crate::attrs::existing(v) {
        Some(attrs) => attrs.get_item(intern!(v.py(), "_backward")),
        None => Ok(None),
    }
}

/// A node's own backward as Python calls it: `v._backward()` does what micrograd's closure
/// does. It stays that closure after the program sets another `_backward` on the node (which
/// may call it: a hook around the original).
#[pyclass(name = "Backward", module = "tapejit", frozen)]
pub struct Backward {
    node: Py<Value>,
}

#[pymethods]
impl Backward {
    fn __call__(&self, py: Python<'_>) {
        op_backward(self.node.bind(py))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!("<_backward of {}>", self.node.bind(py).repr()?))
    }

    /// Pickled as the node's `_backward`.
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let getattr = py.import("builtins")?.getattr("getattr")?;
        (getattr, (self.node.clone_ref(py), "_backward"))
            .into_pyobject(py)
            .map(|t| t.into_any())
    }

    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.node)
    }
}

/// `v._backward`: the program's function, or a [`Backward`] of `v`.
pub fn get_backward<'py>(v: &Bound<'py, Value>) -> PyResult<Bound<'py, PyAny>> {
    if v.get().has(flag::USER_BACKWARD) {
        if let Some(f) = user_backward(v)? {
            return Ok(f);
        }
    }
    Ok(Bound::new(
        v.py(),
        Backward {
            node: v.clone().unbind(),
        },
    )?
    .into_any())
}

/// `v._backward = f` (`del v._backward` for `None`): `f` goes into the value's attributes,
/// as micrograd's attribute, and from then on `backward` on a graph holding `v` runs
/// micrograd's algorithm, calling `f` for `v`.
pub fn set_backward(v: &Bound<'_, Value>, f: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
    let py = v.py();
    let attrs = crate::attrs::dict(v);
    let node = v.get();
    match f {
        Some(f) => {
            attrs.set_item(intern!(py, "_backward"), f)?;
            node.set_flags(flag::PYTHON_BACKWARD | flag::USER_BACKWARD);
        }
        None => {
            if !attrs.contains(intern!(py, "_backward"))? {
                return Err(PyAttributeError::new_err("_backward: none was set"));
            }
            attrs.del_item(intern!(py, "_backward"))?;
            node.clear_flags(flag::USER_BACKWARD);
            if node.custom().is_none() {
                node.clear_flags(flag::PYTHON_BACKWARD);
            }
        }
    }
    Ok(())
}
