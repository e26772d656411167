//! `draw_dot`'s DOT text: the graph under a value drawn by `tapejit::dot`, each node labelled
//! with its `Value`'s data and grad as Python sees them.

use pyo3::prelude::*;
use tapejit::{Graph, Tape};

use crate::drop_in::{error, linearize, position};
use crate::value::Value;

/// The graph under `root` as Graphviz DOT (summarised by its loops when large).
#[pyfunction]
pub fn to_dot(root: Py<Value>) -> PyResult<String> {
    let (order, _) = linearize(root.get());
    let g = Graph::new();
    let mut nodes = Vec::with_capacity(order.len());
    for &v in &order {
        let node = match v.op {
            None if v.constant => g.constant(v.data.get()),
            None => g.param(v.data.get()),
            Some(op) => {
                let args: Vec<_> = v.prev().map(|p| nodes[position(p.get())]).collect();
                g.apply(op, &args).map_err(error)?
            }
        };
        nodes.push(node);
    }
    g.set_loss(*nodes.last().expect("the root is in its graph"))
        .map_err(error)?;
    let tape = Tape::from_graph(&g).map_err(error)?;
    let mut value_at = vec![None; tape.len()];
    for (k, &n) in nodes.iter().enumerate() {
        let slot = tape.slot(n).map_err(error)?;
        value_at[slot.index()] = Some(order[k]);
    }
    let numbers = |s: tapejit::Slot| match value_at[s.index()] {
        Some(v) => (Some(v.data.get()), Some(v.grad.get())),
        None => (None, None),
    };
    Ok(tapejit::dot::to_dot(&tape, &numbers))
}
