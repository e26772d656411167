//! Attributes on values (`v.m = 0`, `v._vis_color = 'red'`), and Python's cycle collector.
//!
//! Where the attributes live: not in a `__dict__` slot (`#[pyclass(dict)]`): CPython 3.11
//! and 3.12 make an empty dict for every instance of such a class as it is made, and values
//! are made by the hundred thousand (micrograd's demo: 13% more instructions a step than the
//! same code without the slot). Nor through a `__getattr__` hook: Python's attribute lookup
//! would go through it for every method call (1.2%). A value's attributes are a dict in its
//! [`Extra`], made when the first is set, and the class gets, for each name any value was
//! given, a data descriptor ([`Attribute`]) that reads it from there: Python's own attribute
//! lookup, with its caches, serves `v.m`, and values without attributes cost nothing. A name
//! the class has already (a method, a property) cannot be an attribute, nor can a special
//! one (`__x__`), which Python looks up on the class.
//!
//! Values are made untracked by the collector (`Value::into_untracked`): a value refers only
//! to its operands, made before it, so values alone never form a cycle, and tracking them
//! cost half of a drop-in step. An attribute can make one (`v.me = v`, or `v.next = w` for a
//! `w` made of `v`). So setting an attribute tracks the value, and a value set as an
//! attribute is tracked with the whole graph under it: every value on a cycle through
//! attributes set so is tracked, and the collector (which follows a tracked value's
//! attributes and operands, `Value::__traverse__`) frees the cycle. Values nobody sets
//! attributes on stay untracked.
//!
//! Not covered: a cycle that reaches a value made later only through a container or other
//! object set as an attribute (`v.later = [v * 2]`, or a list appended to after it was set),
//! or through the dict `vars(v)` returns, written directly: such a value stays untracked, and
//! the cycle lives until the program ends, as any cycle with an untracked member would. (And
//! a name written into `vars(v)` directly is read back only if some value was given that
//! name as an attribute.)

use std::sync::atomic::{AtomicPtr, Ordering};

use pyo3::exceptions::PyAttributeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::custom::Custom;
use crate::value::{flag, Value};

/// What few values have: the program's op (`custom.rs`) and attributes.
pub struct Extra {
    /// For a node made as micrograd makes a new op's (`Value(data, children, 'name')`).
    pub custom: Option<Custom>,
    pub attrs: Py<PyDict>,
}

impl Extra {
    pub fn new(py: Python<'_>, custom: Option<Custom>) -> Extra {
        Extra {
            custom,
            attrs: PyDict::new(py).unbind(),
        }
    }
}

/// A value's [`Extra`], set at most once: a pointer, null until then (a `OnceLock` would
/// take twice the room, and a value's size is the drop-in's speed).
pub struct ExtraCell(AtomicPtr<Extra>);

impl ExtraCell {
    pub const fn new() -> ExtraCell {
        ExtraCell(AtomicPtr::new(std::ptr::null_mut()))
    }

    pub fn get(&self) -> Option<&Extra> {
        let extra = self.0.load(Ordering::Acquire);
        // SAFETY: a non-null pointer here came from `Box::into_raw` (`get_or_init`) and is
        // freed only by `take`, which needs `&mut self`: it lives as long as this borrow.
        unsafe { extra.as_ref() }
    }

    /// The extra, made by `make` if there is none yet.
    pub fn get_or_init(&self, make: impl FnOnce() -> Extra) -> &Extra {
        if let Some(extra) = self.get() {
            return extra;
        }
        let made = Box::into_raw(Box::new(make()));
        let null = std::ptr::null_mut();
        match self
            .0
            .compare_exchange(null, made, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: `made` is ours, from `Box::into_raw` just above, and now the cell's, which
            // frees it only through `&mut self` (`take`).
            Ok(_) => unsafe { &*made },
            Err(first) => {
                // SAFETY: `made` lost the race and was never shared: ours to free.
                drop(unsafe { Box::from_raw(made) });
                // SAFETY: as in `get`.
                unsafe { &*first }
            }
        }
    }

    /// The extra, taken out of the cell.
    pub fn take(&mut self) -> Option<Box<Extra>> {
        let extra = std::mem::replace(self.0.get_mut(), std::ptr::null_mut());
        // SAFETY: a non-null pointer came from `Box::into_raw`, and the cell no longer has it.
        (!extra.is_null()).then(|| unsafe { Box::from_raw(extra) })
    }
}

impl Drop for ExtraCell {
    fn drop(&mut self) {
        drop(self.take());
    }
}

/// The attributes of `v` (made if it has none yet).
pub fn dict<'py>(v: &Bound<'py, Value>) -> Bound<'py, PyDict> {
    let py = v.py();
    let extra = v.get().extra.get_or_init(|| Extra::new(py, None));
    extra.attrs.bind(py).clone()
}

/// The attributes of `v` if it has any.
pub fn existing<'py>(v: &Bound<'py, Value>) -> Option<Bound<'py, PyDict>> {
    let extra = v.get().extra.get()?;
    Some(extra.attrs.bind(v.py()).clone()).filter(|d| !d.is_empty())
}

/// `setattr(v, name, value)` (`del` for `None`): Python's own attribute setting, for the
/// properties (`data`, `grad`, `_backward`) and attributes ([`Attribute`], given to the class
/// the first time a value is given the name), then, but for `data` and `grad`, the
/// collector's tracking (see the module's comment).
pub fn set(
    slf: &Bound<'_, Value>,
    name: &Bound<'_, PyString>,
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let py = slf.py();
    // Names in code are interned: the properties set in every step of training (`p.data -=`,
    // `p.grad = 0`) are told by identity, and track nothing.
    let property = name.is(intern!(py, "data")) || name.is(intern!(py, "grad"));
    if !property && value.is_some() {
        let class = slf.get_type();
        if class.getattr(name).is_err() {
            let text = name.to_cow()?;
            if text.starts_with("__") && text.ends_with("__") {
                return Err(PyAttributeError::new_err(format!(
                    "Value takes no attribute named like a special method ({text}): Python \
                     looks those up on the class"
                )));
            }
            class.setattr(
                name,
                Attribute {
                    name: name.clone().unbind(),
                },
            )?;
        }
    }
    let value_ptr = value.map_or(std::ptr::null_mut(), |v| v.as_ptr());
    // SAFETY: `slf`, `name` (a str) and `value` (or NULL, which deletes) are live objects
    // borrowed for the call, and we hold the GIL: the arguments `tp_setattro` receives.
    let done =
        unsafe { pyo3::ffi::PyObject_GenericSetAttr(slf.as_ptr(), name.as_ptr(), value_ptr) };
    if done < 0 {
        return Err(PyErr::fetch(py));
    }
    if !property {
        track(slf.as_any());
        if let Some(value) = value.and_then(|v| v.cast::<Value>().ok()) {
            track_graph(value);
        }
    }
    Ok(())
}

/// A value attribute's name on the class: it reads, sets and deletes the attribute in the
/// value's own dict ([`Extra::attrs`]).
#[pyclass(module = "tapejit", frozen)]
pub struct Attribute {
    name: Py<PyString>,
}

impl Attribute {
    fn missing(&self, py: Python<'_>) -> PyErr {
        PyAttributeError::new_err(format!(
            "'Value' object has no attribute '{}'",
            self.name.bind(py)
        ))
    }
}

#[pymethods]
impl Attribute {
    fn __get__<'py>(
        slf: &Bound<'py, Self>,
        value: Option<&Bound<'py, PyAny>>,
        _class: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let Some(value) = value.filter(|v| !v.is_none()) else {
            return Ok(slf.clone().into_any());
        };
        let this = slf.get();
        let attrs = existing(value.cast::<Value>()?);
        match attrs.map(|d| d.get_item(this.name.bind(py))).transpose()? {
            Some(Some(x)) => Ok(x),
            _ => Err(this.missing(py)),
        }
    }

    fn __set__(&self, value: &Bound<'_, Value>, x: &Bound<'_, PyAny>) -> PyResult<()> {
        dict(value).set_item(self.name.bind(value.py()), x)
    }

    fn __delete__(&self, value: &Bound<'_, Value>) -> PyResult<()> {
        let py = value.py();
        match existing(value) {
            Some(d) if d.contains(self.name.bind(py))? => d.del_item(self.name.bind(py)),
            _ => Err(self.missing(py)),
        }
    }
}

/// Has the collector track `v` if it does not yet.
fn track(v: &Bound<'_, PyAny>) {
    let v = v.as_ptr();
    // SAFETY: `v` is a live object of a garbage-collected type (pyo3 gives every class
    // `Py_TPFLAGS_HAVE_GC`), fully initialized, and we hold the GIL. Tracking an object
    // twice is a fatal error, hence the check.
    unsafe {
        if pyo3::ffi::PyObject_GC_IsTracked(v) == 0 {
            pyo3::ffi::PyObject_GC_Track(v.cast());
        }
    }
}

/// Tracks `root` and every value under it, stopping at values already so
/// ([`flag::GRAPH_TRACKED`]): each value is walked once however often graphs holding it are
/// set.
pub fn track_graph(root: &Bound<'_, Value>) {
    let py = root.py();
    let mut stack = vec![root.clone().unbind()];
    while let Some(v) = stack.pop() {
        let node = v.get();
        if node.set_flags(flag::GRAPH_TRACKED) {
            continue;
        }
        track(v.bind(py).as_any());
        stack.extend(node.children().map(|c| c.clone_ref(py)));
    }
}
