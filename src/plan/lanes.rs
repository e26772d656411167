//! Which nests run their repetitions side by side in vector lanes, and how many at a time.
//!
//! A nest whose body holds no nest runs in lanes where `passes::lane_order` proves it exact:
//! forward when no repetition reads what another writes, backward when the lane order adds
//! every gradient's contributions in the interpreter's order; and only where it pays: enough
//! of the body's accesses must be vector loads, stores or broadcasts ([`mostly_strided`]).
//! Nests of nests run one repetition after the other, and the nests in their bodies in lanes
//! where the analyses hold in every repetition of the nests around.

use super::nests::{Lanes, Nests};
use super::Buffers;
use crate::passes::lane_order::{
    backward_lanes_keep_order, first_out_of_order, repetitions_independent, vertical_map,
    BackwardOrder,
};
use crate::passes::schedule::{iteration, Item, Nest, MAX_NEST_DEPTH};

/// At most this many repetitions run together in lanes (eight vectors of eight).
pub const MAX_LANE_GROUP: u32 = 64;

/// Lanes per vector: eight doubles, one AVX-512 register (LLVM splits it where vectors are
/// narrower).
pub const VECTOR_WIDTH: u32 = 8;

/// How many of a nest's `count` repetitions run together: all of them up to
/// [`MAX_LANE_GROUP`], else the largest multiple of [`VECTOR_WIDTH`] up to it that divides
/// `count` (no ragged last group: its code would be a second copy), else [`MAX_LANE_GROUP`].
pub fn lane_group(count: u32) -> u32 {
    if count <= MAX_LANE_GROUP {
        return count;
    }
    (1..=MAX_LANE_GROUP / VECTOR_WIDTH)
        .rev()
        .map(|v| VECTOR_WIDTH * v)
        .find(|g| count % g == 0)
        .unwrap_or(MAX_LANE_GROUP)
}

/// Lanes need at least this share (in percent) of a body's accesses to be vector loads and
/// stores (consecutive slots across lanes) or broadcasts (one slot for every lane).
pub const MIN_VECTOR_ACCESS_PERCENT: u64 = 15;

/// Whether a flat nest's `body` (its own repetitions at `level`) reads and writes mostly
/// slots whose addresses ([`Buffers`]: a nest's values lie item by item) are neither side
/// by side nor shared across its repetitions, counted over each access's sequence. Lanes
/// reach those by gathers and scatters, which cost about what the scalar loop's loads and
/// stores do (an AVX-512 scatter more), on top of building a vector of addresses each;
/// their faster arithmetic does not make up for it. A mass-spring chain's masses (each
/// reading its neighbours' state) run forward 17% faster one after the other, the moons
/// demo's per-point loss 7-10%.
fn mostly_strided(body: &[Item], level: usize, buffers: &Buffers) -> bool {
    let (mut vector, mut all) = (0u64, 0u64);
    for access in body.iter().flat_map(Item::accesses) {
        all += access.len as u64;
        if matches!(buffers.affine(access.at).outer[level], 0 | 1) {
            vector += access.len as u64;
        }
    }
    vector * 100 < all * MIN_VECTOR_ACCESS_PERCENT
}

/// Decides the lanes of `item`'s nests (a nest's, and those of the nests in its body) into
/// `nests`, its slots at the addresses `buffers` gives them.
pub fn decide(item: &Item, buffers: &Buffers, nests: &mut Nests) {
    decide_within(item, &[], buffers, false, nests)
}

/// [`decide`], checking a nest in every repetition of the nests around even where
/// [`alike_in_every_repetition`] says the first decides them all.
#[cfg(test)]
pub fn decide_checking_every_repetition(item: &Item, buffers: &Buffers, nests: &mut Nests) {
    decide_within(item, &[], buffers, true, nests)
}

/// [`decide`] for an item inside nests of `outer` repetitions (outermost first).
fn decide_within(
    item: &Item,
    outer: &[u32],
    buffers: &Buffers,
    check_each: bool,
    nests: &mut Nests,
) {
    let Item::Nest(nest) = item else {
        return;
    };
    let flat = nest.body.iter().all(|b| !matches!(b, Item::Nest(_)));
    if !flat {
        // The nest runs one repetition after the other; the nests in its body may not.
        let within: Vec<u32> = outer.iter().copied().chain([nest.count]).collect();
        for b in &nest.body {
            decide_within(b, &within, buffers, check_each, nests);
        }
        return;
    }
    let instances = every_instance(nest, outer, check_each);
    let group = lane_group(nest.count);
    // The vertical order where some map has a shared operand (it is faster), if it keeps
    // every gradient's order; else the plain lane order, with some maps' operands from the
    // last if that keeps it.
    let vertical = BackwardOrder {
        vertical: true,
        from_last: &[],
    };
    let vertical_keeps_order = || {
        instances
            .iter()
            .all(|body| backward_lanes_keep_order(body, nest.count, group, vertical))
    };
    let has_vertical = nest.body.iter().any(|b| vertical_map(b, 0).is_some());
    let decided = nests.of_mut(nest);
    decided.lanes = if mostly_strided(&nest.body, outer.len(), buffers)
        || !instances
            .iter()
            .all(|body| repetitions_independent(body, nest.count))
    {
        Lanes::None
    } else if has_vertical && vertical_keeps_order() {
        Lanes::Both {
            group,
            vertical: true,
        }
    } else if let Some(from_last) = operands_from_last(&instances, nest.count, group) {
        if from_last.contains(&true) {
            decided.operands_from_last = from_last;
        }
        Lanes::Both {
            group,
            vertical: false,
        }
    } else {
        Lanes::Forward { group }
    };
}

/// That the lanes `nests` gives `item`'s nests (a nest's, and those of the nests in its body,
/// inside nests of `outer` repetitions) are ones [`decide`] could have chosen: forward in
/// lanes only where no repetition reads what another writes, backward in lanes only where
/// the lane order (plain or vertical, with the maps' operand orders as the plan has them)
/// adds every gradient's contributions in the interpreter's order.
/// [`Plan::verify`](super::Plan::verify) asks it of every item, so no plan that would change
/// a bit reaches the emitter.
pub fn check(item: &Item, outer: &[u32], nests: &Nests) -> Result<(), String> {
    let Item::Nest(nest) = item else {
        return Ok(());
    };
    let plan = nests.of(nest);
    let Some(group) = plan.lanes.forward() else {
        let within: Vec<u32> = outer.iter().copied().chain([nest.count]).collect();
        return nest.body.iter().try_for_each(|b| check(b, &within, nests));
    };
    let instances = every_instance(nest, outer, false);
    if !instances
        .iter()
        .all(|body| repetitions_independent(body, nest.count))
    {
        return Err("lanes over repetitions that read what others write".into());
    }
    if plan.lanes.backward().is_some() {
        let order = plan.backward_order();
        let keeps = |body: &Vec<Item>| backward_lanes_keep_order(body, nest.count, group, order);
        if !instances.iter().all(keeps) {
            return Err(format!(
                "backward lanes in groups of {group} that reorder a gradient's additions"
            ));
        }
    }
    Ok(())
}

/// Which maps of a flat nest's body (in every one of its `instances`) add into their
/// operands from the last in backward, so that lanes in groups of `group` keep every
/// gradient's order in the plain lane order ([`super::NestPlan::operands_from_last`]);
/// `None` if no choice does. Greedy: each item the walk finds out of order turns, once, to
/// the other operand order (a spring chain: the link reading `x[s] - x[s - 1]`); at most one
/// walk per item.
fn operands_from_last(instances: &[Vec<Item>], count: u32, group: u32) -> Option<Vec<bool>> {
    let len = instances.first().map_or(0, Vec::len);
    let mut from_last = vec![false; len];
    loop {
        let order = BackwardOrder {
            vertical: false,
            from_last: &from_last,
        };
        let first_wrong = instances
            .iter()
            .find_map(|body| first_out_of_order(body, count, group, order));
        let Some(k) = first_wrong else {
            return Some(from_last);
        };
        let turnable = matches!(&instances[0][k],
            Item::Map(m) if m.grad_args.iter().filter(|&&g| g).count() > 1);
        if from_last[k] || !turnable {
            return None;
        }
        from_last[k] = true;
    }
}

/// A flat `nest`'s body as it stands in every repetition of the nests around (of `outer`
/// repetitions): lanes reorder the repetitions within one of those, so the analyses must
/// hold in each (a repetition's slots differ from the next one's). Only the first where
/// [`alike_in_every_repetition`] says it decides them all, unless `check_each`.
fn every_instance(nest: &Nest, outer: &[u32], check_each: bool) -> Vec<Vec<Item>> {
    if !check_each && alike_in_every_repetition(&nest.body, outer, nest.count) {
        instances(&nest.body, &vec![1; outer.len()])
    } else {
        instances(&nest.body, outer)
    }
}

/// Whether a flat `nest` inside nests of `outer` repetitions may run in lanes: no
/// repetition reads what another writes (whether lanes pay, and in which order backward
/// runs, [`decide`] says).
pub fn may_run_in_lanes(nest: &Nest, outer: &[u32]) -> bool {
    every_instance(nest, outer, false)
        .iter()
        .all(|body| repetitions_independent(body, nest.count))
}

/// `body` as it stands in each repetition of the nests around it (of `outer` repetitions,
/// outermost first): its outer levels fixed, its own level outermost.
fn instances(body: &[Item], outer: &[u32]) -> Vec<Vec<Item>> {
    let mut bodies = vec![body.to_vec()];
    for &count in outer {
        bodies = bodies
            .iter()
            .flat_map(|b| {
                (0..count as i64).map(move |j| b.iter().map(|item| iteration(item, j)).collect())
            })
            .collect();
    }
    bodies
}

/// Whether `body` (of a nest of `count` repetitions inside nests of `outer` repetitions,
/// outermost first) meets the lane analyses alike in every repetition of the nests around,
/// so that checking the first decides them all. The analyses compare slots only for
/// equality. Group the accesses by how they move across the nests around (a batch's params
/// stay, a copy's values move by the copy's stride): within a group every repetition is the
/// first moved as a whole, so equal slots stay equal and distinct ones distinct; and where no
/// group's slots (over every repetition) reach another group's, no two groups ever meet.
/// Then a nest of 50 neurons inside 128 copies is checked once, not 128 times.
fn alike_in_every_repetition(body: &[Item], outer: &[u32], count: u32) -> bool {
    let levels = outer.len();
    let counts: Vec<u32> = outer.iter().copied().chain([count]).collect();
    let mut groups: Vec<([i64; MAX_NEST_DEPTH], (i64, i64))> = Vec::new();
    for access in body.iter().flat_map(Item::accesses) {
        let mut moves = [0; MAX_NEST_DEPTH];
        moves[..levels].copy_from_slice(&access.at.outer[..levels]);
        let (lo, hi) = access.at.bounds(access.len, &counts);
        match groups.iter_mut().find(|(m, _)| *m == moves) {
            Some((_, span)) => *span = (span.0.min(lo), span.1.max(hi)),
            None => groups.push((moves, (lo, hi))),
        }
    }
    let mut spans: Vec<(i64, i64)> = groups.into_iter().map(|(_, span)| span).collect();
    spans.sort_unstable();
    spans.windows(2).all(|w| w[0].1 < w[1].0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::Op;
    use crate::passes::schedule::{Affine, MapLoop};

    /// A map of 5 iterations in a nest of 4 repetitions inside one of 3: it writes a block
    /// per repetition (moving by 20 per outer one) and reads `read`.
    fn map_reading(read: Affine) -> Vec<Item> {
        let out = Affine {
            base: 100,
            stride: 1,
            outer: [20, 5, 0, 0],
        };
        vec![Item::Map(MapLoop {
            op: Op::Neg,
            out,
            args: vec![read],
            len: 5,
            needs_grad: true,
            grad_args: vec![true],
        })]
    }

    #[test]
    fn the_first_repetition_decides_only_where_groups_of_slots_never_meet() {
        let shared = |base| Affine {
            base,
            stride: 1,
            outer: [0, 5, 0, 0],
        };
        // Shared slots 0..20 lie below every repetition's 100..160.
        assert!(alike_in_every_repetition(&map_reading(shared(0)), &[3], 4));
        // Shared slots 110..130 meet the writes of the first two outer repetitions only.
        assert!(!alike_in_every_repetition(
            &map_reading(shared(110)),
            &[3],
            4
        ));
        // Reads that move with the writes (the previous block) form their group.
        let previous = Affine {
            base: 95,
            stride: 1,
            outer: [20, 5, 0, 0],
        };
        assert!(alike_in_every_repetition(&map_reading(previous), &[3], 4));
    }
}
