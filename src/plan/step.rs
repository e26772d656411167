//! What `step` (zero_grad, forward, backward, update as one native call) does better than the
//! four passes, decided from the tape and the items.
//!
//! `step` knows what the four calls cannot: every param's gradient starts at 0. Its backward
//! therefore starts params' gradients from the constant 0, and a param whose gradient one
//! lane loop computes in whole (its only use) is stored and updated right there
//! (`p -= lr * g`, [`StepPlan::fused`]) while its value is in cache: a layer's weights cross
//! memory twice per step instead of four times. The gradients of a dot product's fused params
//! need not even be stored ([`StepPlan::deferred`]): `materialize` recomputes them, bit for
//! bit, before anyone can look. And `train` runs the first layer's weight update and the next
//! sample's forward through it in one pass ([`TrainPlan`]).

use std::ops::Range;

use crate::op::Op;
use crate::passes::loops::{AccessKind, Affine, DotLoop, Item, Lanes, Nest};
use crate::tape::{Slot, Tape};

/// `step`'s own backward: where it differs from `backward`.
#[derive(Clone, Debug, PartialEq)]
pub struct StepPlan {
    /// Per param slot: a param that `step` updates where a lane loop computes its whole
    /// gradient ([`StepPlan::fuses`]).
    pub fused: Vec<bool>,
    /// The dot-product operands whose gradients `step` leaves to `materialize`.
    pub deferred: Vec<Deferred>,
    /// Per param slot: a gradient `step` defers ([`StepPlan::defers`]).
    deferred_slots: Vec<bool>,
    /// What `train` merges, if it can.
    pub train: Option<TrainPlan>,
}

/// Operand `operand` of the products of dot `body[dot]` of `nest` (a top-level nest whose
/// backward runs in lanes): a fused param whose gradient is `0 + other * (0 + g_sum)`, where
/// nothing `step` does after its backward changes `other` (no param) or `g_sum` (kept).
#[derive(Clone, Debug, PartialEq)]
pub struct Deferred {
    pub nest: Nest,
    pub dot: usize,
    pub operand: usize,
}

impl Deferred {
    pub fn dot(&self) -> &DotLoop {
        match &self.nest.body[self.dot] {
            Item::Dot(dot) => dot,
            _ => unreachable!("a deferred gradient names a dot"),
        }
    }
}

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

impl StepPlan {
    /// Whether `step` updates the param in slot `s` where a lane loop computes its whole
    /// gradient (false for any slot but a param's).
    pub fn fuses(&self, s: usize) -> bool {
        self.fused.get(s) == Some(&true)
    }

    /// Whether `step` leaves slot `s`'s gradient to `materialize`.
    pub fn defers(&self, s: usize) -> bool {
        self.deferred_slots.get(s) == Some(&true)
    }
}

/// `step`'s plan for `items` (top-level schedule items, lanes decided), or `None` where no
/// lane loop computes a param's whole gradient: a second backward would only add compile
/// time.
pub fn plan(tape: &Tape, items: &[Item], zero_skipping: ZeroSkipping) -> Option<StepPlan> {
    tape.loss()?;
    let fused = fused_updates(tape, items);
    if !fused.contains(&true) {
        return None;
    }
    let deferred = deferred(tape, items, &fused);
    // (Deferred operands are fused params.)
    let mut deferred_slots = vec![false; tape.num_params()];
    for d in &deferred {
        let (dot, a) = (d.dot(), d.dot().products.args[d.operand]);
        for j in 0..d.nest.count {
            for t in 0..dot.products.len {
                deferred_slots[a.at_nested(t, j).index()] = true;
            }
        }
    }
    let train = train_plan(tape, items, deferred.first(), zero_skipping);
    Some(StepPlan {
        fused,
        deferred,
        deferred_slots,
        train,
    })
}

/// The params a lane loop adds into with one vector per group (unit stride across
/// repetitions), that no other node reads in backward and that are not the loss.
fn fused_updates(tape: &Tape, items: &[Item]) -> Vec<bool> {
    let consumers = tape.consumers();
    let p = tape.num_params();
    let sole =
        |s: Slot| s.index() < p && consumers.grad_additions(s) == 1 && Some(s) != tape.loss();
    // (Params only: a batch of copies has millions of slots.)
    let mut fused = vec![false; p];
    for item in items {
        let Item::Nest(nest) = item else { continue };
        if nest.lanes.backward().is_none() {
            continue;
        }
        for access in nest.body.iter().flat_map(Item::accesses) {
            let (a, len) = (access.at, access.len);
            let slots =
                || (0..nest.count).flat_map(move |j| (0..len).map(move |t| a.at_nested(t, j)));
            let takes = access.kind == AccessKind::Reads { grad: true };
            if takes && a.outer[0] == 1 && slots().all(sole) {
                for s in slots() {
                    fused[s.index()] = true;
                }
            }
        }
    }
    fused
}

/// The fused param operands of dot products whose gradient `step` can leave unstored.
fn deferred(tape: &Tape, items: &[Item], fused: &[bool]) -> Vec<Deferred> {
    let mut out = Vec::new();
    let p = tape.num_params() as u32;
    for item in items {
        let Item::Nest(nest) = item else { continue };
        if !matches!(nest.lanes, Lanes::Both { .. }) {
            continue;
        }
        for (b, body) in nest.body.iter().enumerate() {
            let Item::Dot(dot) = body else { continue };
            let m = &dot.products;
            if m.op != Op::Mul {
                continue;
            }
            for i in 0..2 {
                let (a, other) = (m.args[i], m.args[1 - i]);
                let other_no_param = other.span(m.len, nest.count).start >= p;
                if fused.get(a.at(0).index()) == Some(&true) && other_no_param {
                    out.push(Deferred {
                        nest: nest.clone(),
                        dot: b,
                        operand: i,
                    });
                }
            }
        }
    }
    out
}

/// `train`'s merge, if the first deferred dot is the first thing the tape computes.
fn train_plan(
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
