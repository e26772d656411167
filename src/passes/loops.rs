//! Loop recovery: finds the tape's repeated patterns and schedules them as loops.
//!
//! A graph built by scalar code hides its loops, but not their trace: a dot product is a run
//! of `mul` nodes whose operand slots advance by a constant step, one layer is that run
//! repeated, a `sum` over such a run reads its operands at evenly spaced slots. This pass
//! recovers two shapes, for any graph (nothing here knows about `nn`):
//!
//! - [`MapLoop`]: a run of nodes with the same op whose own slots and every operand's slots
//!   are affine in the run index `t` (`base + stride * t`), separated only by leaves.
//! - [`SumLoop`]: a `sum` whose operands after the first are affine.
//!
//! **Invariant (exactness):** a loop performs its nodes' operations in the interpreter's
//! order: forward by increasing `t`, backward by decreasing `t`, each node's operand
//! gradients in operand order, a sum's operands left to right. Because a run contains no
//! other non-leaf node, nothing else interleaves, so results are bit-identical to the
//! straight-line walk whatever the backend does within IEEE semantics.

use std::ops::Range;

use crate::op::Op;
use crate::tape::{Slot, Tape};

/// Slot `base + stride * t` of iteration `t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Affine {
    pub base: i64,
    pub stride: i64,
}

impl Affine {
    pub fn at(self, t: u32) -> Slot {
        Slot((self.base + self.stride * t as i64) as u32)
    }

    /// Every slot of iterations `0..len`, as the span between the extremes.
    pub fn span(self, len: u32) -> Range<u32> {
        let (a, b) = (self.at(0).0, self.at(len.saturating_sub(1)).0);
        a.min(b)..a.max(b) + 1
    }

    /// The affine sequence through `first` and `second`.
    fn through(first: Slot, second: Slot) -> Affine {
        Affine {
            base: first.0 as i64,
            stride: second.0 as i64 - first.0 as i64,
        }
    }
}

/// `len` nodes of one op at slots `out.at(t)`, operand `k` of iteration `t` at
/// `args[k].at(t)`.
#[derive(Clone, Debug, PartialEq)]
pub struct MapLoop {
    pub op: Op,
    pub out: Affine,
    pub args: Vec<Affine>,
    pub len: u32,
    /// Whether backward visits these nodes (the same for all of them).
    pub needs_grad: bool,
}

/// The `sum` at `slot`: `first + tail.at(0) + ... + tail.at(tail_len - 1)`, left to right.
#[derive(Clone, Debug, PartialEq)]
pub struct SumLoop {
    pub slot: Slot,
    pub first: Slot,
    pub tail: Affine,
    pub tail_len: u32,
}

/// One step of the lowered program, in tape order.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// Straight-line nodes: the non-leaf slots of the range.
    Straight(Range<u32>),
    Map(MapLoop),
    Sum(SumLoop),
}

/// The tape as the lowering walks it: straight-line ranges and loops, covering every non-leaf
/// slot exactly once, in slot order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    pub items: Vec<Item>,
    /// Loops made.
    pub loops: usize,
    /// Tape nodes the loops cover.
    pub loop_nodes: usize,
}

/// Runs shorter than this stay straight-line: a loop's overhead would not pay.
pub const MIN_RUN: u32 = 8;

/// Schedules `tape`; with `recover` false, as one straight-line range.
pub fn schedule(tape: &Tape, recover: bool) -> Schedule {
    let first = (tape.num_params() + tape.num_inputs()) as u32;
    let end = tape.len() as u32;
    let mut out = Schedule::default();
    if !recover {
        out.items.push(Item::Straight(first..end));
        return out;
    }
    let mut straight = first;
    let mut s = first;
    while s < end {
        let slot = Slot(s);
        if tape.op(slot).is_leaf() {
            s += 1;
            continue;
        }
        let (item, next, nodes) = if let Some(run) = map_run_at(tape, slot) {
            let next = run.out.at(run.len - 1).0 + 1;
            let nodes = run.len as usize;
            (Item::Map(run), next, nodes)
        } else if let Some(sum) = sum_loop_at(tape, slot) {
            (Item::Sum(sum), s + 1, 1)
        } else {
            s += 1;
            continue;
        };
        if straight < s {
            out.items.push(Item::Straight(straight..s));
        }
        out.items.push(item);
        out.loops += 1;
        out.loop_nodes += nodes;
        s = next;
        straight = s;
    }
    if straight < end {
        out.items.push(Item::Straight(straight..end));
    }
    out
}

/// The next non-leaf slot after `s`, if only leaves lie between.
fn next_node(tape: &Tape, s: Slot) -> Option<Slot> {
    ((s.0 + 1)..tape.len() as u32)
        .map(Slot)
        .find(|&n| !tape.op(n).is_leaf())
}

/// The longest run of nodes isomorphic to `s` with affine slots, if at least [`MIN_RUN`].
fn map_run_at(tape: &Tape, s: Slot) -> Option<MapLoop> {
    let op = tape.op(s);
    op.arity()?;
    let same_kind = |n: Slot| tape.op(n) == op && tape.needs_grad(n) == tape.needs_grad(s);
    let second = next_node(tape, s).filter(|&n| same_kind(n))?;
    let out = Affine::through(s, second);
    let args: Vec<Affine> = tape
        .args(s)
        .iter()
        .zip(tape.args(second))
        .map(|(&a, &b)| Affine::through(a, b))
        .collect();
    let mut len = 2;
    // Member `len` must be the very next node after member `len - 1`.
    while let Some(n) = next_node(tape, out.at(len - 1)) {
        let fits = n == out.at(len)
            && same_kind(n)
            && tape.args(n).iter().zip(&args).all(|(&a, f)| a == f.at(len));
        if !fits {
            break;
        }
        len += 1;
    }
    (len >= MIN_RUN).then(|| MapLoop {
        op,
        out,
        args,
        len,
        needs_grad: tape.needs_grad(s),
    })
}

/// `s` as a [`SumLoop`], if it is a sum with at least [`MIN_RUN`] affine operands after the
/// first.
fn sum_loop_at(tape: &Tape, s: Slot) -> Option<SumLoop> {
    if tape.op(s) != Op::Sum {
        return None;
    }
    let args = tape.args(s);
    let tail = &args[1..];
    if (tail.len() as u32) < MIN_RUN {
        return None;
    }
    let affine = Affine::through(tail[0], tail[1]);
    let all_fit = tail
        .iter()
        .enumerate()
        .all(|(t, &a)| a == affine.at(t as u32));
    all_fit.then(|| SumLoop {
        slot: s,
        first: args[0],
        tail: affine,
        tail_len: tail.len() as u32,
    })
}
