//! The first layer's fast path: a dot on inputs without gradient, such as an MLP's first
//! layer on its pixels, where the plan found one (`StepPlan::train`, `ZeroSkip`,
//! `plan/first_layer/`). Generic lowering asks it through the three hooks below and emits the
//! dot itself wherever they answer `None`.
//!
//! - `merged.rs`: `train`'s merged dot, this sample's update of the weights and the next
//!   sample's forward through them in one pass;
//! - `sparse.rs`: that dot over only the steps whose input is not 0 (in `train`, and in
//!   `accumulate` for minibatches), behind the checks that keep it exact;
//! - `split.rs`: a minibatch's sample in stages, the dot cut by its rows (`acc_head`,
//!   `acc_rest`, `acc_tail`), for `crate::minibatch`'s threads.

mod merged;
mod sparse;
mod split;

use inkwell::values::{IntValue, PointerValue};

use super::lane_io::{LaneIo, Reps, Vector};
use super::{Emit, Emitter, Frame, Pass};
use crate::passes::schedule::{DotLoop, MapLoop};
use crate::plan::ZeroSkip;

impl<'ctx, 't> Emitter<'ctx, 't> {
    /// `dot`'s forward in this function, if it is the first layer's to emit: nothing where
    /// `train`'s previous sample or `acc_head` computed it, the steps whose input is not 0
    /// in `accumulate`'s lanes. `None`: generic lowering emits it.
    pub(super) fn first_layer_forward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        dot: &DotLoop,
        reps: &Reps<'ctx>,
    ) -> Option<Emit<()>> {
        if matches!(frame.pass, Pass::TrainForward | Pass::AccumulateRest) && self.merges(dot) {
            return Some(Ok(()));
        }
        let skip = self.accumulate_skip(frame, dot).filter(|_| V::IS_VECTOR)?;
        Some(self.sparse_dot_forward(frame, dot, reps, skip))
    }

    /// `dot`'s backward in this function (its sum takes a gradient), if it is the first
    /// layer's to emit: `train`'s merged dot, only the sums' gradients in `acc_rest` (the
    /// weights' are `acc_tail`'s), the steps whose input is not 0 in `accumulate`'s lanes.
    /// `None`: generic lowering emits it. (The first layer's dot reads inputs without
    /// gradient, so it never takes the vertical order, which generic lowering decides
    /// first.)
    pub(super) fn first_layer_backward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        dot: &DotLoop,
        reps: &Reps<'ctx>,
    ) -> Option<Emit<()>> {
        if !self.merges(dot) {
            return None;
        }
        match frame.pass {
            Pass::TrainBackward { samples, .. } => {
                Some(self.merged_dot_backward::<V>(frame, dot, reps, samples))
            }
            Pass::AccumulateRest => Some(self.sum_grads::<V>(frame, &dot.sum, reps).map(drop)),
            _ => {
                let (skip, _) = self.accumulate_skip(frame, dot).filter(|_| V::IS_VECTOR)?;
                Some(self.sparse_dot_backward(frame, dot, reps, skip))
            }
        }
    }

    /// Operand `i` of `map` at step `t`, if a stage reads it from its sample rather than the
    /// buffer (`acc_head` and `acc_tail`: inputs without gradient).
    pub(super) fn first_layer_operand<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        i: usize,
        t: IntValue<'ctx>,
        lanes: Vector,
    ) -> Option<Emit<V>> {
        match frame.pass {
            Pass::Stage { sample, .. } if !map.grad_args[i] => {
                Some(self.sample_input(sample, map.args[i], t, lanes))
            }
            _ => None,
        }
    }

    /// Whether `dot` is the one `train` merges with the next sample's forward.
    fn merges(&self, dot: &DotLoop) -> bool {
        let train = self.plan.step.as_ref().and_then(|s| s.train.as_ref());
        train.is_some_and(|t| t.dot == dot.sum.slot)
    }

    /// How `accumulate`'s function 0 skips the zero inputs of `dot`, if this is that
    /// function and `dot` is `train`'s: the plan's [`ZeroSkip`] and the guard word.
    fn accumulate_skip(
        &self,
        frame: Frame<'ctx>,
        dot: &DotLoop,
    ) -> Option<(&'t ZeroSkip, PointerValue<'ctx>)> {
        let Pass::Accumulate { guard } = frame.pass else {
            return None;
        };
        let skip = self.zero_skip().filter(|_| self.merges(dot))?;
        Some((skip, guard))
    }

    /// How `train`'s dot skips zero inputs, if it does.
    pub(super) fn zero_skip(&self) -> Option<&'t ZeroSkip> {
        let train = self.plan.step.as_ref()?.train.as_ref()?;
        train.skip_zeros.as_ref()
    }
}
