//! The kernel tier: a tape run as *runs* of one op each, ready at once.
//!
//! The JIT's first tier ([`crate::Jit`] runs it while LLVM compiles the requested level).
//! Preparation is linear in the tape, a few hundred nanoseconds per node: it reorders the
//! operations (any topological order computes the same values) into long runs of one op,
//! greedily (of the operations whose operands are ready, the op with most of them, and every
//! one that becomes ready while it runs), and lays out operand-index tables. A pass then runs
//! each run as one loop of that op's formula over gathered operands: the dispatch that picks
//! the formula happens once per run, not per node, so it is predicted, and the loop stays in
//! the instruction cache where straight-line machine code of 50k nodes streams through L2.
//! The buffers hold one value and one gradient per slot, renumbered so that each run writes
//! consecutive entries (params and inputs keep their slots, where `Program` writes them);
//! slot-order views are made on demand. A softmax written in scalars runs as one unit
//! ([`fused`]). `docs/design.md#kernels-the-first-tier` says why.
//!
//! **Bit for bit** what [`crate::Interpreter`] computes: every value and local gradient comes
//! from [`Op::forward`] and [`Op::local_grads_into`] over [`F64`], and each gradient adds its
//! contributions in the interpreter's order (consumers by descending slot, a consumer's
//! operands in operand order). Where a target's consumers run in backward in that order
//! anyway, backward adds into its gradient directly ("pushed"). For the others ("pulled"),
//! each contribution goes to an entry of its own in a contributions area after the
//! gradients, laid out per target in the interpreter's order, and the target's gradient is
//! `((0 + c1) + c2) + ...` over it, summed just before its own local gradients are computed
//! (all its consumers ran before it in backward), or at the end for leaves. An entry holds
//! `0 + c` rather than `c` (the area is zeroed, then added into): the two differ only for
//! `c = -0`, and `acc + (+0)` equals `acc + (-0)` unless `acc` is `-0`, which a sum starting
//! at `+0` (or at the loss's 1, or a param's accumulated gradient, itself such a sum) never
//! is under round-to-nearest. Operands without a gradient receive into a sink entry.

mod fused;
mod lanes;
mod prepare;
mod run;
mod schedule;

use crate::aligned::AlignedBuf;
use crate::minibatch::Workspace;
use crate::op::Op;
use crate::tape::Tape;

/// Operations `start..end` of the run order, all computing `body`.
#[derive(Clone, Copy, Debug)]
struct Run {
    body: Body,
    start: u32,
    end: u32,
}

/// What a run computes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Body {
    /// One op (exponents included) per operation.
    Op(Op),
    /// Instances of a pattern ([`fused`]), each `pattern.len()` operations.
    Fused(fused::Pattern),
}

/// A tape prepared as kernel runs, with its value and gradient buffers.
pub(crate) struct Kernels {
    runs: Vec<Run>,
    /// The runs backward walks (operations that need a gradient): the first ones.
    backward_runs: usize,
    /// Operation `j` of the run order writes entry `first_op + j` of the buffers; leaves
    /// come before, params and inputs at their slots.
    first_op: usize,
    /// Per slot: its entry in the buffers.
    index: Vec<u32>,
    /// The buffers in slot order, made when first asked for since the last change.
    slot_order: std::sync::OnceLock<(Vec<f64>, Vec<f64>)>,
    /// Per operation: its operands' entries, `args[arg_start[j]..arg_start[j + 1]]`.
    arg_start: Vec<u32>,
    args: Vec<u32>,
    /// Per operand of a backward operation (parallel to `args`): the gradient entry its
    /// contribution is added into (its slot, an entry of the contributions area, or the sink).
    dst: Vec<u32>,
    /// Per backward operation `j`: its pulled contributions, `grads[pull[j]..pull[j + 1]]`.
    pull: Vec<u32>,
    /// Pulled leaves: (slot, range of contributions).
    leaf_pulls: Vec<(u32, u32, u32)>,
    values: Vec<f64>,
    /// One entry per slot, then the contributions area, then the sink.
    grads: Vec<f64>,
    num_params: usize,
    num_inputs: usize,
    loss: Option<usize>,
    stats: KernelStats,
    workspace: Workspace,
}

/// The shape of a prepared tape.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct KernelStats {
    /// Operations, and the runs of one op they form.
    pub ops: usize,
    pub runs: usize,
    /// Gradient contributions (edges backward adds along), and those pulled.
    pub edges: usize,
    pub pulled_edges: usize,
    /// Pattern instances run fused ([`fused`]), and the operations they hold.
    pub fused: usize,
    pub fused_ops: usize,
}

impl Kernels {
    /// Prepares `tape`; the buffers start as a fresh program's.
    pub fn new(tape: &Tape) -> Kernels {
        let stored;
        let tape = match tape.copies() {
            // (Copies stored once are expanded: every operation gets its own records.)
            Some(_) => {
                stored = tape.clone().without_copies();
                &stored
            }
            None => tape,
        };
        prepare::prepare(tape)
    }

    pub fn stats(&self) -> KernelStats {
        self.stats
    }

    /// The values buffer: params and inputs at their slots, as `Program` expects, the
    /// others where the runs write them.
    pub fn values(&self) -> &[f64] {
        &self.values
    }

    /// The gradients buffer, laid out as the values.
    pub fn grads(&self) -> &[f64] {
        &self.grads[..self.values.len()]
    }

    /// Slot `s`'s entry in the buffers.
    pub fn address(&self, s: crate::tape::Slot) -> usize {
        self.index[s.index()] as usize
    }

    /// The values and gradients in slot order.
    pub fn in_slot_order(&self) -> &(Vec<f64>, Vec<f64>) {
        self.slot_order.get_or_init(|| {
            let at = |buffer: &[f64]| self.index.iter().map(|&i| buffer[i as usize]).collect();
            (at(&self.values), at(self.grads()))
        })
    }

    pub fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]) {
        self.slot_order.take();
        let n = self.values.len();
        (&mut self.values, &mut self.grads[..n])
    }

    /// `p -= lr * grad` for every param.
    pub fn update(&mut self, lr: f64) {
        self.slot_order.take();
        let n = self.num_params;
        for (p, g) in self.values[..n].iter_mut().zip(&self.grads[..n]) {
            *p -= lr * g;
        }
    }

    /// `zero_grad`, forward, backward, `update`, as [`crate::Program::step`] on inputs
    /// already written.
    pub fn step(&mut self, lr: f64) {
        let n = self.num_params;
        self.grads[..n].fill(0.0);
        self.forward();
        self.backward();
        self.update(lr);
    }

    /// What minibatch calls keep.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// A copy of the prepared tape with buffers of its own, starting from `values`, for a
    /// minibatch's worker ([`crate::minibatch::Replica`]).
    pub fn replica(&self) -> KernelReplica<'_> {
        KernelReplica {
            kernels: self,
            values: self.values.clone(),
            grads: vec![0.0; self.grads.len()],
        }
    }
}

/// A worker's buffers over a shared prepared tape ([`Kernels::replica`]).
pub(crate) struct KernelReplica<'k> {
    kernels: &'k Kernels,
    values: Vec<f64>,
    grads: Vec<f64>,
}

impl crate::minibatch::Replica for KernelReplica<'_> {
    fn values_mut(&mut self) -> &mut [f64] {
        &mut self.values
    }
    fn into_values(self: Box<Self>) -> AlignedBuf {
        AlignedBuf::from_slice(&self.values)
    }
    fn accumulate(&mut self, inputs: &[f64], losses: &mut [f64], grads: &mut [f64]) {
        let k = self.kernels;
        let (p, loss) = (k.num_params, k.loss.expect("a loss"));
        // (Inputs lie right after the params.)
        let base = p;
        self.grads[..p].fill(0.0);
        let w = k.num_inputs;
        for (i, l) in losses.iter_mut().enumerate() {
            let x = &inputs[i * w..(i + 1) * w];
            self.values[base..base + x.len()].copy_from_slice(x);
            run::forward(k, &mut self.values);
            *l = self.values[loss];
            run::backward(k, &self.values, &mut self.grads);
        }
        // (The params' gradients summed over the samples, the others the last sample's.)
        let n = grads.len();
        grads.copy_from_slice(&self.grads[..n]);
    }
}

impl Kernels {
    /// Every operation's value, run by run.
    pub fn forward(&mut self) {
        self.slot_order.take();
        let mut values = std::mem::take(&mut self.values);
        run::forward(self, &mut values);
        self.values = values;
    }

    /// Gradients from the loss's (params' accumulate), runs in reverse.
    pub fn backward(&mut self) {
        self.slot_order.take();
        let mut grads = std::mem::take(&mut self.grads);
        run::backward(self, &self.values, &mut grads);
        self.grads = grads;
    }
}

/// Steps `graph` (inputs first, then the rest of its tape) on the kernel tier and on the
/// interpreter three times: values and gradients the same bits after each. The prepared
/// tier, for its stats.
#[cfg(test)]
fn assert_steps_like_the_interpreter(graph: &crate::graph::Graph, inputs: &[f64]) -> Kernels {
    use crate::interp::Interpreter;
    use crate::program::Program;
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let tape = Tape::from_graph(graph).unwrap();
    let mut interp = Interpreter::new(graph).unwrap();
    let mut kernels = Kernels::new(&tape);
    for _ in 0..3 {
        interp.set_inputs(inputs).unwrap();
        interp.forward();
        interp.backward().unwrap();
        kernels.buffers_mut().0[tape.input_base()..][..inputs.len()].copy_from_slice(inputs);
        kernels.forward();
        kernels.backward();
        let (values, grads) = kernels.in_slot_order();
        assert_eq!(bits(values), bits(interp.values()));
        assert_eq!(bits(grads), bits(interp.grads()));
        interp.update(0.1).unwrap();
        kernels.update(0.1);
    }
    kernels
}
