//! `draw_dot`'s DOT text: the graph under a value drawn by `tapejit::dot`, each node labelled
//! with its `Value`'s data and grad as Python sees them.

use pyo3::prelude::*;
use tapejit::{Graph, Tape};

use crate::drop_in::{error, graph_of, linearize};
use crate::value::{flag, Value};

/// The graph under `root` as Graphviz DOT (summarised by its loops when large).
#[pyfunction]
pub fn to_dot(root: Bound<'_, Value>) -> PyResult<String> {
    let (order, _) = linearize(root.py(), root.get());
    let g = Graph::new();
    let leaf = |_: usize, v: &Value| match v.has(flag::CONSTANT) {
        true => g.constant(v.data.get()),
        false => g.param(v.data.get()),
    };
    let nodes: Vec<_> = graph_of(&g, &order, leaf, None)?
        .into_iter()
        .map(|n| n.expect("nothing folds"))
        .collect();
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
