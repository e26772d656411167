//! Shared helpers for the integration tests: backends as `Box<dyn Program>`, a seeded random
//! graph generator, and a side-by-side runner that demands bit-identical results.

// Every test crate includes this module but uses only part of it.
#![allow(dead_code)]

pub mod chain;

use rand::rngs::StdRng;
use rand::Rng;
use tapejit::{Error, Graph, Interpreter, Jit, JitStats, OptLevel, Program, Slot, Tiering};

// ---------------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------------

/// A program with a name for failure messages.
pub struct Backend {
    pub name: String,
    pub program: Box<dyn Program>,
}

pub fn interpreter(graph: &Graph) -> Backend {
    Backend {
        name: "interpreter".into(),
        program: Box::new(Interpreter::new(graph).expect("interpreter rejected the graph")),
    }
}

/// What native code compiled from `graph` at the default level reports (no first tier).
pub fn native_stats(graph: &Graph) -> JitStats {
    let jit = Jit::builder().tiering(Tiering::Off).compile(graph).unwrap();
    jit.stats().clone()
}

pub fn jit(graph: &Graph, level: OptLevel) -> Backend {
    jit_with(graph, level, true)
}

/// The JIT's native code at `level`, with loop recovery on or off (tiering off, so that
/// every call runs it).
pub fn jit_with(graph: &Graph, level: OptLevel, loop_recovery: bool) -> Backend {
    let jit = Jit::builder()
        .opt_level(level)
        .loop_recovery(loop_recovery)
        .tiering(Tiering::Off)
        .compile(graph)
        .unwrap_or_else(|e| panic!("JIT at {level:?} rejected the graph: {e}"));
    let lowering = if loop_recovery { "loops" } else { "straight" };
    Backend {
        name: format!("jit {level:?} {lowering}"),
        program: Box::new(jit),
    }
}

/// The JIT's first tier alone (the kernel tier: nothing compiled).
pub fn first_tier(graph: &Graph) -> Backend {
    let jit = Jit::builder()
        .tiering(Tiering::FirstTierOnly)
        .compile(graph)
        .unwrap_or_else(|e| panic!("the first tier rejected the graph: {e}"));
    Backend {
        name: "jit first tier".into(),
        program: Box::new(jit),
    }
}

/// The reference first, then the JIT's first tier, then its native code at every level
/// with loop recovery on and off: what the differential tests compare.
pub fn interpreter_and_every_jit_level(graph: &Graph) -> Vec<Backend> {
    let mut backends = vec![interpreter(graph), first_tier(graph)];
    for recovery in [true, false] {
        backends.extend(
            OptLevel::ALL
                .iter()
                .map(|&level| jit_with(graph, level, recovery)),
        );
    }
    backends
}

/// Makes a program of a graph, panicking if the backend rejects it.
pub type Compile = fn(&Graph) -> Box<dyn Program>;

/// The backends the hand-written semantics tests run on: the reference, the JIT's first
/// tier, and its native code at the default level.
pub fn semantics_backends() -> [(&'static str, Compile); 3] {
    [
        ("interpreter", |g| interpreter(g).program),
        ("jit first tier", |g| first_tier(g).program),
        ("jit O2", |g| jit(g, OptLevel::O2).program),
    ]
}

// ---------------------------------------------------------------------------------------------
// Random graphs (random_graph.rs)
// ---------------------------------------------------------------------------------------------

mod random_graph;
#[allow(unused_imports)] // each test crate uses part
pub use random_graph::{
    build_random_graph, random_inputs, Generated, GraphShape, LEARNING_RATE, PARAM_RANGE,
};

// ---------------------------------------------------------------------------------------------
// Side by side
// ---------------------------------------------------------------------------------------------

/// One call on the `Program` API.
#[derive(Clone, Debug)]
pub enum Action {
    SetInputs(Vec<f64>),
    SetParams(Vec<f64>),
    ZeroGrad,
    Forward,
    Backward,
    Update(f64),
    Step(Vec<f64>, f64),
}

/// The training script every backend runs: new params, then a fresh backward, a second one
/// without `zero_grad` (param gradients accumulate; the rest are recomputed), one with
/// `zero_grad`, each followed by an update, and a final `step`.
pub fn training_script(rng: &mut StdRng, num_inputs: usize, num_params: usize) -> Vec<Action> {
    let params = (0..num_params)
        .map(|_| rng.gen_range(-PARAM_RANGE..PARAM_RANGE))
        .collect();
    let mut script = vec![Action::SetParams(params)];
    for zero_grad_first in [false, false, true] {
        script.push(Action::SetInputs(random_inputs(rng, num_inputs)));
        if zero_grad_first {
            script.push(Action::ZeroGrad);
        }
        script.extend([
            Action::Forward,
            Action::Backward,
            Action::Update(LEARNING_RATE),
        ]);
    }
    script.push(Action::Step(random_inputs(rng, num_inputs), LEARNING_RATE));
    script
}

/// Performs `action`; returns what it returned (a loss, or an error) as a comparable value.
pub fn apply(program: &mut dyn Program, action: &Action) -> Result<Option<f64>, Error> {
    match action {
        Action::SetInputs(x) => program.set_inputs(x).map(|_| None),
        Action::SetParams(p) => program.set_params(p).map(|_| None),
        Action::ZeroGrad => {
            program.zero_grad();
            Ok(None)
        }
        Action::Forward => Ok(Some(program.forward())),
        Action::Backward => program.backward().map(|_| None),
        Action::Update(lr) => program.update(*lr).map(|_| None),
        Action::Step(x, lr) => program.step(x, *lr).map(Some),
    }
}

/// Runs a random training script (drawn from `rng`) on every backend and asserts that,
/// after every action, each one's results and whole state are bit-identical to the first's.
pub fn assert_backends_agree(context: &str, backends: &mut [Backend], rng: &mut StdRng) {
    let tape = backends[0].program.tape();
    let script = training_script(rng, tape.num_inputs(), tape.num_params());
    assert_backends_agree_on(context, backends, &script);
}

/// [`assert_backends_agree`] with a given script.
pub fn assert_backends_agree_on(context: &str, backends: &mut [Backend], script: &[Action]) {
    let (reference, others) = backends.split_first_mut().expect("no backends");
    for other in others.iter() {
        assert_eq!(
            reference.program.tape().len(),
            other.program.tape().len(),
            "{context}: {} and {} run tapes of different lengths",
            reference.name,
            other.name
        );
        assert_same_state(&format!("{context}, before any action"), reference, other);
    }
    for (index, action) in script.iter().enumerate() {
        let expected = apply(reference.program.as_mut(), action);
        for other in others.iter_mut() {
            let at = format!("{context}, action {index} ({})", action_name(action));
            let got = apply(other.program.as_mut(), action);
            assert_same_result(&at, &reference.name, &expected, &other.name, &got);
            assert_same_state(&at, reference, other);
            if matches!(action, Action::Backward) {
                assert_same_recomputed_state(&at, reference, other);
            }
        }
    }
}

/// Every slot's value and gradient but the params' (which the layout pass may move), those
/// a program does not keep recomputed ([`Program::every_value_and_grad`]), compared bit for
/// bit: right after `backward`, while the params are those `forward` saw.
fn assert_same_recomputed_state(at: &str, expected: &Backend, got: &Backend) {
    let (e, g) = (expected.program.as_ref(), got.program.as_ref());
    let ((e_values, e_grads), (g_values, g_grads)) =
        (e.every_value_and_grad(), g.every_value_and_grad());
    let p = e.tape().num_params();
    let names = (expected.name.as_str(), got.name.as_str());
    let describe = |i: usize| format!("slot {}", p + i);
    for (what, a, b) in [
        ("every value", &e_values, &g_values),
        ("every gradient", &e_grads, &g_grads),
    ] {
        assert_bits_eq(at, what, names, &a[p..], &b[p..], &describe);
    }
}

fn action_name(action: &Action) -> &'static str {
    match action {
        Action::SetInputs(_) => "set_inputs",
        Action::SetParams(_) => "set_params",
        Action::ZeroGrad => "zero_grad",
        Action::Forward => "forward",
        Action::Backward => "backward",
        Action::Update(_) => "update",
        Action::Step(..) => "step",
    }
}

fn assert_same_result(
    at: &str,
    expected_name: &str,
    expected: &Result<Option<f64>, Error>,
    got_name: &str,
    got: &Result<Option<f64>, Error>,
) {
    let same = match (expected, got) {
        (Ok(Some(a)), Ok(Some(b))) => a.to_bits() == b.to_bits(),
        _ => expected == got,
    };
    assert!(
        same,
        "{at}: {expected_name} returned {expected:?}, {got_name} returned {got:?}"
    );
}

/// Values, gradients, outputs, loss and params, all compared bit for bit.
fn assert_same_state(at: &str, expected: &Backend, got: &Backend) {
    let (e, g) = (expected.program.as_ref(), got.program.as_ref());
    let describe = |slot: usize| {
        let s = Slot(slot as u32);
        let tape = e.tape();
        {
            let node = tape.node(s).unwrap();
            format!("slot {slot} ({} of {:?})", node.op.name(), node.args)
        }
    };
    let names = (expected.name.as_str(), got.name.as_str());
    // Params may sit in different slots (the layout pass moves them; they are compared in
    // creation order below); every other slot is where the tape put it, in both.
    let kept = kept_slots(e, g);
    let pick = |buf: &[f64]| kept.iter().map(|&s| buf[s]).collect::<Vec<f64>>();
    let describe_kept = |i: usize| describe(kept[i]);
    assert_bits_eq(
        at,
        "values",
        names,
        &pick(e.values()),
        &pick(g.values()),
        &describe_kept,
    );
    assert_bits_eq(
        at,
        "grads",
        names,
        &pick(e.grads()),
        &pick(g.grads()),
        &describe_kept,
    );
    let position = |i: usize| format!("#{i}");
    assert_bits_eq(at, "outputs", names, &e.outputs(), &g.outputs(), &position);
    assert_bits_eq(at, "params", names, &e.params(), &g.params(), &position);
    assert_bits_eq(
        at,
        "param_grads",
        names,
        &e.param_grads(),
        &g.param_grads(),
        &position,
    );
    match (e.loss(), g.loss()) {
        (Ok(a), Ok(b)) => assert_bits_eq(at, "loss", names, &[a], &[b], &position),
        (a, b) => assert_eq!(a, b, "{at}: loss() of {} and {} differ", names.0, names.1),
    }
}

/// The non-param slots both programs keep in their buffers.
pub fn kept_slots(a: &dyn Program, b: &dyn Program) -> Vec<usize> {
    (a.tape().num_params()..a.tape().len())
        .filter(|&s| a.is_kept(Slot(s as u32)) && b.is_kept(Slot(s as u32)))
        .collect()
}

/// Asserts two slices are bit-identical, naming the first differing element.
pub fn assert_bits_eq(
    at: &str,
    what: &str,
    (expected_name, got_name): (&str, &str),
    expected: &[f64],
    got: &[f64],
    describe: &dyn Fn(usize) -> String,
) {
    assert_eq!(
        expected.len(),
        got.len(),
        "{at}: {what} of {expected_name} and {got_name} differ in length"
    );
    if let Some(i) = (0..expected.len()).find(|&i| expected[i].to_bits() != got[i].to_bits()) {
        panic!(
            "{at}: {what} differ at {}: {expected_name} has {:e} ({:#018x}), {got_name} has {:e} ({:#018x})",
            describe(i),
            expected[i],
            expected[i].to_bits(),
            got[i],
            got[i].to_bits(),
        );
    }
}

/// `|got - expected| <= rel * max(|got|, |expected|) + abs`, with a message naming `what`.
pub fn assert_close(what: &str, got: f64, expected: f64, rel: f64, abs: f64) {
    let tolerance = rel * got.abs().max(expected.abs()) + abs;
    assert!(
        (got - expected).abs() <= tolerance,
        "{what}: got {got:e}, expected {expected:e} (difference {:e}, tolerance {tolerance:e})",
        (got - expected).abs()
    );
}
