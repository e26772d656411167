//! Which orders the repetitions of a [`Nest`](super::schedule::Nest) whose body holds no nest
//! may run in: the plan ([`crate::plan`]) runs them side by side in vector lanes where these
//! analyses show that changes no result.
//!
//! - Forward: repetitions may interleave when none reads what another writes
//!   ([`repetitions_independent`]).
//! - Backward: interleaving reorders gradient additions; [`backward_lanes_keep_order`] walks
//!   the lane order for a given lane group size and checks every slot still receives its
//!   additions in the interpreter's order.

use std::collections::HashMap;

use super::schedule::{AccessKind, Affine, Item, MapLoop};

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
    /// For a map's (or a dot's products') additions: the [`VERTICAL_BLOCK`] of steps, from
    /// the last, that the vertical order takes together ([`vertical_block`]; `None`: lane by
    /// lane).
    block: Option<u64>,
}

/// The gradient additions of a body item, in its backward order (the same in every
/// repetition; a map's operands from the last if `from_last`).
fn contributions(item: &Item, from_last: bool) -> Vec<Contribution> {
    let at = |slot: Affine, t: u32, step: u64, arg: usize| Contribution {
        slot,
        t,
        step,
        arg: arg as u64,
        block: None,
    };
    // A map's operands, `t` from the last, operand by operand; steps from `first_step`.
    let map = |m: &MapLoop, first_step: u64, out: &mut Vec<Contribution>| {
        for (k, t) in (0..m.len).rev().enumerate() {
            for (i, a) in backward_operands(m, from_last) {
                out.push(Contribution {
                    block: vertical_block(t, m.len),
                    ..at(a, t, first_step + k as u64, i)
                });
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
            let (sum, head) = (&dot.sum, dot.head());
            if sum.grad_first {
                out.push(at(sum.first, 0, 0, 0));
            }
            if sum.grad_tail {
                out.extend((0..head).map(|t| at(sum.tail, t, 1 + t as u64, 0)));
            }
            map(&dot.products, 1 + head as u64, &mut out);
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

/// A map's operands that take gradients, with their indices, in the order its backward adds
/// into them: the operands' order, or from the last (`from_last`: a chain's link in lanes,
/// [`crate::plan::NestPlan::operands_from_last`]).
pub fn backward_operands(m: &MapLoop, from_last: bool) -> Vec<(usize, Affine)> {
    let mut operands: Vec<(usize, Affine)> = (m.args.iter().copied().enumerate())
        .filter(|&(i, _)| m.grad_args[i])
        .collect();
    if from_last {
        operands.reverse();
    }
    operands
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

/// Steps of a map (a dot's products, say) whose additions into the operand every lane
/// shares run as one block, in [`Lanes::Both`](crate::plan::Lanes::Both)'s `vertical`
/// order: a vector of doubles, one per step.
pub const VERTICAL_BLOCK: u32 = 8;

/// The vertical order's block of step `t` of a map of `len` steps, counted from the last
/// block: whole blocks from step 0; `None` for the steps after the last whole one, which
/// backward runs first, lane by lane (a layer of 50 inputs: 6 blocks, then steps 48-49).
pub fn vertical_block(t: u32, len: u32) -> Option<u64> {
    let whole = len - len % VERTICAL_BLOCK;
    (t < whole).then(|| ((whole - 1 - t) / VERTICAL_BLOCK) as u64)
}

/// The operand of a map `m` (a dot's products, say) that every lane (repetitions of the
/// nest at `level`) shares while it moves with the step, if there is exactly one such
/// operand taking a gradient, the others each lane's own, and the steps make at least one
/// block of [`VERTICAL_BLOCK`]: a layer's inputs, which every neuron reads. Lane by lane,
/// each step adds every lane into it one after another (a chain of dependent additions per
/// step); in the vertical order the blocks' steps take them side by side (the steps after
/// the last whole block, counted from the first, still lane by lane: [`vertical_block`]).
pub fn vertical_arg(m: &MapLoop, level: usize) -> Option<usize> {
    if m.len < VERTICAL_BLOCK {
        return None;
    }
    let taking = || (0..m.args.len()).filter(|&i| m.grad_args[i]);
    let shared = |i: usize| m.args[i].outer[level] == 0;
    let mut shared_args = taking().filter(|&i| shared(i));
    let s = shared_args.next()?;
    let alone = shared_args.next().is_none() && m.args[s].stride != 0;
    alone.then_some(s)
}

/// The map of `item` whose backward (if it has one) may take the vertical order, and the
/// operand its lanes share ([`vertical_arg`] at `level`): a dot's products, or a map of its
/// own (a layer whose sums also add terms no map holds, such as a recurrent cell's input
/// terms).
pub fn vertical_map(item: &Item, level: usize) -> Option<(&MapLoop, usize)> {
    let (map, backward) = match item {
        Item::Dot(dot) => (&dot.products, dot.sum.needs_grad),
        Item::Map(map) => (map, map.needs_grad),
        _ => return None,
    };
    vertical_arg(map, level)
        .filter(|_| backward)
        .map(|shared| (map, shared))
}

/// The order a nest's backward in lanes adds in, as the plan chose it
/// ([`crate::plan::Lanes::Both`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct BackwardOrder<'a> {
    /// Whether the dots with an operand every lane shares add into it in blocks
    /// ([`vertical_arg`]).
    pub vertical: bool,
    /// Per body item: whether its map adds into its operands from the last
    /// ([`backward_operands`]; missing items do not).
    pub from_last: &'a [bool],
}

impl BackwardOrder<'_> {
    fn adds_from_last(&self, k: usize) -> bool {
        self.from_last.get(k) == Some(&true)
    }
}

/// Whether backward in lanes, with groups of `size` repetitions and in `order`, adds every
/// gradient's contributions in the interpreter's order (repetitions from the last, items
/// from the last, each item's steps in order). Walks the lane order, checking that each
/// slot's contributions come in increasing interpreter rank: linear in the additions.
pub fn backward_lanes_keep_order(
    body: &[Item],
    count: u32,
    size: u32,
    order: BackwardOrder,
) -> bool {
    first_out_of_order(body, count, size, order).is_none()
}

/// The body item whose addition the walk of [`backward_lanes_keep_order`] first finds out of
/// the interpreter's order, if any.
pub fn first_out_of_order(
    body: &[Item],
    count: u32,
    size: u32,
    order: BackwardOrder,
) -> Option<usize> {
    let per_item: Vec<Vec<Contribution>> = (body.iter().enumerate())
        .map(|(k, item)| contributions(item, order.adds_from_last(k)))
        .collect();
    // (No additions: none out of order.)
    let span = per_item
        .iter()
        .flatten()
        .map(|c| c.slot.span(c.t + 1, count))
        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))?;
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
            let shared = vertical_map(&body[k], 0)
                .filter(|_| order.vertical)
                .map(|(_, shared)| shared);
            for (c, j) in lane_order(cs, lanes.clone(), shared) {
                let slot = (c.slot.at_nested(c.t, j).0 - span.start) as usize;
                let r = rank(j, k, c) + 1;
                let last = last.at(slot);
                if *last >= r {
                    return Some(k);
                }
                *last = r;
            }
        }
    }
    None
}

/// The order in which the lanes `lanes` make an item's contributions `cs`: step by step,
/// operand by operand, repetitions from the last. With a map's `shared` operand (the
/// vertical order): the map's steps in blocks of [`VERTICAL_BLOCK`], each block's other
/// operands in that order, then the shared operand's contributions of the block lane by lane
/// from the last, the block's steps within each lane.
fn lane_order(
    cs: &[Contribution],
    lanes: std::ops::Range<u32>,
    shared: Option<usize>,
) -> Vec<(&Contribution, u32)> {
    fn each_lane(
        c: &Contribution,
        lanes: std::ops::Range<u32>,
    ) -> impl Iterator<Item = (&Contribution, u32)> {
        lanes.rev().map(move |j| (c, j))
    }
    let Some(shared) = shared.map(|s| s as u64) else {
        return cs
            .iter()
            .flat_map(|c| each_lane(c, lanes.clone()))
            .collect();
    };
    let block = |c: &Contribution| c.block;
    let mut order = Vec::with_capacity(cs.len() * lanes.len());
    let mut rest = cs;
    while let Some(first) = rest.first() {
        let b = block(first);
        let end = rest
            .iter()
            .position(|c| block(c) != b)
            .unwrap_or(rest.len());
        let (now, later) = rest.split_at(end);
        rest = later;
        let is_shared = |c: &&Contribution| b.is_some() && c.arg == shared;
        order.extend(
            now.iter()
                .filter(|c| !is_shared(c))
                .flat_map(|c| each_lane(c, lanes.clone())),
        );
        for j in lanes.clone().rev() {
            order.extend(now.iter().filter(is_shared).map(|c| (c, j)));
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Op;
    use crate::passes::schedule::MAX_NEST_DEPTH;

    /// A link of a chain in a nest of `count`: repetition `j` writes `100 + j` from
    /// `x[j + 1] - x[j]` (slots `j + 1` and `j`), as a spring reads its mass and the one
    /// before.
    fn link(count: u32) -> (Vec<Item>, u32) {
        let at = |base, across| Affine {
            base,
            stride: 0,
            outer: {
                let mut outer = [0; MAX_NEST_DEPTH];
                outer[0] = across;
                outer
            },
        };
        let map = MapLoop {
            op: Op::Sub,
            out: at(100, 1),
            args: vec![at(1, 1), at(0, 1)],
            len: 1,
            needs_grad: true,
            grad_args: vec![true, true],
        };
        (vec![Item::Map(map)], count)
    }

    /// Slot `j` takes `-g` from repetition `j + 1` first (the interpreter runs repetitions
    /// from the last), then `g` from repetition `j`: lanes adding operand by operand reach it
    /// from `j` first; from the last operand, in the interpreter's order.
    #[test]
    fn a_chains_link_keeps_the_order_in_lanes_adding_from_the_last_operand() {
        let (body, count) = link(8);
        for group in [1, 4, 8] {
            let plain = first_out_of_order(&body, count, group, BackwardOrder::default());
            assert_eq!(plain, (group > 1).then_some(0), "group {group}");
            let from_last = BackwardOrder {
                vertical: false,
                from_last: &[true],
            };
            assert_eq!(first_out_of_order(&body, count, group, from_last), None);
        }
    }
}
