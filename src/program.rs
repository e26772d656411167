//! One execution API for every backend, so a training loop is written once.
//!
//! Users see [`Program`]; backends implement `Backend`, a trait in a private module, which
//! supplies the tape, the buffers and the passes (`run_forward`, `run_backward`,
//! `run_update`, and optionally `run_step`, `run_train`). Every method a user calls is
//! defined here once, on top of those hooks, with the checks that make misuse a typed error.
//!
//! # Why the hooks are sealed
//!
//! The hooks skip the checks (`run_train` trusts its lengths), write any slot (constants
//! included, which the JIT compiles to immediates) and may drop deferred gradients
//! (`begin_step`). So [`Program`] is implemented once, for every `Backend`, and does not
//! have `Backend` as a supertrait: a supertrait's methods would be callable through
//! `dyn Program` and `P: Program` even with the trait unnameable. Code outside the crate can
//! neither call a hook nor implement [`Program`]:
//!
//! ```compile_fail
//! # use tapejit::{Graph, Interpreter, Program};
//! # let g = Graph::new();
//! # g.set_loss(g.param(1.0) * 2.0).unwrap();
//! let mut interp = Interpreter::new(&g).unwrap();
//! let (values, _grads) = interp.buffers_mut(); // no such method: constants stay constant
//! ```
//!
//! ```compile_fail
//! # use tapejit::{Graph, Interpreter, Program};
//! # let g = Graph::new();
//! # g.set_loss(g.param(1.0) * 2.0).unwrap();
//! let mut interp = Interpreter::new(&g).unwrap();
//! let p: &mut dyn Program = &mut interp;
//! p.begin_step(); // no such method: deferred gradients cannot be dropped
//! ```
//!
//! ```compile_fail
//! # use tapejit::Program;
//! fn train_unchecked<P: Program>(p: &mut P) {
//!     p.run_train(&[1.0, 2.0, 3.0], 0.1); // no such method: `train` checks lengths
//! }
//! ```
//!
//! ```compile_fail
//! # use tapejit::Program;
//! fn forward_only(p: &mut dyn Program) {
//!     p.run_forward();
//! }
//! ```
//!
//! ```compile_fail
//! # use tapejit::Program;
//! fn backward_without_loss(p: &mut dyn Program) {
//!     p.run_backward();
//! }
//! ```
//!
//! ```compile_fail
//! # use tapejit::Program;
//! fn unchecked_update(p: &mut dyn Program) {
//!     p.run_update(f64::NAN);
//! }
//! ```
//!
//! ```compile_fail
//! # use tapejit::Program;
//! fn unchecked_step(p: &mut dyn Program) {
//!     p.run_step(0.1);
//! }
//! ```
//!
//! ```compile_fail
//! # use tapejit::{Program, Tape};
//! struct Mine;
//! impl Program for Mine {} // `Program` is sealed: only tapejit's backends implement it
//! ```

use crate::error::{Error, Result};
use crate::finite::all_finite;
use crate::graph::Value;
use crate::op::F64;
use crate::tape::{Slot, Tape};

pub(crate) use backend::Backend;

mod backend {
    use crate::tape::{Slot, Tape};

    /// What a backend supplies: its tape, its buffers and the passes over them. Crate-private
    /// (the module is private), so only this crate can implement or call it; the hooks
    /// assume what `Program`'s methods check.
    pub trait Backend {
        /// The tape being run.
        fn program_tape(&self) -> &Tape;
        /// The values buffer: one value per slot, or the backend's own layout of them (the
        /// JIT's: [`crate::plan::Buffers`]), which keeps params at `0..params_len` and the
        /// inputs side by side after them.
        fn value_buffer(&self) -> &[f64];
        /// Where the buffers hold param or input `s`.
        fn leaf_address(&self, s: Slot) -> usize {
            s.index()
        }
        /// Where the params end in the buffers (the addresses before hold params, and what
        /// else they hold is 0 and read by no code), and the inputs start, side by side.
        fn params_len(&self) -> usize {
            self.program_tape().num_params()
        }
        /// The gradients buffer, laid out as the values (a backend stores any it deferred
        /// before handing them out).
        fn grad_buffer(&self) -> &[f64];
        /// The value of kept slot `s`.
        fn value_at(&self, s: Slot) -> f64 {
            self.value_buffer()[s.index()]
        }
        /// The gradient of kept slot `s`.
        fn grad_at(&self, s: Slot) -> f64 {
            self.grad_buffer()[s.index()]
        }
        /// One value per slot, in slot order.
        fn slot_values(&self) -> &[f64] {
            self.value_buffer()
        }
        /// One gradient per slot, in slot order.
        fn slot_grads(&self) -> &[f64] {
            self.grad_buffer()
        }
        /// Whether the buffers hold `slot`'s value (and gradient, unless
        /// [`Backend::keeps_grad`] says otherwise); the interpreter keeps every slot.
        fn keeps(&self, slot: Slot) -> bool {
            let _ = slot;
            true
        }
        /// Whether the gradients buffer holds `slot`'s gradient (the JIT's local gradients
        /// live in registers, [`crate::plan::local`], and it adds into no constant's,
        /// [`Tape::takes_grad`]).
        fn keeps_grad(&self, slot: Slot) -> bool {
            self.keeps(slot)
        }
        /// Mutable views for `Program`'s methods, which write inputs, params and params'
        /// gradients only (the JIT compiles constants to immediates); lengths are fixed.
        fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]);

        /// Computes every value from the current inputs and params.
        fn run_forward(&mut self);
        /// Reverse-mode pass; only called when the tape has a loss.
        fn run_backward(&mut self);
        /// `p -= lr * grad` for every param; `lr` is finite.
        fn run_update(&mut self, lr: f64);
        /// Called right before `run_step`, which recomputes every gradient: a backend may
        /// drop state that `run_step` replaces (the JIT drops gradients it has not stored
        /// yet, sparing the work of storing them). Called from nowhere else.
        fn begin_step(&mut self) {}
        /// `zero_grad`, forward, backward, `update`, on inputs already written; only called
        /// when the tape has a loss and `lr` is finite. A backend may do it in one go (the
        /// JIT does), with the same results.
        fn run_step(&mut self, lr: f64) {
            let n = self.params_len();
            self.buffers_mut().1[..n].fill(0.0);
            self.run_forward();
            self.run_backward();
            self.run_update(lr);
        }
        /// `step` per sample on `inputs` (a whole number, at least one, of samples of the
        /// tape's width), with a finite `lr`, for a tape with a loss, until it meets a
        /// non-finite number: the error is a sample from which on one lies, all before it
        /// finite (the buffers are left as they are: `train` puts them back). A backend may
        /// do it in one go.
        fn run_train(&mut self, inputs: &[f64], lr: f64) -> Result<Vec<f64>, usize> {
            super::train_checking_chunks(self, inputs, lr)
        }
        /// Whether `run_train` may hand over to another tier between two samples (the JIT,
        /// while native code compiles): `train` then checks every input first, so that
        /// `run_train` cannot fail after the hand-over (the buffers `train` would put back
        /// are laid out as the tier before it had them).
        fn may_change_tier(&self) -> bool {
            false
        }
        /// Called before `run_train`: a backend may build what it runs (the JIT compiles
        /// `train` when it is first called). Fails only as compiling does.
        fn prepare_train(&mut self) -> crate::Result<()> {
            Ok(())
        }
        /// `train_minibatches` on checked arguments (`threads >= 1`; samples of the tape's
        /// width, at least one): the backend's `crate::minibatch::train`, which builds what
        /// the replicas run first.
        fn run_minibatches(
            &mut self,
            samples: &crate::Samples<'_>,
            batch: usize,
            lr: f64,
            threads: usize,
        ) -> crate::Result<Vec<f64>>;
        /// The optimizer and its state ([`crate::optim`]), over the params' addresses
        /// `0..params_len`. The hooks above update by plain SGD; `Program` applies any other.
        fn stepper(&self) -> &crate::optim::Stepper;
        fn stepper_mut(&mut self) -> &mut crate::optim::Stepper;
        /// Whether anomaly mode is on ([`crate::anomaly`]), and the switch.
        fn anomaly_mode(&self) -> bool;
        fn set_anomaly_mode(&mut self, on: bool);
    }

    /// `Program`'s supertrait: implemented for every `Backend` and nothing else.
    pub trait Sealed {}
    impl<B: Backend> Sealed for B {}
}

/// A compiled (or interpreted) tape with its buffers: the interpreter and the JIT both are one.
///
/// Semantics follow micrograd: `backward` sets the loss's gradient to 1 and accumulates
/// `grad += local * out_grad` in reverse tape order. Gradients of params accumulate across
/// `backward` calls until `zero_grad`; every other node's gradient is recomputed from 0 by
/// each `backward` (in micrograd those nodes are rebuilt fresh every step). As in micrograd,
/// a loss that is itself a param gets gradient 1, not an accumulated one.
///
/// Every backend produces bit-identical values and gradients, with one exception IEEE leaves
/// open: when two NaNs meet, which one comes out (its sign and payload) may differ.
///
/// The trait is sealed: tapejit's backends ([`crate::Interpreter`], [`crate::Jit`]) are its
/// only implementations, so every call goes through the checks below (the
/// [module docs](crate::program) show what that rules out). The buffers can be read
/// (`values`, `grads`) but written only through `set_inputs`, `set_params` and the passes, so
/// constants keep their values and the JIT's deferred gradients are always stored before
/// anyone reads them.
pub trait Program: backend::Sealed {
    /// The tape being run.
    fn tape(&self) -> &Tape;
    /// The value of every slot, as of the last `forward` (params and inputs as last set).
    /// Slots the program does not keep ([`Program::is_kept`]) hold no meaningful number;
    /// params sit in [`Tape::param_slots`] (use [`Program::params`] for creation order).
    fn values(&self) -> &[f64];
    /// The gradient of every slot, as of the last `backward`; the same caveats as `values`.
    fn grads(&self) -> &[f64];

    /// Sets the inputs, in the order they were created. Wrong length or a non-finite number is
    /// an error and leaves the inputs unchanged.
    fn set_inputs(&mut self, inputs: &[f64]) -> Result<()>;

    /// Runs forward and returns the loss; a graph with only outputs returns `NaN` here (read
    /// them with `outputs`; `loss()` tells the two cases apart).
    fn forward(&mut self) -> f64;

    /// The loss as of the last `forward`.
    fn loss(&self) -> Result<f64>;

    /// The outputs as of the last `forward`, in the order they were added.
    fn outputs(&self) -> Vec<f64>;

    /// Zeroes the params' gradients, as micrograd's `Module.zero_grad` does. Every other
    /// gradient is recomputed from 0 by each `backward`, so zeroing it here would be work
    /// thrown away (on an MLP, as much memory traffic as the update).
    fn zero_grad(&mut self);

    /// Reverse-mode differentiation of the loss at the values of the last `forward`.
    fn backward(&mut self) -> Result<()>;

    /// One update with learning rate `lr` by the program's optimizer: plain SGD
    /// (`p -= lr * grad`) unless [`Program::set_optimizer`] chose another. A NaN or infinite
    /// `lr` is [`Error::NonFiniteLearningRate`] and changes nothing.
    fn update(&mut self, lr: f64) -> Result<()>;

    /// One per-sample step: set inputs, zero_grad, forward, backward, update. Returns the
    /// loss before the update. Checked as `set_inputs` and `update` are; a failed step
    /// changes nothing.
    fn step(&mut self, inputs: &[f64], lr: f64) -> Result<f64>;

    /// Makes `optimizer` the one `update`, `step`, `train` and `train_minibatches` use, from
    /// its first step (fresh state: moments 0, no steps). Plain SGD (the default) is what
    /// the JIT fuses into its steps; any other runs after each backward pass, the same code
    /// on every backend ([`crate::optim`]). Hyperparameters PyTorch would refuse are
    /// [`Error::Optimizer`] and change nothing.
    fn set_optimizer(&mut self, optimizer: crate::optim::Optimizer) -> Result<()>;

    /// The optimizer `update` and the steps use.
    fn optimizer(&self) -> crate::optim::Optimizer;

    /// The optimizer's state: steps taken and its buffers, in the params' creation order
    /// (what a checkpoint saves).
    fn optimizer_state(&self) -> crate::optim::State;

    /// Anomaly mode, off by default (as `torch.autograd.detect_anomaly`): `backward`,
    /// `step` and `train` then check every value and gradient after the passes and, if one
    /// is not finite, fail with [`Error::Anomaly`] naming the first node that made it (graph
    /// node, op, operands; [`crate::anomaly`]) before any update (a param an update made
    /// non-finite is named as such at the next step). Each check reads every value and
    /// gradient as the interpreter computes them, and `step` runs unfused: slower, for
    /// finding where a NaN comes from. `train_minibatches` does not check.
    fn detect_anomaly(&mut self, on: bool);

    /// Replaces the optimizer's state (from [`Program::optimizer_state`] or a checkpoint).
    /// Buffers other than the optimizer's, of another length, or holding a non-finite
    /// number are [`Error::Optimizer`] and change nothing.
    fn set_optimizer_state(&mut self, state: &crate::optim::State) -> Result<()>;

    /// Trains on `inputs`, one sample after the other (`num_inputs` numbers each): a `step`
    /// per sample, with the same results. Returns each step's loss. A length that is not a
    /// whole number of samples, no samples, or a graph without inputs is
    /// [`Error::WrongLength`]; a non-finite input is [`Error::NonFinite`] (the first one);
    /// and a failed call changes nothing. (Few samples are all checked before the first
    /// step; many, each just before its step reads it, and the buffers are put back if one
    /// fails: an epoch of inputs then streams from memory once, not twice.) The JIT runs a
    /// first layer's weight update and the next sample's forward through it in one pass over
    /// its weights (`plan/step.rs`, `plan/first_layer/`).
    fn train(&mut self, inputs: &[f64], lr: f64) -> Result<Vec<f64>>;

    /// Minibatch SGD: `inputs` (a whole number of samples, as `train` takes them) in
    /// minibatches of `batch` samples (the last may be smaller), each moving every param by
    /// `(lr / m) * g`, `g` the sum of its `m` samples' gradients (`lr` times their mean), on
    /// `threads` threads (0: one per core; never more than one per core).
    /// Returns each sample's loss (before its minibatch's update). The order of additions is
    /// fixed and the interpreter follows it too, so every backend and every thread count
    /// gives the same bits: chunks of [`crate::minibatch::CHUNK`] samples, each summing its
    /// samples' gradients as `backward` accumulates them, are added in chunk order
    /// (`crate::minibatch` has the details). Afterwards values and gradients are the last
    /// sample's, except that params' gradients are the last minibatch's mean gradient.
    /// Checked as `train` is; `batch` 0 is [`Error::EmptyMinibatch`].
    fn train_minibatches(
        &mut self,
        inputs: &[f64],
        batch: usize,
        lr: f64,
        threads: usize,
    ) -> Result<Vec<f64>>;

    /// `train` on samples as they are stored ([`crate::Samples`]: bytes, `f32`, labels, a
    /// row order over a dataset), converted to the graph's inputs inside the call a few
    /// samples at a time, each right before its step reads it: no converted copy of the
    /// epoch, and the same steps and bits as `train` on the converted numbers. Samples of
    /// another width than the graph's inputs, or none, are [`Error::WrongLength`]; a
    /// non-finite `f64` or `f32` input is [`Error::NonFinite`] (its index among the
    /// converted numbers), found before the first step; a failed call changes nothing.
    fn train_from(&mut self, samples: &crate::Samples<'_>, lr: f64) -> Result<Vec<f64>>;

    /// `train_minibatches` on samples as they are stored, converted inside the call by the
    /// thread that reads them (each thread converts the inputs it runs); checked as
    /// [`Program::train_from`] is, with the same bits as `train_minibatches` on the
    /// converted numbers.
    fn train_minibatches_from(
        &mut self,
        samples: &crate::Samples<'_>,
        batch: usize,
        lr: f64,
        threads: usize,
    ) -> Result<Vec<f64>>;

    /// The params, in the order they were created.
    fn params(&self) -> Vec<f64>;

    /// Overwrites every param, given in the order they were created. Wrong length or a
    /// non-finite number is an error and leaves the params unchanged.
    fn set_params(&mut self, params: &[f64]) -> Result<()>;

    /// The params' gradients, in the order the params were created.
    fn param_grads(&self) -> Vec<f64>;

    /// Whether this program stores `slot`'s value and gradient in its buffers. The
    /// interpreter keeps every slot; the JIT all but the products it fuses into sums, and
    /// the intermediate results of a nest's repetition (a rollout step's, a batch copy's
    /// loss terms) whose every gradient addition comes from the same repetition: their
    /// gradients live in registers, and their values too where only the same repetition
    /// reads them and no derivative does. Nor does it keep the gradient of a constant that
    /// is neither an output nor the loss, which feeds nothing (`Tape::takes_grad`).
    fn is_kept(&self, slot: Slot) -> bool;

    /// Every slot's value and gradient as of the last `forward` and `backward`, those this
    /// program does not keep recomputed from the kept ones, bit for bit as the interpreter
    /// computes them: what a caller that shows every node (as micrograd does) reads. Only
    /// while the params are those `forward` saw (the recomputed values use the params as
    /// they are; after `update` or `step` the interpreter's still show the old ones).
    fn every_value_and_grad(&self) -> (Vec<f64>, Vec<f64>);

    /// The value of `v` as of the last `forward` ([`Error::NotKept`] if the buffers do not
    /// hold it: [`Program::every_value_and_grad`] has every value).
    fn value(&self, v: Value<'_>) -> Result<f64>;

    /// The gradient of `v` as of the last `backward` (0 for nodes the loss does not depend
    /// on, and for inputs made without gradient unless one is the loss itself);
    /// [`Error::NotKept`] unless [`Program::is_kept`].
    fn grad(&self, v: Value<'_>) -> Result<f64>;

    /// The slot of `v`, if this program keeps its value and gradient.
    fn kept_slot(&self, v: Value<'_>) -> Result<Slot>;
}

impl<B: Backend> Program for B {
    fn tape(&self) -> &Tape {
        self.program_tape()
    }

    fn values(&self) -> &[f64] {
        self.slot_values()
    }

    fn grads(&self) -> &[f64] {
        self.slot_grads()
    }

    fn set_inputs(&mut self, inputs: &[f64]) -> Result<()> {
        check_inputs(self.tape(), inputs)?;
        // (The inputs lie side by side right after the params.)
        let base = self.params_len();
        self.buffers_mut().0[base..base + inputs.len()].copy_from_slice(inputs);
        Ok(())
    }

    fn forward(&mut self) -> f64 {
        self.run_forward();
        self.loss().unwrap_or(f64::NAN)
    }

    fn loss(&self) -> Result<f64> {
        let l = self.tape().loss().ok_or(Error::NoLoss)?;
        Ok(self.value_at(l))
    }

    fn outputs(&self) -> Vec<f64> {
        let outputs = self.tape().outputs();
        outputs.iter().map(|&s| self.value_at(s)).collect()
    }

    fn zero_grad(&mut self) {
        let n = self.params_len();
        self.buffers_mut().1[..n].fill(0.0);
    }

    fn backward(&mut self) -> Result<()> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        self.run_backward();
        check_anomalies(self)
    }

    fn update(&mut self, lr: f64) -> Result<()> {
        check_learning_rate(lr)?;
        checked_update(self, lr);
        Ok(())
    }

    fn step(&mut self, inputs: &[f64], lr: f64) -> Result<f64> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        check_inputs(self.tape(), inputs)?;
        check_learning_rate(lr)?;
        if self.anomaly_mode() {
            return step_checking_anomalies(self, inputs, lr);
        }
        Ok(checked_step(self, inputs, lr))
    }

    fn train(&mut self, inputs: &[f64], lr: f64) -> Result<Vec<f64>> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        check_samples(self.tape(), inputs)?;
        check_learning_rate(lr)?;
        train_inputs(self, inputs, lr, false)
    }

    fn train_minibatches(
        &mut self,
        inputs: &[f64],
        batch: usize,
        lr: f64,
        threads: usize,
    ) -> Result<Vec<f64>> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        check_samples(self.tape(), inputs)?;
        let width = self.tape().num_inputs();
        let samples = crate::Samples::new().numbers(inputs, width)?;
        minibatches(self, &samples, batch, lr, threads)
    }

    fn train_from(&mut self, samples: &crate::Samples<'_>, lr: f64) -> Result<Vec<f64>> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        check_sample_width(self.tape(), samples)?;
        if let Some(inputs) = samples.as_numbers() {
            return self.train(inputs, lr);
        }
        check_learning_rate(lr)?;
        samples.check_finite()?;
        // A chunk converted, then trained on while in cache.
        let (n, width) = (samples.len(), samples.width());
        let per_chunk = (CONVERTED_CHUNK_NUMBERS / width).max(1);
        let mut converted = vec![0.0; per_chunk.min(n) * width];
        let mut losses = Vec::with_capacity(n);
        for start in (0..n).step_by(per_chunk) {
            let chunk = start..(start + per_chunk).min(n);
            let inputs = &mut converted[..chunk.len() * width];
            samples.fill(chunk, inputs);
            losses.extend(train_inputs(self, inputs, lr, true)?);
        }
        Ok(losses)
    }

    fn train_minibatches_from(
        &mut self,
        samples: &crate::Samples<'_>,
        batch: usize,
        lr: f64,
        threads: usize,
    ) -> Result<Vec<f64>> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        check_sample_width(self.tape(), samples)?;
        if samples.as_numbers().is_none() {
            // (The threads check the numbers they read; converted ones, here.)
            samples.check_finite()?;
        }
        minibatches(self, samples, batch, lr, threads)
    }

    fn set_optimizer(&mut self, optimizer: crate::optim::Optimizer) -> Result<()> {
        optimizer.check().map_err(|problem| Error::Optimizer {
            optimizer: optimizer.name(),
            problem,
        })?;
        let len = self.params_len();
        *self.stepper_mut() = crate::optim::Stepper::new(optimizer, len);
        Ok(())
    }

    fn detect_anomaly(&mut self, on: bool) {
        self.set_anomaly_mode(on);
    }

    fn optimizer(&self) -> crate::optim::Optimizer {
        self.stepper().optimizer
    }

    fn optimizer_state(&self) -> crate::optim::State {
        let addresses = param_addresses(self);
        self.stepper().state(addresses.len(), |k| addresses[k])
    }

    fn set_optimizer_state(&mut self, state: &crate::optim::State) -> Result<()> {
        let addresses = param_addresses(self);
        let optimizer = self.stepper().optimizer;
        self.stepper_mut()
            .set_state(state, addresses.len(), |k| addresses[k])
            .map_err(|problem| Error::Optimizer {
                optimizer: optimizer.name(),
                problem,
            })
    }

    fn params(&self) -> Vec<f64> {
        in_creation_order(self, self.value_buffer())
    }

    fn set_params(&mut self, params: &[f64]) -> Result<()> {
        let n = self.tape().num_params();
        if params.len() != n {
            return Err(Error::WrongLength {
                what: "params",
                expected: n,
                got: params.len(),
            });
        }
        check_finite("param", params)?;
        let addresses = param_addresses(self);
        let values = self.buffers_mut().0;
        for (a, &p) in addresses.into_iter().zip(params) {
            values[a] = p;
        }
        Ok(())
    }

    fn param_grads(&self) -> Vec<f64> {
        in_creation_order(self, self.grad_buffer())
    }

    fn is_kept(&self, slot: Slot) -> bool {
        slot.index() < self.tape().len() && self.keeps(slot) && self.keeps_grad(slot)
    }

    fn every_value_and_grad(&self) -> (Vec<f64>, Vec<f64>) {
        let tape = self.tape();
        let (mut values, mut grads) = (self.values().to_vec(), self.grads().to_vec());
        let missing: Vec<bool> = tape.slots().map(|s| !self.keeps_grad(s)).collect();
        if !missing.contains(&true) {
            return (values, grads);
        }
        let mut operands = Vec::new();
        for s in tape.slots().filter(|s| missing[s.index()]) {
            if !self.keeps(s) {
                operands.clear();
                operands.extend(tape.args(s).iter().map(|a| values[a.index()]));
                values[s.index()] = tape.op(s).forward(&mut F64, &operands);
            }
            grads[s.index()] = 0.0;
        }
        // The interpreter's backward for the missing slots' gradients: from 0, each
        // consumer's local gradient in reverse slot order (a consumer's own gradient is
        // final by then: all of its consumers come after it).
        let mut local = Vec::new();
        for s in tape.slots().rev() {
            let (op, args) = (tape.op(s), tape.args(s));
            let feeds_missing = args.iter().any(|a| missing[a.index()]);
            if op.is_leaf() || !tape.needs_grad(s) || !feeds_missing {
                continue;
            }
            operands.clear();
            operands.extend(args.iter().map(|a| values[a.index()]));
            let (out, g) = (values[s.index()], grads[s.index()]);
            op.local_grads(&mut F64, &operands, out, g, &mut local);
            for (a, d) in args.iter().zip(&local) {
                if missing[a.index()] && tape.needs_grad(a) {
                    grads[a.index()] += d;
                }
            }
        }
        (values, grads)
    }

    fn value(&self, v: Value<'_>) -> Result<f64> {
        let slot = self.tape().slot(v)?;
        match self.keeps(slot) {
            true => Ok(self.value_at(slot)),
            false => Err(Error::NotKept { node: v.id() }),
        }
    }

    fn grad(&self, v: Value<'_>) -> Result<f64> {
        Ok(self.grad_at(self.kept_slot(v)?))
    }

    fn kept_slot(&self, v: Value<'_>) -> Result<Slot> {
        let slot = self.tape().slot(v)?;
        if self.is_kept(slot) {
            Ok(slot)
        } else {
            Err(Error::NotKept { node: v.id() })
        }
    }
}

/// `train` on checked samples `inputs` (a tape with a loss, a finite `lr`), known to be
/// finite or not.
fn train_inputs<B: Backend>(b: &mut B, inputs: &[f64], lr: f64, finite: bool) -> Result<Vec<f64>> {
    let width = b.program_tape().num_inputs();
    let check = |inputs: &[f64]| match finite {
        true => Ok(()),
        false => check_finite("input", inputs),
    };
    if b.anomaly_mode() {
        check(inputs)?;
        // A failed call changes nothing: the buffers and the optimizer's state put back
        // where a later sample's step meets an anomaly.
        let before = Saved::of(b);
        let steps = inputs.chunks_exact(width);
        let trained: Result<Vec<f64>> = steps.map(|x| step_checking_anomalies(b, x, lr)).collect();
        if trained.is_err() {
            before.put_back(b);
        }
        return trained;
    }
    if !b.stepper().optimizer.is_plain() {
        // A backend's own `train` updates by plain SGD.
        check(inputs)?;
        return Ok(step_per_sample(b, inputs, lr));
    }
    b.prepare_train()?;
    // Values and gradients, laid out alike.
    let state = 2 * b.value_buffer().len();
    if finite || inputs.len() < CHECK_AS_YOU_GO_FROM * state || b.may_change_tier() {
        // Checked first: cheap while the inputs are few (and so in cache).
        check(inputs)?;
        return b
            .run_train(inputs, lr)
            .map_err(|sample| Error::non_finite_input(inputs, sample * width));
    }
    // Checked as the steps reach them, and the buffers put back if one is not finite:
    // one pass over the inputs instead of two. (A 60,000-sample epoch of MNIST is 376 MB
    // of inputs: the separate check cost 0.4-0.8 us per sample to stream them twice.)
    let before = Saved::of(b);
    b.run_train(inputs, lr).map_err(|sample| {
        before.put_back(b);
        Error::non_finite_input(inputs, sample * width)
    })
}

/// A backend's buffers and optimizer state, to put back where a `train` fails mid-way.
struct Saved {
    values: Vec<f64>,
    grads: Vec<f64>,
    stepper: crate::optim::Stepper,
}

impl Saved {
    fn of<B: Backend>(b: &B) -> Saved {
        Saved {
            values: b.value_buffer().to_vec(),
            grads: b.grad_buffer().to_vec(),
            stepper: b.stepper().clone(),
        }
    }

    fn put_back<B: Backend>(self, b: &mut B) {
        let (values, grads) = b.buffers_mut();
        values.copy_from_slice(&self.values);
        grads.copy_from_slice(&self.grads);
        *b.stepper_mut() = self.stepper;
    }
}

/// `train_minibatches` on `samples` of the tape's width (a tape with a loss).
fn minibatches<B: Backend>(
    b: &mut B,
    samples: &crate::Samples<'_>,
    batch: usize,
    lr: f64,
    threads: usize,
) -> Result<Vec<f64>> {
    if batch == 0 {
        return Err(Error::EmptyMinibatch);
    }
    check_learning_rate(lr)?;
    // At most one per core: more never runs faster (any count gives the same bits), and
    // each thread keeps a copy of the buffers (100,000 asked for ran out of memory).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = match threads {
        0 => cores,
        n => n.min(cores),
    };
    b.run_minibatches(samples, batch, lr, threads)
}

/// [`Backend::run_train`] as a backend that trains sample by sample runs it: each chunk of
/// about [`CHECKED_CHUNK_NUMBERS`] inputs checked, then stepped on while still in cache; a
/// chunk holding a non-finite number is the error (its first sample).
pub(crate) fn train_checking_chunks<B: Backend + ?Sized>(
    b: &mut B,
    inputs: &[f64],
    lr: f64,
) -> std::result::Result<Vec<f64>, usize> {
    let width = b.program_tape().num_inputs().max(1);
    let chunk = (CHECKED_CHUNK_NUMBERS / width).max(1);
    let mut losses = Vec::with_capacity(inputs.len() / width);
    for (k, part) in inputs.chunks(chunk * width).enumerate() {
        if !all_finite(part) {
            return Err(k * chunk);
        }
        losses.extend(step_per_sample(b, part, lr));
    }
    Ok(losses)
}

/// `step` on each sample of checked `inputs`, returning the losses `step` would.
pub(crate) fn step_per_sample<B: Backend + ?Sized>(b: &mut B, inputs: &[f64], lr: f64) -> Vec<f64> {
    let width = b.program_tape().num_inputs();
    if width == 0 {
        // `train` refuses a graph without inputs: there is no sample to step on.
        return Vec::new();
    }
    inputs
        .chunks_exact(width)
        .map(|x| checked_step(b, x, lr))
        .collect()
}

/// `step` on inputs already checked (one sample, a finite `lr`): the loss before the update,
/// `NaN` for a tape without a loss (which `step` and `train` refuse before coming here).
fn checked_step<B: Backend + ?Sized>(b: &mut B, inputs: &[f64], lr: f64) -> f64 {
    let Some(loss) = b.program_tape().loss() else {
        return f64::NAN;
    };
    let plain = b.stepper().optimizer.is_plain();
    if plain {
        b.begin_step();
    }
    let base = b.params_len();
    b.buffers_mut().0[base..base + inputs.len()].copy_from_slice(inputs);
    // The update changes params only, so a computed loss is still in the buffers
    // afterwards; a leaf loss (a param) is read before.
    let before = b.value_at(loss);
    if plain {
        b.run_step(lr);
    } else {
        b.buffers_mut().1[..base].fill(0.0);
        b.run_forward();
        b.run_backward();
        checked_update(b, lr);
    }
    if b.program_tape().op(loss).is_leaf() {
        before
    } else {
        b.value_at(loss)
    }
}

/// Where `b`'s buffers hold each param, in creation order.
fn param_addresses<B: Backend + ?Sized>(b: &B) -> Vec<usize> {
    let slots = b.program_tape().param_slots();
    slots.iter().map(|&s| b.leaf_address(s)).collect()
}

/// In anomaly mode, the first node that made a non-finite value or gradient, if any.
fn check_anomalies<B: Backend>(b: &B) -> Result<()> {
    if !b.anomaly_mode() {
        return Ok(());
    }
    let (values, grads) = b.every_value_and_grad();
    crate::anomaly::check(b.program_tape(), &values, Some(&grads))
}

/// `step` in anomaly mode (one checked sample, a finite `lr`, a tape with a loss): the
/// passes one by one, checked before the update.
fn step_checking_anomalies<B: Backend>(b: &mut B, inputs: &[f64], lr: f64) -> Result<f64> {
    let loss = b.program_tape().loss().ok_or(Error::NoLoss)?;
    let base = b.params_len();
    let (values, grads) = b.buffers_mut();
    values[base..base + inputs.len()].copy_from_slice(inputs);
    grads[..base].fill(0.0);
    let before = b.value_at(loss);
    b.run_forward();
    b.run_backward();
    check_anomalies(b)?;
    let after = b.value_at(loss);
    checked_update(b, lr);
    Ok(if b.program_tape().op(loss).is_leaf() {
        before
    } else {
        after
    })
}

/// `update` with a finite `lr`: the backend's own for plain SGD, else the optimizer's.
fn checked_update<B: Backend + ?Sized>(b: &mut B, lr: f64) {
    if b.stepper().optimizer.is_plain() {
        return b.run_update(lr);
    }
    let n = b.params_len();
    let mut stepper = std::mem::take(b.stepper_mut());
    let (values, grads) = b.buffers_mut();
    stepper.step(lr, &mut values[..n], &grads[..n]);
    *b.stepper_mut() = stepper;
}

/// A learning rate that would turn every param into NaN or infinity is refused.
fn check_learning_rate(lr: f64) -> Result<()> {
    if lr.is_finite() {
        Ok(())
    } else {
        Err(Error::NonFiniteLearningRate { value: lr })
    }
}

/// The params' entries of `buf` (one of `b`'s buffers), in the order the params were
/// created.
fn in_creation_order<B: Backend + ?Sized>(b: &B, buf: &[f64]) -> Vec<f64> {
    let slots = b.program_tape().param_slots();
    slots.iter().map(|&s| buf[b.leaf_address(s)]).collect()
}

/// `train` checks its inputs as its steps reach them (restoring the buffers if one is not
/// finite) when they hold at least this many times as many numbers as the buffers it would
/// restore; below that, all before the first step.
const CHECK_AS_YOU_GO_FROM: usize = 4;

/// About how many input numbers a backend that checks as it goes checks, then trains on
/// ([`train_checking_chunks`]; 512 KB, which stay in cache from the check to the steps).
const CHECKED_CHUNK_NUMBERS: usize = 1 << 16;

/// About how many inputs `train_from` converts before training on them (512 KB: they stay
/// in L2 from the conversion to the steps; chunks of 256 KB and 1 MB ran MNIST's
/// per-sample SGD about as fast, of 64 KB 0.2 us per sample slower).
const CONVERTED_CHUNK_NUMBERS: usize = 1 << 16;

/// That `samples` are at least one, each as wide as `tape`'s inputs.
fn check_sample_width(tape: &Tape, samples: &crate::Samples<'_>) -> Result<()> {
    let width = tape.num_inputs();
    if samples.width() != width || width == 0 {
        return Err(Error::WrongLength {
            what: "inputs per sample",
            expected: width.max(1),
            got: samples.width(),
        });
    }
    if samples.is_empty() {
        return Err(Error::WrongLength {
            what: "training inputs (at least one sample)",
            expected: width,
            got: 0,
        });
    }
    Ok(())
}

/// That `inputs` is a whole number, at least one, of samples of `tape`'s width.
fn check_samples(tape: &Tape, inputs: &[f64]) -> Result<()> {
    let width = tape.num_inputs();
    if width == 0 || inputs.is_empty() || inputs.len() % width != 0 {
        return Err(Error::WrongLength {
            what: "training inputs (a whole number of samples)",
            expected: width.max(1) * (inputs.len() / width.max(1)).max(1),
            got: inputs.len(),
        });
    }
    Ok(())
}

/// The checks of `set_inputs`: one finite number per input.
fn check_inputs(tape: &Tape, inputs: &[f64]) -> Result<()> {
    let n = tape.num_inputs();
    if inputs.len() != n {
        return Err(Error::WrongLength {
            what: "inputs",
            expected: n,
            got: inputs.len(),
        });
    }
    check_finite("input", inputs)
}

fn check_finite(what: &'static str, xs: &[f64]) -> Result<()> {
    if all_finite(xs) {
        return Ok(());
    }
    match xs.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        Some((index, &value)) => Err(Error::NonFinite { what, index, value }),
        None => Ok(()),
    }
}
