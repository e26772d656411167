//! Pictures of a tape in Graphviz's DOT language ([`to_dot`], [`graph_to_dot`], [`program_to_dot`]), as
//! micrograd's `draw_dot` draws its graphs: one box per node with its op, value and
//! gradient, an edge from each operand to the node it feeds, left to right.
//!
//! A tape of more than [`MAX_NODES`] nodes would be a picture nobody can read, so it is
//! summarised by the structure loop recovery finds in it (the JIT's own schedule): one box
//! per top-level item (a nest of repeated copies or steps, a loop, a straight-line run) with
//! what it repeats and how many nodes it covers, one box each for the inputs, the params
//! and the constants, and an edge wherever one box reads what another computes.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::error::Result;
use crate::graph::Graph;
use crate::op::Op;
use crate::passes::loops;
use crate::passes::schedule::{AccessKind, Item};
use crate::tape::{Slot, Tape};

/// The most nodes drawn one by one.
pub const MAX_NODES: usize = 300;

/// A node's numbers to show: its value and its gradient, each if known.
pub type Numbers<'a> = &'a dyn Fn(Slot) -> (Option<f64>, Option<f64>);

/// `tape` as DOT, each node labelled with `numbers` where they are known (a graph's leaves
/// are known without a program: params' initial values, constants); summarised above
/// [`MAX_NODES`] nodes (see the module's comment).
pub fn to_dot(tape: &Tape, numbers: Numbers<'_>) -> String {
    let mut out = String::from(
        "digraph tape {\n  rankdir=LR;\n  node [shape=record, fontname=\"monospace\"];\n",
    );
    if tape.len() <= MAX_NODES {
        every_node(tape, numbers, &mut out);
    } else {
        summary(tape, numbers, &mut out);
    }
    out.push_str("}\n");
    out
}

/// The nodes `graph`'s outputs and loss depend on, as DOT: ops, params' initial values and
/// constants (for every value and gradient, draw a program: [`program_to_dot`]).
pub fn graph_to_dot(graph: &Graph) -> Result<String> {
    let tape = Tape::from_graph(graph)?;
    let (values, _) = tape.initial_buffers();
    let leaf = |s: Slot| {
        let known = tape.op(s).is_leaf() && !matches!(tape.op(s), Op::Input(_));
        (known.then(|| values[s.index()]), None)
    };
    Ok(to_dot(&tape, &leaf))
}

/// One record per node: `{ op | data | grad }`, and its operands' edges.
fn every_node(tape: &Tape, numbers: Numbers<'_>, out: &mut String) {
    for s in tape.slots() {
        let (op, args) = (tape.op(s), tape.args(s));
        let what = match op {
            Op::Input(i) => format!("input {i}"),
            Op::Param(i) => format!("param {i}"),
            Op::Const(c) => format!("const {}", short(c)),
            op => op.name().to_string(),
        };
        let mark = if tape.loss() == Some(s) {
            " (loss)"
        } else {
            ""
        };
        let label = format!("{{ {what}{mark}{} }}", shown(numbers(s)));
        let _ = writeln!(out, "  n{} [label=\"{label}\"];", s.0);
        for a in args {
            let _ = writeln!(out, "  n{} -> n{};", a.0, s.0);
        }
    }
}

/// One box per top-level item of the schedule, and per kind of leaf.
fn summary(tape: &Tape, numbers: Numbers<'_>, out: &mut String) {
    let schedule = loops::schedule(tape, true);
    // Which box computes each slot: the leaves' kinds first, then the items.
    const INPUTS: usize = 0;
    const PARAMS: usize = 1;
    const CONSTANTS: usize = 2;
    let mut owner = vec![usize::MAX; tape.len()];
    let mut leaves = [0usize; 3];
    for s in tape.slots() {
        let kind = match tape.op(s) {
            Op::Input(_) => INPUTS,
            Op::Param(_) => PARAMS,
            Op::Const(_) => CONSTANTS,
            _ => continue,
        };
        owner[s.index()] = kind;
        leaves[kind] += 1;
    }
    for (name, count, k) in [
        ("inputs", leaves[INPUTS], INPUTS),
        ("params", leaves[PARAMS], PARAMS),
        ("constants", leaves[CONSTANTS], CONSTANTS),
    ] {
        if count > 0 {
            let _ = writeln!(out, "  b{k} [label=\"{{ {name} | {count} }}\"];");
        }
    }
    for (i, item) in schedule.items.iter().enumerate() {
        let b = 3 + i;
        let mut nodes = 0;
        let mut mark = |s: Slot, owner: &mut Vec<usize>| {
            owner[s.index()] = b;
            nodes += 1;
        };
        match item {
            Item::Straight(r) => {
                for s in r.clone().map(Slot).filter(|&s| !tape.op(s).is_leaf()) {
                    mark(s, &mut owner);
                }
            }
            _ => {
                for (access, counts) in item.nested_accesses() {
                    if matches!(access.kind, AccessKind::Writes { .. }) {
                        access.for_each_slot(&counts, |s| mark(s, &mut owner));
                    }
                }
            }
        }
        let loss = match tape.loss().filter(|l| owner[l.index()] == b) {
            Some(l) => format!(" | loss{}", shown(numbers(l))),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "  b{b} [label=\"{{ {} | {nodes} nodes{loss} }}\"];",
            describe(item)
        );
    }
    // An edge per pair of boxes where one reads what the other computes (products fused
    // into a dot count as its own).
    let mut edges = BTreeSet::new();
    for s in tape.slots() {
        let to = owner[s.index()];
        if to == usize::MAX || tape.op(s).is_leaf() {
            continue;
        }
        for a in tape.args(s) {
            let from = owner[a.index()];
            if from != to && from != usize::MAX {
                edges.insert((from, to));
            }
        }
    }
    for (from, to) in edges {
        let _ = writeln!(out, "  b{from} -> b{to};");
    }
}

/// What a top-level item repeats.
fn describe(item: &Item) -> String {
    match item {
        Item::Straight(r) => format!("straight-line, slots {}..{}", r.start, r.end),
        Item::Map(m) if m.len == 1 => m.op.name().to_string(),
        Item::Map(m) => format!("loop: {} x {}", m.len, m.op.name()),
        Item::Sum(s) => format!("loop: sum of {}", s.tail_len + 1),
        Item::Dot(d) => format!("loop: dot of {}", d.products.len),
        Item::Nest(n) => {
            let inner: Vec<String> = n.body.iter().map(describe).collect();
            let body = if inner.len() > 4 {
                format!("{} items", inner.len())
            } else {
                inner.join(", ")
            };
            format!("nest: {} x [{body}]", n.count)
        }
        Item::SumPart { slot, .. } => format!("part of the sum at slot {}", slot.0),
    }
}

/// A node's known numbers as fields of its record.
fn shown((value, grad): (Option<f64>, Option<f64>)) -> String {
    let mut out = String::new();
    if let Some(v) = value {
        let _ = write!(out, " | data {}", short(v));
    }
    if let Some(g) = grad {
        let _ = write!(out, " | grad {}", short(g));
    }
    out
}

/// The numbers a program shows: every value and gradient.
pub fn program_to_dot(program: &dyn crate::Program) -> String {
    let (values, grads) = program.every_value_and_grad();
    to_dot(program.tape(), &|s| {
        (Some(values[s.index()]), Some(grads[s.index()]))
    })
}

/// A number as a label shows it: four significant digits.
fn short(x: f64) -> String {
    if x == 0.0 || (1e-3..1e5).contains(&x.abs()) {
        let s = format!("{x:.4}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s.is_empty() || s == "-" {
            "0".into()
        } else {
            s.into()
        }
    } else {
        format!("{x:.3e}")
    }
}
