//! The first layer's fast path, as the plan decides it: a dot on inputs without gradient
//! that `train` merges with the next sample's forward ([`TrainPlan`]), skipping zero inputs
//! where that is exact ([`ZeroSkip`], behind the guard word), and that minibatches may cut by
//! its rows across threads (`split.rs`). The emitter's side is `jit/emit/first_layer/`, the
//! threads' `minibatch/stages.rs`.

pub mod split;

use std::ops::Range;

use super::step::Deferred;
use crate::passes::schedule::{Affine, Item};
use crate::tape::Tape;

/// `train`'s merge: the first thing the tape computes is a nest's first body item, a dot
/// whose weight gradients `step` defers and whose other operand is inputs without gradient.
/// So the next sample's values are at hand, and nothing else adds gradients in that loop.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainPlan {
    /// The merged dot, by its sum's slots.
    pub dot: Affine,
    /// The input slots that dot does not read, as runs: what the next forward needs copied
    /// into the values buffer.
    pub other_inputs: Vec<Range<u32>>,
    /// Whether the merged loop skips the steps where both samples' inputs are 0.
    pub skip_zeros: Option<ZeroSkip>,
}

/// How `train`'s merged dot skips zero inputs (and `accumulate`'s forward and backward of the
/// same dot: see `emit/sparse.rs`). A step `t` whose input is exactly 0 in this
/// sample and the next adds `w * 0` to the next sample's sum and subtracts `lr * (0 + g * 0)`
/// from the weight. The first is a signed zero, the second `lr * +0` (the gradient buffer's
/// zero turns a -0 into +0), and neither changes anything, unless
/// - a weight is not finite (`inf * 0` is NaN): the code skips only while `train`'s guard
///   word says every weight is finite, and after each sample sets it to whether every sum
///   of the next sample is finite (each updated weight is multiplied into one);
/// - a gradient `g` is not finite: the code checks them first;
/// - `lr` is negative (or -0): `-0 - lr * +0` is +0. The code checks its sign;
/// - a sum is -0 and a skipped term +0 (`-0 + +0` is +0): a sum is -0 only when its every
///   term so far was -0, so the code checks the sums after the loop and recomputes them
///   without skipping if any is -0.
#[derive(Clone, Debug, PartialEq)]
pub struct ZeroSkip {
    /// The dot's operand that holds the inputs.
    pub input: usize,
    /// The weights whose finiteness the guard word speaks for, as runs of slots.
    pub weights: Vec<Range<u32>>,
    /// Whether samples skip even where more than 3 steps in 4 remain (and nothing is
    /// gained).
    pub always: bool,
}

/// The guard word's bits (see [`ZeroSkip`] and `emit/sparse.rs`): whether every weight of the
/// dot is finite; whether none is -0 (then `train`'s skipping loop updates a weight by
/// `w - lr * g` where the interpreter computes `w - lr * (0 + g)`: the two differ only when
/// `g` is -0 and `w` is -0, and `train` never makes a -0 weight: `a - b` is -0 only for a -0
/// `a`); above them, how many samples `train` still runs dense before looking again.
pub const GUARD_FINITE: i64 = 1;
pub const GUARD_NO_NEGATIVE_ZERO: i64 = 2;
pub const GUARD_WAIT_SHIFT: u64 = 2;

/// Whether `train` skips zero inputs ([`crate::JitBuilder::zero_skipping`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ZeroSkipping {
    /// Where a sample has enough zeros to pay (the default).
    #[default]
    Auto,
    /// In every sample.
    Always,
    /// Never.
    Never,
}

/// `train`'s merge, if the first deferred dot is the first thing the tape computes.
pub(super) fn train_plan(
    tape: &Tape,
    items: &[Item],
    first: Option<&Deferred>,
    zero_skipping: ZeroSkipping,
) -> Option<TrainPlan> {
    let first = first?;
    let (nest, dot, i) = (&first.nest, first.dot(), first.operand);
    // (A dot with terms before its products is never its nest's first item; the merged loop
    // computes a dot of its products alone.)
    let first_computed = first.dot == 0
        && dot.head() == 0
        && matches!(items.first(), Some(Item::Nest(n)) if n == nest);
    let other = dot.products.args[1 - i];
    let inputs = tape.input_base() as u32..(tape.input_base() + tape.num_inputs()) as u32;
    let span = other.span(dot.products.len, nest.count);
    let other_is_input = other.outer[0] == 0
        && !dot.products.grad_args[1 - i]
        && inputs.start <= span.start
        && span.end <= inputs.end;
    let loss_computed = tape.loss().is_some_and(|l| !tape.op(l).is_leaf());
    if !(first_computed && other_is_input && loss_computed) {
        return None;
    }
    // The dot's inputs, if they form one run; else every input is copied.
    let read = if other.stride == 1 && span.len() == dot.products.len as usize {
        span
    } else {
        inputs.start..inputs.start
    };
    let other_inputs = [inputs.start..read.start, read.end..inputs.end]
        .into_iter()
        .filter(|r| !r.is_empty())
        .collect();
    // The inputs are shared by the lanes (checked above), so a step is skipped for all of
    // them or none.
    let skip_zeros = (zero_skipping != ZeroSkipping::Never).then(|| {
        let weights = dot.products.args[i];
        let mut slots: Vec<u32> = (0..nest.count)
            .flat_map(|j| (0..dot.products.len).map(move |t| weights.at_nested(t, j).0))
            .collect();
        slots.sort_unstable();
        ZeroSkip {
            input: 1 - i,
            weights: runs(&slots),
            always: zero_skipping == ZeroSkipping::Always,
        }
    });
    Some(TrainPlan {
        dot: dot.sum.slot,
        other_inputs,
        skip_zeros,
    })
}

/// Sorted `slots` as runs of consecutive slots.
fn runs(slots: &[u32]) -> Vec<Range<u32>> {
    let mut out: Vec<Range<u32>> = Vec::new();
    for &s in slots {
        match out.last_mut() {
            Some(run) if run.end == s => run.end += 1,
            _ => out.push(s..s + 1),
        }
    }
    out
}
