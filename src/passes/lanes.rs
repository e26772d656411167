//! Which orders the repetitions of a [`Nest`](super::loops::Nest) whose body holds no nest
//! may run in: the plan ([`crate::plan`]) runs them side by side in vector lanes where these
//! analyses show that changes no result.
//!
//! - Forward: repetitions may interleave when none reads what another writes
//!   ([`repetitions_independent`]).
//! - Backward: interleaving reorders gradient additions; [`backward_lanes_keep_order`] walks
//!   the lane order for a given lane group size and checks every slot still receives its
//!   additions in the interpreter's order.

use std::collections::HashMap;

use super::loops::{AccessKind, Affine, Item, MapLoop};

/// Slots `a.at(0..len)`.
type Run = (Affine, u32);

/// Whether every slot a repetition reads is written by no repetition or by itself. Linear in
/// the nodes the nest covers: it marks each written slot with its repetition.
pub fn repetitions_independent(body: &[Item], count: u32) -> bool {
    let (mut outputs, mut inputs): (Vec<Run>, Vec<Run>) = (Vec::new(), Vec::new());
    for access in body.iter().flat_map(Item::accesses) {
        match access.kind {
            AccessKind::Writes { .. } => outputs.push((access.at, access.len)),
            AccessKind::Reads { .. } => inputs.push((access.at, access.len)),
        }
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
        Item::Map(_)
        | Item::Sum(_)
        | Item::Dot(_)
        | Item::Straight(_)
        | Item::Nest(_)
        | Item::SumPart { .. } => {}
    }
    out
}

/// Per slot of a span, a number that starts at 0.
enum Ranks {
    Dense(Vec<u64>),
    Sparse(HashMap<usize, u64>),
}

impl Ranks {
    fn at(&mut self, slot: usize) -> &mut u64 {
        match self {
            Ranks::Dense(v) => &mut v[slot],
            Ranks::Sparse(m) => m.entry(slot).or_insert(0),
        }
    }
}

/// Whether the lane order of [`Lanes::Both`](super::loops::Lanes::Both) with groups of
/// `size` repetitions adds every gradient's contributions in the interpreter's order
/// (repetitions from the last, items from the last, each item's steps in order). Walks the
/// lane order, checking that each slot's contributions come in increasing interpreter rank:
/// linear in the additions.
pub fn backward_lanes_keep_order(body: &[Item], count: u32, size: u32) -> bool {
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
    // 1 + the rank of each slot's last addition so far (0: none yet). Dense over the span
    // unless the span is far larger than the additions (a nest inside a rollout adds into
    // the params at the tape's start and into the previous step's values).
    let additions: usize = per_item.iter().map(Vec::len).sum::<usize>() * count as usize;
    let mut last = if span.len() <= 4 * additions {
        Ranks::Dense(vec![0u64; span.len()])
    } else {
        Ranks::Sparse(HashMap::with_capacity(additions))
    };
    for group in (0..count.div_ceil(size)).rev() {
        let lanes = group * size..((group + 1) * size).min(count);
        for (k, cs) in per_item.iter().enumerate().rev() {
            // The lane order within an item: step, operand, repetition from the last.
            for c in cs {
                for j in lanes.clone().rev() {
                    let slot = (c.slot.at_nested(c.t, j).0 - span.start) as usize;
                    let r = rank(j, k, c) + 1;
                    let last = last.at(slot);
                    if *last >= r {
                        return false;
                    }
                    *last = r;
                }
            }
        }
    }
    true
}
