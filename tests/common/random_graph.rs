//! A seeded random graph generator whose ops come from `Op::iter()`: a new op is dealt into
//! the graphs, kept inside its [`Domain`], without editing this file.
//!
//! Values stay finite by construction, whatever the inputs in `-INPUT_RANGE..INPUT_RANGE`:
//! every value carries an interval it lies in; an operand is built to lie in its op's domain
//! (`x*x + c`, `exp(x)`, `sigmoid(x) + c` or `x + c` with `|x| <= 1 < |c|` for positive and
//! nonzero ones, `b + c` with `|a - b| <= 2 < |c|` for one kept apart from `a`), so no op
//! ever meets a pole or a kink; and a value whose magnitude could exceed `MAGNITUDE_LIMIT` is
//! squashed before it joins the pool.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use strum::IntoEnumIterator;
use tapejit::op::{Domain, F64};
use tapejit::{Graph, Op, Value};

/// Inputs are drawn from `-INPUT_RANGE..INPUT_RANGE`.
pub const INPUT_RANGE: f64 = 2.0;
/// Params start in `-PARAM_RANGE..PARAM_RANGE` ...
pub const PARAM_RANGE: f64 = 1.0;
/// ... and the intervals below assume they stay within this after the few small SGD steps
/// the tests take.
const PARAM_BOUND: f64 = 1.5;
/// A value whose magnitude could exceed this is squashed before it joins the pool, so
/// magnitudes (and with them gradients) stay far from overflow however deep the graph.
const MAGNITUDE_LIMIT: f64 = 20.0;
/// Operands are squashed to within this before an op that is not a sum reads them, so an
/// op's result rarely needs squashing itself.
const OPERAND_LIMIT: f64 = 4.0;
/// The learning rate of the scripted runs: small, so params stay within `PARAM_BOUND`.
pub const LEARNING_RATE: f64 = 1e-3;
/// Exponents for `powf`: positive and negative integers, roots and other fractions.
const EXPONENTS: [f64; 12] = [
    1.0,
    2.0,
    3.0,
    -1.0,
    -2.0,
    0.5,
    1.5,
    2.5,
    -0.5,
    -1.5,
    0.25,
    1.0 / 3.0,
];
/// How often an operand is a constant node, where its domain allows one.
const CONSTANT_OPERAND: f64 = 0.25;

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
/// Every op of `Op::iter()` appears about equally often (they are dealt from a shuffled
/// deck; `Const` as a node of its own, and as operands besides), leaves are created
/// interleaved with the ops (the tape must still put them first), and every operand lies in
/// its op's domain (see the module's docs).
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

/// The ops the generator deals: every op but inputs and params, which arrive as leaves.
fn dealt_ops() -> impl Iterator<Item = Op> {
    Op::iter().filter(|op| !matches!(op, Op::Input(_) | Op::Param(_)))
}

#[derive(Clone, Copy)]
enum Leaf {
    Input,
    Param,
}

/// A value and an interval `lo..=hi` it lies in.
#[derive(Clone, Copy)]
struct Term<'g> {
    value: Value<'g>,
    lo: f64,
    hi: f64,
}

impl<'g> Term<'g> {
    fn symmetric(value: Value<'g>, bound: f64) -> Term<'g> {
        Term {
            value,
            lo: -bound,
            hi: bound,
        }
    }

    /// A bound on its magnitude.
    fn bound(&self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }
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
    deck: Vec<Op>,
    chain_bias: f64,
}

impl<'g> Builder<'g, '_> {
    fn add_leaf(&mut self, leaf: Leaf) {
        let term = match leaf {
            Leaf::Input => Term::symmetric(self.graph.input(), INPUT_RANGE),
            Leaf::Param => {
                let init = self.rng.gen_range(-PARAM_RANGE..PARAM_RANGE);
                Term::symmetric(self.graph.param(init), PARAM_BOUND)
            }
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
        let term = self.tame(term, MAGNITUDE_LIMIT);
        self.pool.push(PoolEntry {
            term,
            is_leaf: false,
            used: false,
        });
    }

    /// `t` itself if its magnitude is at most `max`, else `t` squashed (by tanh, or scaled
    /// down by a constant factor, which keeps its gradient alive) to within `max`.
    fn tame(&mut self, t: Term<'g>, max: f64) -> Term<'g> {
        if t.bound() <= max {
            t
        } else if self.rng.gen_bool(0.5) {
            let (lo, hi) = (t.lo.tanh(), t.hi.tanh());
            Term {
                value: t.value.tanh(),
                lo,
                hi,
            }
        } else {
            let scale = max / t.bound();
            Term {
                value: t.value * scale,
                lo: t.lo * scale,
                hi: t.hi * scale,
            }
        }
    }

    /// A positive value away from 0 built from `t`.
    fn positive(&mut self, t: Term<'g>) -> Term<'g> {
        let c = self.rng.gen_range(0.5..2.0);
        match self.rng.gen_range(0..4) {
            0 => {
                let t = self.tame(t, 3.0);
                Term {
                    value: t.value * t.value + c,
                    lo: c,
                    hi: t.bound() * t.bound() + c,
                }
            }
            1 => {
                let t = self.tame(t, 1.5);
                Term {
                    value: t.value.exp(),
                    lo: t.lo.exp(),
                    hi: t.hi.exp(),
                }
            }
            2 => Term {
                value: t.value.sigmoid() + c,
                lo: c,
                hi: 1.0 + c,
            },
            _ => {
                // |t| <= 1 < 1.25 <= shift: a kink at 0 stays far.
                let t = self.tame(t, 1.0);
                let shift = self.rng.gen_range(1.25..2.0);
                Term {
                    value: t.value + shift,
                    lo: shift - 1.0,
                    hi: shift + 1.0,
                }
            }
        }
    }

    /// 1 or -1.
    fn sign(&mut self) -> f64 {
        if self.rng.gen_bool(0.5) {
            1.0
        } else {
            -1.0
        }
    }

    /// A constant node in `lo..hi` (or its negation, `negate`).
    fn constant(&mut self, lo: f64, hi: f64, negate: bool) -> Term<'g> {
        let c = self.rng.gen_range(lo..hi) * if negate { self.sign() } else { 1.0 };
        Term {
            value: self.graph.constant(c),
            lo: c,
            hi: c,
        }
    }

    /// Operand `i` of `op`, inside its domain; `earlier` are the operands made before it
    /// (a domain may refer to them, and may squash them further).
    fn operand(&mut self, op: Op, i: usize, earlier: &mut [Term<'g>]) -> Term<'g> {
        let constant = self.rng.gen_bool(CONSTANT_OPERAND);
        let limit = if op == Op::Sum {
            MAGNITUDE_LIMIT
        } else {
            OPERAND_LIMIT
        };
        match op.domain(i) {
            Domain::Real if constant => self.constant(0.5, 3.0, true),
            Domain::Real => {
                let t = self.pick();
                self.tame(t, limit)
            }
            Domain::Positive if constant => self.constant(0.5, 3.0, false),
            Domain::Positive => {
                let t = self.pick();
                self.positive(t)
            }
            Domain::NonZero if constant => self.constant(0.5, 3.0, true),
            Domain::NonZero => {
                let t = self.pick();
                let p = self.positive(t);
                if self.rng.gen_bool(0.5) {
                    p
                } else {
                    Term {
                        value: -p.value,
                        lo: -p.hi,
                        hi: -p.lo,
                    }
                }
            }
            Domain::ApartFrom(k) => {
                // |a - b| <= 2 < 2.25 <= |shift|: never a tie, so the sign of shift decides
                // which side of the kink the op is on, not rounding.
                earlier[k] = self.tame(earlier[k], 1.0);
                let t = self.pick();
                let b = self.tame(t, 1.0);
                let shift = self.rng.gen_range(2.25..3.0) * self.sign();
                Term {
                    value: b.value + shift,
                    lo: b.lo + shift,
                    hi: b.hi + shift,
                }
            }
        }
    }

    /// The next op, dealt from a shuffled deck of [`dealt_ops`] so every op appears once
    /// per deck; `powf` gets an exponent from [`EXPONENTS`].
    fn next_op(&mut self) -> Op {
        if self.deck.is_empty() {
            self.deck.extend(dealt_ops());
            self.deck.shuffle(self.rng);
        }
        match self.deck.pop().unwrap() {
            Op::Powf(_) => Op::Powf(*EXPONENTS.choose(self.rng).unwrap()),
            op => op,
        }
    }

    fn add_random_op(&mut self) {
        let op = self.next_op();
        if let Op::Const(_) = op {
            let term = self.constant(0.5, 3.0, true);
            self.push(term);
            return;
        }
        let arity = op.arity().unwrap_or_else(|| self.rng.gen_range(1..=5));
        let mut operands: Vec<Term<'g>> = Vec::with_capacity(arity);
        for i in 0..arity {
            let t = self.operand(op, i, &mut operands);
            operands.push(t);
        }
        let values: Vec<Value<'g>> = operands.iter().map(|t| t.value).collect();
        let value = self.graph.apply(op, &values).unwrap();
        let bound = magnitude_bound(op, &operands);
        self.push(Term::symmetric(value, bound));
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

/// A bound on `|op(x)|` over the box of `operands`' intervals, from the op's own formula
/// ([`Op::forward`]) at the box's corners and along its edges, with a margin. Exact for ops
/// monotone in each operand, and for abs (largest at a corner); sin's and cos's bumps lie
/// within 0.25 of a sample (operands within 4, 16 steps), where they are 3% lower at most:
/// the margin covers that, and a new op's bumps.
fn magnitude_bound(op: Op, operands: &[Term]) -> f64 {
    const STEPS: usize = 16;
    let n = operands.len();
    let mut max = 0.0f64;
    let mut point = vec![0.0; n];
    // Every corner, and every point STEPS apart along each operand's interval with the
    // others at a corner: at most 2^5 * (1 + 5 * 16) evaluations for a 5-operand sum.
    for corner in 0..1usize << n {
        for (i, t) in operands.iter().enumerate() {
            point[i] = if corner >> i & 1 == 0 { t.lo } else { t.hi };
        }
        max = max.max(op.forward(&mut F64, &point).abs());
        for (i, t) in operands.iter().enumerate() {
            let keep = point[i];
            for s in 1..STEPS {
                point[i] = t.lo + (t.hi - t.lo) * s as f64 / STEPS as f64;
                max = max.max(op.forward(&mut F64, &point).abs());
            }
            point[i] = keep;
        }
    }
    assert!(
        max.is_finite(),
        "{op:?} is not finite on its operands' domains"
    );
    max * 1.25 + 1e-3
}
