//! One execution API for every backend, so a training loop is written once.
//!
//! A backend provides its tape, its value and gradient buffers, and the three passes
//! (`run_forward`, `run_backward`, `run_update`); everything a user calls is defined here on
//! top of them, with the checks that make misuse a typed error.

use crate::error::{Error, Result};
use crate::graph::Value;
use crate::tape::{Slot, Tape};

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
pub trait Program {
    /// The tape being run.
    fn tape(&self) -> &Tape;
    /// The value of every slot, as of the last `forward` (params and inputs as last set).
    fn values(&self) -> &[f64];
    /// The gradient of every slot, as of the last `backward`.
    fn grads(&self) -> &[f64];
    /// Mutable views for the provided methods; lengths are fixed.
    fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]);

    /// Computes every value from the current inputs and params.
    fn run_forward(&mut self);
    /// Reverse-mode pass; only called when the tape has a loss.
    fn run_backward(&mut self);
    /// `p -= lr * grad` for every param.
    fn run_update(&mut self, lr: f64);
    /// `zero_grad`, forward, backward, `update`; only called when the tape has a loss. A
    /// backend may do it in one go (the JIT does), with the same results.
    /// Called by `step` once its inputs are known to be valid, before it writes them: a
    /// backend may drop state that `step` is about to recompute (the JIT drops gradients
    /// it has not stored yet).
    fn begin_step(&mut self) {}
    fn run_step(&mut self, lr: f64) {
        self.zero_grad();
        self.run_forward();
        self.run_backward();
        self.run_update(lr);
    }

    /// Sets the inputs, in the order they were created. Wrong length or a non-finite number is
    /// an error and leaves the inputs unchanged.
    fn set_inputs(&mut self, inputs: &[f64]) -> Result<()> {
        check_inputs(self.tape(), inputs)?;
        let (base, n) = (self.tape().input_base(), self.tape().num_inputs());
        self.buffers_mut().0[base..base + n].copy_from_slice(inputs);
        Ok(())
    }

    /// Runs forward and returns the loss; a graph with only outputs returns `NaN` here (read
    /// them with `outputs`; `loss()` tells the two cases apart).
    fn forward(&mut self) -> f64 {
        self.run_forward();
        self.loss().unwrap_or(f64::NAN)
    }

    /// The loss as of the last `forward`.
    fn loss(&self) -> Result<f64> {
        let l = self.tape().loss().ok_or(Error::NoLoss)?;
        Ok(self.values()[l.index()])
    }

    /// The outputs as of the last `forward`, in the order they were added.
    fn outputs(&self) -> Vec<f64> {
        let v = self.values();
        self.tape().outputs().iter().map(|s| v[s.index()]).collect()
    }

    /// Zeroes the params' gradients, as micrograd's `Module.zero_grad` does. Every other
    /// gradient is recomputed from 0 by each `backward`, so zeroing it here would be work
    /// thrown away (on an MLP, as much memory traffic as the update).
    fn zero_grad(&mut self) {
        let n = self.tape().num_params();
        self.buffers_mut().1[..n].fill(0.0);
    }

    /// Reverse-mode differentiation of the loss at the values of the last `forward`.
    fn backward(&mut self) -> Result<()> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        self.run_backward();
        Ok(())
    }

    /// One SGD update with learning rate `lr`: `p -= lr * grad`.
    fn update(&mut self, lr: f64) {
        self.run_update(lr);
    }

    /// One per-sample SGD step: set inputs, zero_grad, forward, backward, update. Returns the
    /// loss before the update.
    fn step(&mut self, inputs: &[f64], lr: f64) -> Result<f64> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        check_inputs(self.tape(), inputs)?;
        self.begin_step();
        Ok(checked_step(self, inputs, lr))
    }

    /// Trains on `inputs`, one sample after the other (`num_inputs` numbers each): a `step`
    /// per sample, with the same results. Returns each step's loss. Every number is checked
    /// before the first step; a length that is not a whole number of samples, no samples, or
    /// a graph without inputs is an error. The JIT runs a first layer's weight update and the
    /// next sample's forward through it in one pass over its weights (`jit/step.rs`).
    fn train(&mut self, inputs: &[f64], lr: f64) -> Result<Vec<f64>> {
        self.tape().loss().ok_or(Error::NoLoss)?;
        let width = self.tape().num_inputs();
        if width == 0 || inputs.is_empty() || inputs.len() % width != 0 {
            return Err(Error::WrongLength {
                what: "training inputs (a whole number of samples)",
                expected: width.max(1) * (inputs.len() / width.max(1)).max(1),
                got: inputs.len(),
            });
        }
        check_finite("input", inputs)?;
        self.begin_step();
        Ok(self.run_train(inputs, lr))
    }

    /// `train` on checked inputs: `step` per sample. A backend may do it in one go.
    fn run_train(&mut self, inputs: &[f64], lr: f64) -> Vec<f64> {
        step_per_sample(self, inputs, lr)
    }

    /// The params, in the order they were created.
    fn params(&self) -> Vec<f64> {
        in_creation_order(self.tape(), self.values())
    }

    /// Overwrites every param, given in the order they were created. Wrong length or a
    /// non-finite number is an error and leaves the params unchanged.
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
        let slots = self.tape().param_slots().to_vec();
        let values = self.buffers_mut().0;
        for (s, &p) in slots.iter().zip(params) {
            values[s.index()] = p;
        }
        Ok(())
    }

    /// The params' gradients, in the order the params were created.
    fn param_grads(&self) -> Vec<f64> {
        in_creation_order(self.tape(), self.grads())
    }

    /// Whether this program stores `slot`'s value and gradient in its buffers. The
    /// interpreter keeps every slot; the JIT all but the products it fuses into sums.
    fn is_kept(&self, slot: Slot) -> bool {
        let _ = slot;
        true
    }

    /// The value of `v` as of the last `forward`.
    fn value(&self, v: Value<'_>) -> Result<f64> {
        Ok(self.values()[self.kept_slot(v)?.index()])
    }

    /// The gradient of `v` as of the last `backward` (0 for nodes the loss does not depend
    /// on, and for inputs made without gradient unless one is the loss itself).
    fn grad(&self, v: Value<'_>) -> Result<f64> {
        Ok(self.grads()[self.kept_slot(v)?.index()])
    }

    /// The slot of `v`, if this program keeps it.
    fn kept_slot(&self, v: Value<'_>) -> Result<Slot> {
        let slot = self.tape().slot(v)?;
        if self.is_kept(slot) {
            Ok(slot)
        } else {
            Err(Error::NotKept { node: v.id() })
        }
    }
}

/// `run_step` on each sample of checked `inputs`, returning the losses `step` would.
pub(crate) fn step_per_sample<P: Program + ?Sized>(p: &mut P, inputs: &[f64], lr: f64) -> Vec<f64> {
    let width = p.tape().num_inputs();
    inputs
        .chunks(width)
        .map(|x| checked_step(p, x, lr))
        .collect()
}

/// `step` on inputs already checked, for a tape with a loss: the loss before the update.
fn checked_step<P: Program + ?Sized>(p: &mut P, inputs: &[f64], lr: f64) -> f64 {
    let (base, n) = (p.tape().input_base(), p.tape().num_inputs());
    p.buffers_mut().0[base..base + n].copy_from_slice(inputs);
    let Some(loss) = p.tape().loss() else {
        return f64::NAN;
    };
    // The update changes params only, so a computed loss is still in the buffers
    // afterwards; a leaf loss (a param) is read before.
    let before = p.values()[loss.index()];
    p.run_step(lr);
    if p.tape().op(loss).is_leaf() {
        before
    } else {
        p.values()[loss.index()]
    }
}

/// The params' entries of `buf`, in the order the params were created.
fn in_creation_order(tape: &Tape, buf: &[f64]) -> Vec<f64> {
    tape.param_slots().iter().map(|s| buf[s.index()]).collect()
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
    // Without an early exit the common case vectorizes: it runs once per training step.
    let finite = |x: &f64| x.abs() < f64::INFINITY;
    if xs.iter().fold(true, |all, x| all & finite(x)) {
        return Ok(());
    }
    match xs.iter().enumerate().find(|(_, x)| !finite(x)) {
        Some((index, &value)) => Err(Error::NonFinite { what, index, value }),
        None => Ok(()),
    }
}

/// Fresh value and gradient buffers for a tape: params at their initial values, constants in
/// place, everything else 0.
pub(crate) fn initial_buffers(tape: &Tape) -> (Vec<f64>, Vec<f64>) {
    let mut values = vec![0.0; tape.len()];
    for (s, &p) in tape.param_slots().iter().zip(tape.param_init()) {
        values[s.index()] = p;
    }
    for s in tape.slots() {
        if let crate::op::Op::Const(c) = tape.op(s) {
            values[s.index()] = c;
        }
    }
    (values, vec![0.0; tape.len()])
}
