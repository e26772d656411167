//! Anomaly mode ([`crate::Program::detect_anomaly`], as `torch.autograd.detect_anomaly`):
//! after a pass, the first node that made a non-finite number from finite ones, named by
//! its graph node, op and operands, instead of a NaN found steps later.
//!
//! Forward, that is the first slot (in tape order) whose value is not finite: its operands,
//! earlier slots, are all finite. Backward, gradients flow from later slots to earlier ones,
//! so the last slot whose gradient is not finite received it from consumers whose own
//! gradients are finite: the consumer whose local derivative for it is not finite made it.
//! Both read every value and gradient as the interpreter computes them
//! ([`crate::Program::every_value_and_grad`]): the search costs a pass, and runs only when a
//! number is not finite.

use crate::error::{Error, Result};
use crate::op::F64;
use crate::tape::{Slot, Tape};

pub use crate::error::Pass;

/// `Err(Error::Anomaly)` naming the first node to make a non-finite value (`values`, one per
/// slot) or, with `grads`, gradient; `Ok` if every number the loss depends on is finite.
pub(crate) fn check(tape: &Tape, values: &[f64], grads: Option<&[f64]>) -> Result<()> {
    if let Some(s) = tape.slots().find(|s| !values[s.index()].is_finite()) {
        return Err(anomaly(tape, Pass::Forward, s, values, values[s.index()]));
    }
    let Some(grads) = grads else {
        return Ok(());
    };
    let bad = |s: &Slot| tape.needs_grad(*s) && !grads[s.index()].is_finite();
    let Some(s) = tape.slots().rev().find(bad) else {
        return Ok(());
    };
    // The consumer whose local derivative for `s` is not finite (every consumer's own
    // gradient is finite: `s` is the last slot whose gradient is not).
    let mut local = Vec::new();
    for c in tape.slots().skip(s.index() + 1) {
        let args = tape.args(c);
        if !tape.needs_grad(c) || !args.iter().any(|a| a == s) {
            continue;
        }
        let operands: Vec<f64> = args.iter().map(|a| values[a.index()]).collect();
        let (out, g) = (values[c.index()], grads[c.index()]);
        tape.op(c)
            .local_grads(&mut F64, &operands, out, g, &mut local);
        if let Some((_, &d)) = args
            .iter()
            .zip(&local)
            .find(|(a, d)| *a == s && !d.is_finite())
        {
            return Err(anomaly(tape, Pass::Backward, c, values, d));
        }
    }
    Err(anomaly(tape, Pass::Backward, s, values, grads[s.index()]))
}

fn anomaly(tape: &Tape, pass: Pass, s: Slot, values: &[f64], value: f64) -> Error {
    let op = tape.op(s);
    Error::Anomaly {
        pass,
        node: tape.node_of(s),
        op: op.name(),
        param: tape.param_slots().iter().position(|&p| p == s),
        operands: tape.args(s).iter().map(|a| values[a.index()]).collect(),
        value,
    }
}
