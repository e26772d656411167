//! Which orders a [`Nest`](super::loops::Nest)'s repetitions may run in: the lane lowering (`jit/lanes.rs`) runs
//! them side by side, and this module decides when that changes no result.
//!
//! - Forward: repetitions may interleave when none reads what another writes
//!   ([`repetitions_independent`]).
//! - Backward: interleaving reorders gradient additions; [`backward_lanes_keep_order`] walks
//!   the lane order and checks every slot still receives its additions in the interpreter's
//!   order.
//! - [`lane_group`]: how many repetitions run together, shared by the check and the lowering.

use super::loops::{Affine, Item, MapLoop};

/// At most this many repetitions run together in lanes (eight vectors of eight).
pub const MAX_LANE_GROUP: u32 = 64;

/// How many of a nest's `count` repetitions a lane lowering runs together: all of them up to
/// [`MAX_LANE_GROUP`], else the largest multiple of 8 up to it that divides `count` (no
/// ragged last group: its code would be a second copy), else [`MAX_LANE_GROUP`].
pub fn lane_group(count: u32) -> u32 {
    if count <= MAX_LANE_GROUP {
        return count;
    }
    (1..=MAX_LANE_GROUP / 8)
        .rev()
        .map(|v| 8 * v)
        .find(|g| count % g == 0)
        .unwrap_or(MAX_LANE_GROUP)
}

/// Slots `a.at(0..len)`.
type Run = (Affine, u32);

/// The slots an item writes and reads.
fn outputs_and_inputs(item: &Item) -> (Vec<Run>, Vec<Run>) {
    match item {
        Item::Map(m) => (
            vec![(m.out, m.len)],
            m.args.iter().map(|&a| (a, m.len)).collect(),
        ),
        Item::Sum(s) => (vec![(s.slot, 1)], vec![(s.first, 1), (s.tail, s.tail_len)]),
        Item::Dot(d) => (
            vec![(d.sum.slot, 1)],
            std::iter::once((d.sum.first, 1))
                .chain(d.products.args.iter().map(|&a| (a, d.products.len)))
                .collect(),
        ),
        Item::Straight(_) | Item::Nest(_) => (Vec::new(), Vec::new()),
    }
}

/// Whether every slot a repetition reads is written by no repetition or by itself. Linear in
/// the nodes the nest covers: it marks each written slot with its repetition.
pub fn repetitions_independent(body: &[Item], count: u32) -> bool {
    let (mut outputs, mut inputs) = (Vec::new(), Vec::new());
    for item in body {
        let (o, i) = outputs_and_inputs(item);
        outputs.extend(o);
        inputs.extend(i);
    }
    let Some(span) = outputs
        .iter()
        .map(|&(o, len)| o.span(len, count))
        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
    else {
        return true;
    };
    let mut writer = vec![u32::MAX; span.len()];
    for &(o, len) in &outputs {
        for j in 0..count {
            for t in 0..len {
                writer[(o.at_nested(t, j).0 - span.start) as usize] = j;
            }
        }
    }
    inputs.iter().all(|&(a, len)| {
        (0..count).all(|j| {
            (0..len).all(|t| {
                let s = a.at_nested(t, j).0;
                let w = if span.contains(&s) {
                    writer[(s - span.start) as usize]
                } else {
                    u32::MAX
                };
                w == u32::MAX || w == j
            })
        })
    })
}

/// A gradient addition of a nest's backward, in every repetition: into `slot.at_nested(t,
/// j)`, at step `step` of its item (steps numbered in the item's own backward order), from
/// operand `arg`.
struct Contribution {
    slot: Affine,
    t: u32,
    step: u64,
    arg: u64,
}

/// The gradient additions of a body item, in its backward order (the same in every
/// repetition).
fn contributions(item: &Item) -> Vec<Contribution> {
    let at = |slot: Affine, t: u32, step: u64, arg: usize| Contribution {
        slot,
        t,
        step,
        arg: arg as u64,
    };
    // A map's operands, `t` from the last, operand by operand; steps from `first_step`.
    let map = |m: &MapLoop, first_step: u64, out: &mut Vec<Contribution>| {
        for (k, t) in (0..m.len).rev().enumerate() {
            for (i, &a) in m.args.iter().enumerate().filter(|&(i, _)| m.grad_args[i]) {
                out.push(at(a, t, first_step + k as u64, i));
            }
        }
    };
    let mut out = Vec::new();
    match item {
        Item::Map(m) if m.needs_grad => map(m, 0, &mut out),
        Item::Sum(sum) if sum.needs_grad => {
            if sum.grad_first {
                out.push(at(sum.first, 0, 0, 0));
            }
            if sum.grad_tail {
                out.extend((0..sum.tail_len).map(|t| at(sum.tail, t, 1 + t as u64, 0)));
            }
        }
        Item::Dot(dot) if dot.sum.needs_grad => {
            if dot.sum.grad_first {
                out.push(at(dot.sum.first, 0, 0, 0));
            }
            map(&dot.products, 1, &mut out);
        }
        _ => {}
    }
    out
}

/// Whether the lane order of [`Nest::lanes`](super::loops::Nest::lanes) adds every gradient's contributions in the
/// interpreter's order (repetitions from the last, items from the last, each item's steps in
/// order). Walks the lane order, checking that each slot's contributions come in increasing
/// interpreter rank: linear in the additions.
pub fn backward_lanes_keep_order(body: &[Item], count: u32) -> bool {
    let per_item: Vec<Vec<Contribution>> = body.iter().map(contributions).collect();
    let Some(span) = per_item
        .iter()
        .flatten()
        .map(|c| c.slot.span(c.t + 1, count))
        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
    else {
        return true;
    };
    let items = body.len() as u64;
    let steps = 2 + per_item.iter().flatten().map(|c| c.step).max().unwrap_or(0);
    // The interpreter's order: repetition from the last, item from the last, step, operand.
    let rank = |j: u32, k: usize, c: &Contribution| {
        let outer = (count - 1 - j) as u64 * items + (items - 1 - k as u64);
        (outer * steps + c.step) * 2 + c.arg
    };
    // 1 + the rank of each slot's last addition so far (0: none yet).
    let mut last = vec![0u64; span.len()];
    let size = lane_group(count);
    for group in (0..count.div_ceil(size)).rev() {
        let lanes = group * size..((group + 1) * size).min(count);
        for (k, cs) in per_item.iter().enumerate().rev() {
            // The lane order within an item: step, operand, repetition from the last.
            for c in cs {
                for j in lanes.clone().rev() {
                    let slot = (c.slot.at_nested(c.t, j).0 - span.start) as usize;
                    let r = rank(j, k, c) + 1;
                    if last[slot] >= r {
                        return false;
                    }
                    last[slot] = r;
                }
            }
        }
    }
    true
}
