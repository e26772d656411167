//! Freeing a graph deeper than the stack: releasing a value releases its operands, and Python
//! frees each whose last reference that was, dropping it in turn: down a chain of 100,000
//! values (`x = x + 1` in a loop) that recursion overflows the stack. So the outermost drop
//! collects operands in a list and releases them one at a time; a drop inside it only adds
//! its operands to the list. (A node of the program's op adds its children, and lets go of
//! its attributes last.)

use std::cell::RefCell;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::attrs::Extra;
use crate::value::Value;

thread_local! {
    /// Operands waiting to be released while a value is dropped (see `Drop for Value`).
    static RELEASING: RefCell<Option<Vec<Py<Value>>>> = const { RefCell::new(None) };
}

impl Drop for Value {
    fn drop(&mut self) {
        if self.has(crate::value::flag::SITED) {
            crate::anomaly::forget(self.serial());
        }
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
        let attrs = self.extra.take().map(|extra| release_children(*extra));
        if outermost {
            while let Some(operand) = RELEASING.with(|list| list.borrow_mut().as_mut()?.pop()) {
                drop(operand);
            }
            RELEASING.with(|list| list.borrow_mut().take());
        }
        drop(attrs);
    }
}

/// Adds a node's children to the list of values being released (see `Drop for Value`), and
/// returns its attributes.
#[cold]
fn release_children(extra: Extra) -> Py<PyDict> {
    let Extra { custom, attrs } = extra;
    if let Some(custom) = custom {
        RELEASING.with(|list| {
            let mut list = list.borrow_mut();
            list.as_mut()
                .expect("a drop is releasing")
                .extend(custom.children)
        });
    }
    attrs
}
