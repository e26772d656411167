//! `draw_dot`'s DOT text: the graph under a value drawn by `tapejit::dot`, each node labelled
//! with its `Value`'s data and grad as Python sees them. A graph holding a node of the
//! program's own op (`custom.rs`) has no tape: it is drawn here, node by node, in the same
//! style, each node with its `_op`.

use std::collections::HashMap;
use std::fmt::Write as _;

use pyo3::prelude::*;
use tapejit::{Graph, Tape};

use crate::drop_in::{error, graph_of, linearize};
use crate::value::{flag, Value};

/// The graph under `root` as Graphviz DOT (summarised by its loops when large).
#[pyfunction]
pub fn to_dot(root: Bound<'_, Value>) -> PyResult<String> {
    let Ok((order, _)) = linearize(root.py(), root.get()) else {
        return Ok(by_node(&root));
    };
    let g = Graph::new();
    let leaf = |_: usize, v: &Value| match v.has(flag::CONSTANT) {
        true => g.constant(v.data.get()),
        // (The structure only: the numbers shown are the values' own, read below.)
        false => g.param(0.0),
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

/// The graph under `root` node by node, as `tapejit::dot` draws a small tape: a record
/// `{ op | data | grad }` per value (a leaf's op is `leaf`), an edge from each operand.
fn by_node(root: &Bound<'_, Value>) -> String {
    let order = crate::custom::topo(root);
    let at: HashMap<*const Value, usize> = order
        .iter()
        .enumerate()
        .map(|(k, v)| (v.get() as *const Value, k))
        .collect();
    let mut out = String::from(
        "digraph tape {\n  rankdir=LR;\n  node [shape=record, fontname=\"monospace\"];\n",
    );
    for (k, v) in order.iter().enumerate() {
        let v = v.get();
        let op = match v._op() {
            op if op.is_empty() => "leaf".to_string(),
            op => op
                .replace('"', "\\\"")
                .replace(['{', '}', '|', '<', '>'], "_"),
        };
        let root_mark = if k + 1 == order.len() { " (root)" } else { "" };
        let (data, grad) = (v.data.get(), v.grad.get());
        let _ = writeln!(
            out,
            "  n{k} [label=\"{{ {op}{root_mark} | data {data:.4} | grad {grad:.4} }}\"];"
        );
        for c in v.children() {
            let _ = writeln!(out, "  n{} -> n{k};", at[&(c.get() as *const Value)]);
        }
    }
    out.push_str("}\n");
    out
}
