//! `Value.backward`: micrograd's code rebuilds its graph every step, and every rebuild has the
//! same structure. So `backward` linearizes the graph under the root (micrograd's
//! topological order, operands in order), keys it by its structure (each node's op and its
//! operands' positions, not the numbers), and runs the tape of that structure: the
//! interpreter the first time a structure is seen, the JIT (compiled once, at the second
//! sight) from then on. Only the leaves' numbers go in; every node's gradient comes out.
//!
//! Every leaf (a `Value(x)`, or a number an operator met) is a param of the tape: params'
//! gradients are what the tape computes for leaves. A leaf's gradient is added to its
//! `grad` and the others' too (micrograd adds into every node's), the root's set to 1.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::exceptions::{PyFloatingPointError, PyValueError};
use pyo3::prelude::*;
use rustc_hash::FxBuildHasher;
use tapejit::{Graph, Interpreter, Jit, Op, Program};

use crate::value::Value;

/// How many structures the cache keeps (the least recently used goes first).
const CACHED: usize = 16;

/// A structure's program and where each node lives in its tape.
struct Compiled {
    program: Box<dyn Program + Send>,
    /// Per node, in topological order: its slot.
    slots: Vec<u32>,
    /// Per node, in topological order: its node in the program's graph.
    nodes: Vec<u32>,
    /// Whether `program` is the JIT's.
    native: bool,
    /// When it was last used (the cache's clock).
    used: u64,
}

/// Structures seen, by key.
#[derive(Default)]
struct Cache {
    programs: HashMap<Vec<u64>, Compiled, FxBuildHasher>,
    clock: u64,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// Numbers `backward` calls, for marks: a value whose mark's upper half is this call's has
/// been visited, and its lower half is its position in the order (or [`UNPLACED`] while its
/// operands are being visited).
static CALLS: AtomicU64 = AtomicU64::new(0);
const UNPLACED: u64 = u32::MAX as u64;

/// The graph under `root` in the order its values were made (operands before the values
/// made from them), and its structural key. Marks each value with its position
/// ([`position`]). (The order values were made in, not micrograd's depth-first one: a graph
/// built layer by layer and copy by copy keeps the regular structure loop recovery rolls,
/// where a depth-first order interleaves a copy's layers.) A graph holding a value whose
/// backward is a Python function (`custom.rs`) has no tape: that value is the error.
pub fn linearize<'v>(
    py: Python<'_>,
    root: &'v Value,
) -> Result<(Vec<&'v Value>, Vec<u64>), &'v Value> {
    let call = CALLS.fetch_add(1, Ordering::Relaxed) + 1;
    // Whether `v` was not yet seen by this call (and now is).
    let first_visit =
        |v: &Value| v.mark.swap(call << 32 | UNPLACED, Ordering::Relaxed) >> 32 != call;
    first_visit(root);
    let mut order: Vec<&Value> = vec![root];
    let mut next = 0;
    while let Some(&v) = order.get(next) {
        next += 1;
        for operand in v.prev() {
            let operand = operand.get();
            if first_visit(operand) {
                order.push(operand);
            }
        }
    }
    // By serial: the word holding it above the value's flags orders values as it does.
    order.sort_unstable_by_key(|v| v.sort_key(py));
    for (k, v) in order.iter().enumerate() {
        if v.runs_python() {
            return Err(v);
        }
        v.mark.store(call << 32 | k as u64, Ordering::Relaxed);
    }
    let mut key = Vec::with_capacity(order.len() * 4);
    for v in &order {
        push_op(&mut key, v);
        key.extend(v.prev().map(|p| position(p.get()) as u64));
    }
    Ok((order, key))
}

/// Where the last [`linearize`] placed `v`.
pub fn position(v: &Value) -> usize {
    (v.mark.load(Ordering::Relaxed) & UNPLACED) as usize
}

/// A node's op as numbers of the key: a marker with the top bit set (distinct from every
/// operand position, which lies below 2^63), then the op's field's bits, from
/// [`Op::key`]: every op and every constant's bit tells structures apart.
fn push_op(key: &mut Vec<u64>, v: &Value) {
    const MARK: u64 = 1 << 63;
    // A leaf is no op: one kind past every op's.
    let [kind, field] = v.op.map_or([u32::MAX as u64, 0], Op::key);
    key.extend([MARK | kind, field]);
}

/// The program of the structure `order` (the interpreter's, or the JIT's if `native`), and
/// every node's slot.
fn build(order: &[&Value], native: bool) -> PyResult<Compiled> {
    let g = Graph::new();
    // (Each leaf a param of any number: `run` sets the leaves' numbers before each pass, and
    // names a leaf that is not finite.)
    let nodes: Vec<_> = graph_of(&g, order, |_, _| g.param(0.0), None)?
        .into_iter()
        .map(|n| n.expect("nothing folds"))
        .collect();
    let root = *nodes.last().expect("a graph has its root");
    g.set_loss(root).map_err(error)?;
    let program: Box<dyn Program + Send> = if native {
        Box::new(Jit::compile(&g).map_err(error)?)
    } else {
        Box::new(Interpreter::new(&g).map_err(error)?)
    };
    let slots = nodes
        .iter()
        .map(|&n| program.tape().slot(n).map(|s| s.0).map_err(error))
        .collect::<PyResult<_>>()?;
    Ok(Compiled {
        program,
        slots,
        nodes: nodes.iter().map(|n| n.id()).collect(),
        native,
        used: 0,
    })
}

/// `e` of a program of `order`'s graph (`nodes`: each value's graph node), told in terms
/// of the values: a non-finite leaf (param `k` of the program: the `k`-th leaf of `order`)
/// and an anomaly's node by the value, and where it was made (anomaly mode records it).
fn in_terms_of_values(e: tapejit::Error, order: &[&Value], nodes: &[u32]) -> PyErr {
    let value_of = |node: u32| nodes.iter().position(|&n| n == node).map(|k| order[k]);
    let about = |v: &Value| format!("{}{}", v.__repr__(), crate::anomaly::made_at(v.serial()));
    let leaf = |k: usize| order.iter().filter(|v| v.op.is_none()).nth(k);
    match &e {
        tapejit::Error::NonFinite {
            what: "param",
            index,
            value,
        } => match leaf(*index) {
            Some(v) => PyValueError::new_err(format!(
                "a leaf of the graph is not finite ({value}): {}",
                about(v)
            )),
            None => error(e),
        },
        tapejit::Error::Anomaly { node: Some(n), .. } => match value_of(*n) {
            Some(v) => PyFloatingPointError::new_err(format!("{e}: the value {}", about(v))),
            None => error(e),
        },
        _ => error(e),
    }
}

/// The values of `order` ([`linearize`]'s, marks current) as nodes of `g`: each leaf as
/// `leaf` makes it from its position and value, each other value its op of its operands'
/// nodes. An addition `folds` marks (whose one use is as the first operand of the next
/// addition) gets no node: its terms go on into that addition's, which becomes one n-ary
/// `Sum` (`((a + b) + c) + d` adds in that order either way, so the bits are the same).
pub fn graph_of<'g>(
    g: &'g Graph,
    order: &[&Value],
    mut leaf: impl FnMut(usize, &Value) -> tapejit::Value<'g>,
    folds: Option<&[bool]>,
) -> PyResult<Vec<Option<tapejit::Value<'g>>>> {
    let folds_at = |k: usize| folds.is_some_and(|f| f[k]);
    let mut nodes: Vec<Option<tapejit::Value<'g>>> = Vec::with_capacity(order.len());
    // A folded addition's terms so far.
    let mut terms: Vec<Vec<tapejit::Value<'g>>> = vec![Vec::new(); order.len()];
    let operand = |p: &Py<Value>, nodes: &[Option<tapejit::Value<'g>>]| {
        nodes[position(p.get())].expect("an operand that is not a folded addition")
    };
    for (k, &v) in order.iter().enumerate() {
        let node = match v.op {
            None => Some(leaf(k, v)),
            Some(Op::Add) if folds.is_some() => {
                let mut operands = v.prev();
                let (a, b) = (operands.next().expect("two"), operands.next().expect("two"));
                let left = position(a.get());
                let mut sum = match folds_at(left) {
                    true => std::mem::take(&mut terms[left]),
                    false => vec![operand(a, &nodes)],
                };
                sum.push(operand(b, &nodes));
                if folds_at(k) {
                    terms[k] = sum;
                    None
                } else if sum.len() == 2 {
                    Some(g.apply(Op::Add, &sum).map_err(error)?)
                } else {
                    Some(g.sum(&sum))
                }
            }
            Some(op) => {
                let args: Vec<_> = v.prev().map(|p| operand(p, &nodes)).collect();
                Some(g.apply(op, &args).map_err(error)?)
            }
        };
        nodes.push(node);
    }
    Ok(nodes)
}

/// Empties the cache; run at Python's exit (`lib.rs` registers it). A JIT left in the cache
/// would compile on into the process's exit: C's exit handlers, which run after Python's,
/// tear down LLVM's globals, those registered while the compile ran first (the process
/// crashed on them after a drop-in training loop of a few seconds). Dropped here, each JIT
/// calls its compile off, waiting for one inside LLVM to end the module it is on.
#[pyfunction]
#[pyo3(name = "_drop_cached_programs")]
pub fn drop_cached(py: Python<'_>) {
    let cache = CACHE.lock().unwrap_or_else(|e| e.into_inner()).take();
    py.detach(move || drop(cache));
}

pub fn error(e: tapejit::Error) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// micrograd's `backward` from `root`; micrograd's own algorithm for a graph that holds a
/// Python backward (`custom.rs`).
pub fn backward(py: Python<'_>, root_object: &Py<Value>) -> PyResult<()> {
    let root = root_object.get();
    if root.is_leaf() && !root.runs_python() {
        // A leaf's gradient with respect to itself.
        root.grad.set(1.0);
        return Ok(());
    }
    let Ok((order, key)) = linearize(py, root) else {
        return crate::custom::backward(root_object.bind(py));
    };
    let mut evicted = None;
    let ran = run(&order, key, &mut evicted);
    // A JIT dropped while its native compile is inside LLVM waits for the module it is on:
    // this one once the cache is unlocked, and without the GIL.
    if let Some(evicted) = evicted {
        py.detach(move || drop(evicted));
    }
    ran?;
    root.grad.set(1.0);
    Ok(())
}

/// The tape of `order`'s structure (`key`) run on its leaves' numbers, each node's gradient
/// added to its `grad`; `evicted`: the structure the cache let go of, if it was full.
fn run(order: &[&Value], key: Vec<u64>, evicted: &mut Option<Compiled>) -> PyResult<()> {
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = cache.get_or_insert_with(Cache::default);
    cache.clock += 1;
    let clock = cache.clock;
    let seen = cache.programs.get(&key).map(|c| c.native);
    if seen != Some(true) {
        // First sight: the interpreter (no compile time for a graph built once); second
        // sight: the JIT, which every later rebuild reuses.
        let compiled = build(order, seen.is_some())?;
        if cache.programs.len() >= CACHED && seen.is_none() {
            let oldest = cache
                .programs
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                *evicted = cache.programs.remove(&oldest);
            }
        }
        cache.programs.insert(key.clone(), compiled);
    }
    let compiled = cache.programs.get_mut(&key).expect("inserted above");
    compiled.used = clock;
    let leaves: Vec<f64> = order
        .iter()
        .filter(|v| v.op.is_none())
        .map(|v| v.data.get())
        .collect();
    let program = compiled.program.as_mut();
    let in_terms_of_values = |e| in_terms_of_values(e, order, &compiled.nodes);
    program.set_params(&leaves).map_err(in_terms_of_values)?;
    program.forward();
    program.zero_grad();
    let anomaly = crate::anomaly::on();
    program.detect_anomaly(anomaly);
    let done = program.backward();
    program.detect_anomaly(false);
    done.map_err(in_terms_of_values)?;
    let (_, grads) = program.every_value_and_grad();
    for (v, &slot) in order.iter().zip(&compiled.slots) {
        let g = grads[slot as usize];
        v.grad.set(v.grad.get() + g);
    }
    Ok(())
}
