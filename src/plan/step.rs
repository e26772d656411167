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
//! sample's forward through it in one pass ([`TrainPlan`], `plan/first_layer/`).

use super::first_layer::{train_plan, TrainPlan, ZeroSkipping};
use super::nests::{Lanes, Nests};
use crate::op::Op;
use crate::passes::schedule::{AccessKind, DotLoop, Item, Nest};
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
pub fn plan(
    tape: &Tape,
    items: &[Item],
    nests: &Nests,
    zero_skipping: ZeroSkipping,
) -> Option<StepPlan> {
    tape.loss()?;
    let fused = fused_updates(tape, items, nests);
    if !fused.contains(&true) {
        return None;
    }
    let deferred = deferred(tape, items, nests, &fused);
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
fn fused_updates(tape: &Tape, items: &[Item], nests: &Nests) -> Vec<bool> {
    let consumers = tape.consumers();
    let p = tape.num_params();
    let sole =
        |s: Slot| s.index() < p && consumers.grad_additions(s) == 1 && Some(s) != tape.loss();
    // (Params only: a batch of copies has millions of slots.)
    let mut fused = vec![false; p];
    for item in items {
        let Item::Nest(nest) = item else { continue };
        if nests.of(nest).lanes.backward().is_none() {
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
fn deferred(tape: &Tape, items: &[Item], nests: &Nests, fused: &[bool]) -> Vec<Deferred> {
    let mut out = Vec::new();
    let p = tape.num_params() as u32;
    for item in items {
        let Item::Nest(nest) = item else { continue };
        if !matches!(nests.of(nest).lanes, Lanes::Both { .. }) {
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
