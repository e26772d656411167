//! Freeing a graph deeper than the stack: releasing a value releases its operands, and Python
//! frees each whose last reference that was, dropping it in turn: down a chain of 100,000
//! values (`x = x + 1` in a loop) that recursion overflows the stack. So the outermost drop
//! collects operands in a list and releases them one at a time; a drop inside it only adds
//! its operands to the list. (A value with attributes lets go of them last.)

use std::cell::RefCell;

use pyo3::prelude::*;

use crate::value::Value;

thread_local! {
    /// Operands waiting to be released while a value is dropped (see `Drop for Value`).
    static RELEASING: RefCell<Option<Vec<Py<Value>>>> = const { RefCell::new(None) };
}

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
        let extra = self.extra.take();
        if outermost {
            while let Some(operand) = RELEASING.with(|list| list.borrow_mut().as_mut()?.pop()) {
                drop(operand);
            }
            RELEASING.with(|list| list.borrow_mut().take());
        }
        drop(extra);
    }
}
