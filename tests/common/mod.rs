//! Shared helpers for the integration tests: backends as `Box<dyn Program>`, a seeded random
//! graph generator, and a side-by-side runner that demands bit-identical results.

// Every test crate includes this module but uses only part of it.
#![allow(dead_code)]

pub mod chain;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tapejit::{Error, Graph, Interpreter, Jit, OptLevel, Program, Slot, Value};

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

pub fn jit(graph: &Graph, level: OptLevel) -> Backend {
    jit_with(graph, level, true)
}

/// The JIT at `level`, with loop recovery on or off.
pub fn jit_with(graph: &Graph, level: OptLevel, loop_recovery: bool) -> Backend {
    let jit = Jit::builder()
        .opt_level(level)
        .loop_recovery(loop_recovery)
        .compile(graph)
        .unwrap_or_else(|e| panic!("JIT at {level:?} rejected the graph: {e}"));
    let lowering = if loop_recovery { "loops" } else { "straight" };
    Backend {
        name: format!("jit {level:?} {lowering}"),
        program: Box::new(jit),
    }
}

/// The reference first, then the JIT at every level with loop recovery on and off: what the
/// differential tests compare.
pub fn interpreter_and_every_jit_level(graph: &Graph) -> Vec<Backend> {
    let mut backends = vec![interpreter(graph)];
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

/// The two backends the hand-written semantics tests run on: the reference and the JIT at
/// its default level.
pub fn semantics_backends() -> [(&'static str, Compile); 2] {
    [
        ("interpreter", |g| interpreter(g).program),
        ("jit O2", |g| {
            Box::new(Jit::compile(g).unwrap_or_else(|e| panic!("JIT rejected the graph: {e}")))
        }),
    ]
}

// ---------------------------------------------------------------------------------------------
// Random graphs
// ---------------------------------------------------------------------------------------------

/// Inputs are drawn from `-INPUT_RANGE..INPUT_RANGE`.
pub const INPUT_RANGE: f64 = 2.0;
/// Params start in `-PARAM_RANGE..PARAM_RANGE` ...
const PARAM_RANGE: f64 = 1.0;
/// ... and the bounds below assume they stay within this after the few small SGD steps the
/// tests take.
const PARAM_BOUND: f64 = 1.5;
/// A value whose bound exceeds this is squashed before it joins the pool, so magnitudes (and
/// with them gradients) stay far from overflow however deep the graph.
const MAGNITUDE_LIMIT: f64 = 20.0;
/// The learning rate of the scripted runs: small, so params stay within `PARAM_BOUND`.
pub const LEARNING_RATE: f64 = 1e-3;

/// The size and flavour of a random graph.
#[derive(Clone, Copy, Debug)]
pub struct GraphShape {
    /// Ops are added until the graph has at least this many nodes (constants included).
    pub nodes: usize,
    pub inputs: usize,
    pub params: usize,
    /// How many outputs to add (some may repeat, or be the loss itself).
    pub outputs: usize,
    /// Probability that an operand is the newest value (deep chains) rather than any earlier
    /// one (diamonds and shared subexpressions).
    pub chain_bias: f64,
    /// Whether to leave some values unused, so the tape has dead code to drop.
    pub dead_ends: bool,
}

impl GraphShape {
    pub fn random(rng: &mut StdRng, nodes: std::ops::RangeInclusive<usize>) -> GraphShape {
        GraphShape {
            nodes: rng.gen_range(nodes),
            inputs: rng.gen_range(1..=6),
            params: rng.gen_range(1..=8),
            outputs: rng.gen_range(1..=4),
            chain_bias: *[0.2, 0.5, 0.85].choose(rng).unwrap(),
            dead_ends: rng.gen_bool(0.3),
        }
    }
}

/// What the generator built, for tests that look beyond the tape.
pub struct Generated<'g> {
    pub loss: Value<'g>,
    pub outputs: Vec<Value<'g>>,
    /// Values that no output nor the loss depends on: the tape must drop them.
    pub dead: Vec<Value<'g>>,
}

/// Adds a random graph of the given shape to `graph` (which should be empty), sets its loss
/// and outputs, and returns them.
///
/// Every op appears about equally often (they are dealt from a shuffled deck), constants sit
/// on either side of binary operators, leaves are created interleaved with the ops (the tape
/// must still put them first), and values stay in safe domains by construction, whatever
/// the inputs in `-INPUT_RANGE..INPUT_RANGE`: each value carries a bound on its magnitude;
/// `log`, fractional and negative powers and divisors only ever see values built to be
/// positive and away from 0 (`x*x + c`, `exp(x)`, `sigmoid(x) + c`); `relu` only sees
/// `x + c` with `|x| <= 1 < |c|`, and `max` only `a` and `b + c` with `|a - b| <= 2 < |c|`,
/// never their kinks.
pub fn build_random_graph<'g>(
    graph: &'g Graph,
    rng: &mut StdRng,
    shape: GraphShape,
) -> Generated<'g> {
    let mut b = Builder {
        graph,
        rng,
        pool: Vec::new(),
        deck: Vec::new(),
        chain_bias: shape.chain_bias,
    };
    // One input and one param up front so ops have operands; the rest arrive at random times.
    let mut pending_leaves: Vec<Leaf> = std::iter::repeat(Leaf::Input)
        .take(shape.inputs - 1)
        .chain(std::iter::repeat(Leaf::Param).take(shape.params - 1))
        .collect();
    pending_leaves.shuffle(b.rng);
    b.add_leaf(Leaf::Input);
    b.add_leaf(Leaf::Param);
    while graph.len() < shape.nodes {
        if !pending_leaves.is_empty() && b.rng.gen_bool(0.05) {
            let leaf = pending_leaves.pop().unwrap();
            b.add_leaf(leaf);
        } else {
            b.add_random_op();
        }
    }
    for leaf in pending_leaves {
        b.add_leaf(leaf);
    }
    b.finish(shape)
}

/// Uniform random inputs for a graph with `n` inputs.
pub fn random_inputs(rng: &mut StdRng, n: usize) -> Vec<f64> {
    (0..n)
        .map(|_| rng.gen_range(-INPUT_RANGE..INPUT_RANGE))
        .collect()
}

#[derive(Clone, Copy)]
enum Leaf {
    Input,
    Param,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    IntegerPower,
    FractionalPower,
    Exp,
    Log,
    Tanh,
    Relu,
    Max,
    Sigmoid,
    Sum,
    ConstantLeft,
    ConstantRight,
    ConstantNode,
}

const KINDS: [Kind; 17] = [
    Kind::Add,
    Kind::Sub,
    Kind::Mul,
    Kind::Div,
    Kind::Neg,
    Kind::IntegerPower,
    Kind::FractionalPower,
    Kind::Exp,
    Kind::Log,
    Kind::Tanh,
    Kind::Relu,
    Kind::Max,
    Kind::Sigmoid,
    Kind::Sum,
    Kind::ConstantLeft,
    Kind::ConstantRight,
    Kind::ConstantNode,
];

/// A value with a bound on its magnitude.
#[derive(Clone, Copy)]
struct Term<'g> {
    value: Value<'g>,
    bound: f64,
}

/// A strictly positive value with bounds `lo <= value <= hi`, `lo > 0`.
#[derive(Clone, Copy)]
struct Positive<'g> {
    value: Value<'g>,
    lo: f64,
    hi: f64,
}

struct PoolEntry<'g> {
    term: Term<'g>,
    is_leaf: bool,
    /// Whether a later op used it; the unused ones are the graph's sinks.
    used: bool,
}

struct Builder<'g, 'r> {
    graph: &'g Graph,
    rng: &'r mut StdRng,
    pool: Vec<PoolEntry<'g>>,
    deck: Vec<Kind>,
    chain_bias: f64,
}

impl<'g> Builder<'g, '_> {
    fn add_leaf(&mut self, leaf: Leaf) {
        let term = match leaf {
            Leaf::Input => Term {
                value: self.graph.input(),
                bound: INPUT_RANGE,
            },
            Leaf::Param => Term {
                value: self
                    .graph
                    .param(self.rng.gen_range(-PARAM_RANGE..PARAM_RANGE)),
                bound: PARAM_BOUND,
            },
        };
        self.pool.push(PoolEntry {
            term,
            is_leaf: true,
            used: false,
        });
    }

    /// An operand: the newest value or any earlier one, marked as used.
    fn pick(&mut self) -> Term<'g> {
        let i = if self.rng.gen_bool(self.chain_bias) {
            self.pool.len() - 1
        } else {
            self.rng.gen_range(0..self.pool.len())
        };
        self.pool[i].used = true;
        self.pool[i].term
    }

    fn push(&mut self, term: Term<'g>) {
        let term = if term.bound > MAGNITUDE_LIMIT {
            self.tame(term, MAGNITUDE_LIMIT)
        } else {
            term
        };
        self.pool.push(PoolEntry {
            term,
            is_leaf: false,
            used: false,
        });
    }

    /// `t` itself if its bound is at most `max`, else `t` squashed (by tanh, or scaled down
    /// by a constant factor, which keeps its gradient alive) to within `max`.
    fn tame(&mut self, t: Term<'g>, max: f64) -> Term<'g> {
        if t.bound <= max {
            t
        } else if self.rng.gen_bool(0.5) {
            Term {
                value: t.value.tanh(),
                bound: 1.0,
            }
        } else {
            Term {
                value: t.value * (max / t.bound),
                bound: max,
            }
        }
    }

    /// A positive value away from 0 built from `t`, for log, divisors and powers.
    fn positive(&mut self, t: Term<'g>) -> Positive<'g> {
        let c = self.rng.gen_range(0.5..2.0);
        match self.rng.gen_range(0..3) {
            0 => {
                let t = self.tame(t, 3.0);
                Positive {
                    value: t.value * t.value + c,
                    lo: c,
                    hi: t.bound * t.bound + c,
                }
            }
            1 => {
                let t = self.tame(t, 1.5);
                Positive {
                    value: t.value.exp(),
                    lo: (-t.bound).exp(),
                    hi: t.bound.exp(),
                }
            }
            _ => Positive {
                value: t.value.sigmoid() + c,
                lo: c,
                hi: 1.0 + c,
            },
        }
    }

    /// A constant of either sign with magnitude in 0.5..3, safe to divide by.
    fn constant(&mut self) -> f64 {
        self.rng.gen_range(0.5..3.0) * self.sign()
    }

    /// 1 or -1.
    fn sign(&mut self) -> f64 {
        if self.rng.gen_bool(0.5) {
            1.0
        } else {
            -1.0
        }
    }

    /// The next op kind, dealt from a shuffled deck so every kind appears every 17 ops.
    fn next_kind(&mut self) -> Kind {
        if self.deck.is_empty() {
            self.deck.extend(KINDS);
            self.deck.shuffle(self.rng);
        }
        self.deck.pop().unwrap()
    }

    fn add_random_op(&mut self) {
        let term = match self.next_kind() {
            Kind::Add => {
                let (a, b) = (self.pick(), self.pick());
                Term {
                    value: a.value + b.value,
                    bound: a.bound + b.bound,
                }
            }
            Kind::Sub => {
                let (a, b) = (self.pick(), self.pick());
                Term {
                    value: a.value - b.value,
                    bound: a.bound + b.bound,
                }
            }
            Kind::Mul => {
                let (a, b) = (self.pick(), self.pick());
                let (a, b) = (self.tame(a, 4.0), self.tame(b, 4.0));
                Term {
                    value: a.value * b.value,
                    bound: a.bound * b.bound,
                }
            }
            Kind::Div => {
                let (a, b) = (self.pick(), self.pick());
                let divisor = self.positive(b);
                // Either sign of divisor: a / p or a / -p.
                let value = if self.rng.gen_bool(0.5) {
                    a.value / divisor.value
                } else {
                    a.value / -divisor.value
                };
                Term {
                    value,
                    bound: a.bound / divisor.lo,
                }
            }
            Kind::Neg => {
                let a = self.pick();
                Term {
                    value: -a.value,
                    bound: a.bound,
                }
            }
            Kind::IntegerPower => {
                let a = self.pick();
                if self.rng.gen_bool(0.5) {
                    // Positive integer powers are safe for either sign. (Not 0: its gradient
                    // `0 * a^-1` is NaN where `a - a` makes `a` exactly 0.)
                    let n = *[1.0, 2.0, 3.0].choose(self.rng).unwrap();
                    let a = self.tame(a, 2.0);
                    Term {
                        value: a.value.powf(n),
                        bound: a.bound.powf(n).max(1.0),
                    }
                } else {
                    let n = *[-1.0, -2.0].choose(self.rng).unwrap();
                    let p = self.positive(a);
                    Term {
                        value: p.value.powf(n),
                        bound: p.lo.powf(n),
                    }
                }
            }
            Kind::FractionalPower => {
                let a = self.pick();
                let c = *[0.5, 1.5, 2.5, -0.5, -1.5, 0.25, 1.0 / 3.0]
                    .choose(self.rng)
                    .unwrap();
                let p = self.positive(a);
                Term {
                    value: p.value.powf(c),
                    bound: p.lo.powf(c).max(p.hi.powf(c)),
                }
            }
            Kind::Exp => {
                let a = self.pick();
                let a = self.tame(a, 2.0);
                Term {
                    value: a.value.exp(),
                    bound: a.bound.exp(),
                }
            }
            Kind::Log => {
                let a = self.pick();
                let p = self.positive(a);
                Term {
                    value: p.value.log(),
                    bound: p.lo.ln().abs().max(p.hi.ln().abs()),
                }
            }
            Kind::Tanh => Term {
                value: self.pick().value.tanh(),
                bound: 1.0,
            },
            Kind::Sigmoid => Term {
                value: self.pick().value.sigmoid(),
                bound: 1.0,
            },
            Kind::Relu => {
                let a = self.pick();
                let a = self.tame(a, 1.0);
                // |a| <= 1 < 1.25 <= |shift|: relu is firmly on one side of its kink.
                let shift = self.rng.gen_range(1.25..2.0) * self.sign();
                Term {
                    value: (a.value + shift).relu(),
                    bound: 1.0 + shift.abs(),
                }
            }
            Kind::Max => {
                let (a, b) = (self.pick(), self.pick());
                let (a, b) = (self.tame(a, 1.0), self.tame(b, 1.0));
                // |a - b| <= 2 < 2.25 <= |shift|: never a tie, so which operand wins (and
                // gets the gradient) is decided by the sign of shift, not by rounding.
                let shifted = b.value + self.rng.gen_range(2.25..3.0) * self.sign();
                let value = if self.rng.gen_bool(0.5) {
                    a.value.max(shifted)
                } else {
                    shifted.max(a.value)
                };
                Term { value, bound: 4.0 }
            }
            Kind::Sum => {
                let terms: Vec<Term> = (0..self.rng.gen_range(1..=5))
                    .map(|_| self.pick())
                    .collect();
                let values: Vec<Value> = terms.iter().map(|t| t.value).collect();
                Term {
                    value: self.graph.sum(&values),
                    bound: terms.iter().map(|t| t.bound).sum(),
                }
            }
            Kind::ConstantLeft => {
                let (a, c) = (self.pick(), self.constant());
                match self.rng.gen_range(0..4) {
                    0 => Term {
                        value: c + a.value,
                        bound: c.abs() + a.bound,
                    },
                    1 => Term {
                        value: c - a.value,
                        bound: c.abs() + a.bound,
                    },
                    2 => Term {
                        value: c * a.value,
                        bound: c.abs() * a.bound,
                    },
                    _ => {
                        let p = self.positive(a);
                        Term {
                            value: c / p.value,
                            bound: c.abs() / p.lo,
                        }
                    }
                }
            }
            Kind::ConstantRight => {
                let (a, c) = (self.pick(), self.constant());
                let value = match self.rng.gen_range(0..4) {
                    0 => a.value + c,
                    1 => a.value - c,
                    2 => a.value * c,
                    _ => a.value / c,
                };
                // |c| >= 0.5, so dividing by it at most doubles the bound.
                Term {
                    value,
                    bound: a.bound * c.abs().max(2.0) + c.abs(),
                }
            }
            Kind::ConstantNode => {
                let c = self.constant();
                Term {
                    value: self.graph.constant(c),
                    bound: c.abs(),
                }
            }
        };
        self.push(term);
    }

    /// Picks the dead ends, the outputs and the loss among the values nothing uses yet.
    fn finish(self, shape: GraphShape) -> Generated<'g> {
        let mut sinks: Vec<Value<'g>> = self
            .pool
            .iter()
            .filter(|e| !e.used && !e.is_leaf)
            .map(|e| e.term.value)
            .collect();
        sinks.shuffle(self.rng);

        let mut dead = Vec::new();
        if shape.dead_ends {
            if sinks.len() >= 3 {
                dead.push(sinks.pop().unwrap());
            }
            // A value built after everything else, used by nothing.
            let newest = self.pool.last().unwrap().term.value;
            dead.push((newest * 2.0).tanh());
        }

        // An output the loss does not depend on: outside the gradient cone.
        let mut outputs = Vec::new();
        if sinks.len() >= 2 && self.rng.gen_bool(0.5) {
            outputs.push(sinks.pop().unwrap());
        }
        let loss = if sinks.is_empty() {
            self.pool.last().unwrap().term.value
        } else {
            self.graph.sum(&sinks)
        };
        while outputs.len() < shape.outputs {
            let candidate = match self.rng.gen_range(0..10) {
                0 => loss,
                1 if !outputs.is_empty() => outputs[0], // the same output twice
                _ => self.pool[self.rng.gen_range(0..self.pool.len())].term.value,
            };
            if !dead.iter().any(|d| d.id() == candidate.id()) {
                outputs.push(candidate);
            }
        }
        outputs.shuffle(self.rng);

        for &o in &outputs {
            self.graph.add_output(o).unwrap();
        }
        self.graph.set_loss(loss).unwrap();
        Generated {
            loss,
            outputs,
            dead,
        }
    }
}

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
        Action::Update(lr) => {
            program.update(*lr);
            Ok(None)
        }
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
        }
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
        format!("slot {slot} ({} of {:?})", tape.op(s).name(), tape.args(s))
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
