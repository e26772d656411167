//! Param layout: where each param lives in the buffers.
//!
//! The graph numbers params in creation order, which for a layer is neuron by neuron: the
//! weight a neuron applies to input `t` sits one whole row away from the next neuron's. A
//! [`Nest`] computes its repetitions (neurons) side by side, so it wants the opposite: the
//! weights of all neurons for one input next to each other. This pass moves every param
//! matrix a nest reads into that order (input-major, repetition-minor), which makes the
//! lowering's loads unit-stride across repetitions, and rewrites the schedule it was given to
//! the moved slots. Nests inside nests count too, for the params the nests around them share
//! (a layer applied to every copy of a batch, or at every step of a rollout). Only slots
//! move; no operation changes, so results stay bit-identical.
//!
//! A top-level loop over params in creation order (an L2 term, `sum(p * p for p in params)`)
//! reads a moved matrix transposed: no longer affine. Its nodes go back to structure
//! recovery, over the moved tape, which finds the transposed rows repeating row after row
//! (micrograd's moons demo: its L2 term straight-line was half of its compile time).
//!
//! [`crate::Program::params`] and friends keep speaking creation order.

use crate::error::Result;
use crate::passes::nest;
use crate::passes::schedule::{
    every_iteration, number_nests, AccessKind, Affine, Item, Nest, Schedule, SumLoop,
};
use crate::tape::Tape;

/// `tape` and `schedule` with the params of `schedule`'s nests laid out input-major; both
/// unchanged if no param moves, or if some loop's slots would stop being affine.
pub fn apply(tape: Tape, schedule: Schedule) -> Result<(Tape, Schedule)> {
    let Some(from) = param_layout(&tape, &schedule) else {
        return Ok((tape, schedule));
    };
    let mut to = vec![0u32; from.len()];
    for (s, &f) in from.iter().enumerate() {
        to[f as usize] = s as u32;
    }
    let mut items = Vec::with_capacity(schedule.items.len());
    // The nodes of loops that stopped being loops, as straight-line ranges, by index in
    // `items`.
    let mut unrolled = Vec::new();
    for item in &schedule.items {
        let mut ok = true;
        let moved = remap(item, &to, &[], &mut ok);
        if ok {
            items.push(moved);
            continue;
        }
        // A loop over params in creation order (an L2 term) is no longer one once they
        // moved. Inside a nest there is no way out.
        let Some((nodes, sum)) = unrolled_nodes(item) else {
            return Ok((tape, schedule));
        };
        unrolled.push(items.len());
        items.push(nodes);
        if let Some(sum) = sum {
            let mut ok = true;
            items.push(remap(&Item::Sum(Box::new(sum.clone())), &to, &[], &mut ok));
            if !ok {
                return Ok((tape, schedule));
            }
        }
    }
    let moved = tape.into_param_layout(&from)?;
    // Their repetitions are there still, with the moved params' slots: a matrix's rows,
    // transposed, repeat with a stride of one row. Structure recovery finds them again.
    for &at in unrolled.iter().rev() {
        let nodes = std::mem::replace(&mut items[at], Item::Straight(0..0));
        items.splice(at..=at, nest::recover(&moved, vec![nodes]));
    }
    let schedule = Schedule {
        nests: number_nests(&mut items),
        loops: items.iter().map(Item::loops).sum(),
        loop_nodes: items.iter().map(Item::loop_nodes).sum(),
        items,
    };
    Ok((moved, schedule))
}

/// A top-level loop as the straight-line range of the nodes it computes, and a dot's sum
/// apart (a loop of its own over the products, which reach memory now); `None` for items
/// that are not a top-level loop.
fn unrolled_nodes(item: &Item) -> Option<(Item, Option<&SumLoop>)> {
    let (map, sum) = match item {
        Item::Map(m) => (m, None),
        // A dot added one `+` at a time: its products and links, node after node.
        Item::Dot(d) if d.sum.links.is_some() => {
            let (first, last) = (d.products.out.at(0).0, d.sum.slot.at(0).0);
            return Some((Item::Straight(first..last + 1), None));
        }
        Item::Dot(d) => (&d.products, Some(&d.sum)),
        _ => return straight_line(item).map(|s| (s, None)),
    };
    if map.out.stride != 1 {
        return None;
    }
    let (first, last) = (map.out.at(0).0, map.out.at(map.len - 1).0);
    Some((Item::Straight(first..last + 1), sum))
}

/// The param layout for `schedule`'s nests as `from` for [`Tape::with_param_layout`] (the
/// param now in slot `from[s]` moves to slot `s`), or `None` if every param stays.
pub fn param_layout(tape: &Tape, schedule: &Schedule) -> Option<Vec<u32>> {
    let p = tape.num_params();
    let mut placed = vec![false; p];
    let mut from = Vec::with_capacity(p);
    let mut place = |slots: Vec<u32>| {
        let free = slots
            .iter()
            .all(|&s| (s as usize) < p && !placed[s as usize]);
        let distinct = free && {
            let mut seen = slots.clone();
            seen.sort_unstable();
            seen.windows(2).all(|w| w[0] != w[1])
        };
        if distinct {
            for &s in &slots {
                placed[s as usize] = true;
            }
            from.extend(slots);
        }
    };
    for nest in flat_nests(&schedule.items) {
        let level = nest.level;
        for (a, len) in operands(nest.nest) {
            // Params the nests around share (the same in every repetition of theirs), read
            // at a different slot by each repetition of this one.
            if a.outer[level] == 0 || a.outer[..level].iter().any(|&o| o != 0) {
                continue;
            }
            // Input-major: every repetition's slot for `t`, then for `t + 1`.
            let mut js = vec![0; level + 1];
            let slots: Vec<u32> = (0..len)
                .flat_map(|t| (0..nest.nest.count).map(move |j| (t, j)))
                .map(|(t, j)| {
                    js[level] = j;
                    a.at_levels(t, &js).0
                })
                .collect();
            place(slots);
        }
    }
    from.extend((0..p as u32).filter(|&s| !placed[s as usize]));
    let moved = from.iter().enumerate().any(|(s, &f)| s as u32 != f);
    moved.then_some(from)
}

/// A top-level sum as the straight-line range of its one slot.
fn straight_line(item: &Item) -> Option<Item> {
    match item {
        Item::Sum(sum) => {
            let s = sum.slot.at(0).0;
            Some(Item::Straight(s..s + 1))
        }
        _ => None,
    }
}

/// A nest whose body holds no nest, inside `level` nests.
struct FlatNest<'s> {
    nest: &'s Nest,
    level: usize,
}

/// Every nest of `items` whose body holds no nest, at any depth, in tape order.
fn flat_nests(items: &[Item]) -> Vec<FlatNest<'_>> {
    fn visit<'s>(items: &'s [Item], level: usize, out: &mut Vec<FlatNest<'s>>) {
        for item in items {
            let Item::Nest(nest) = item else { continue };
            if nest.body.iter().any(|b| matches!(b, Item::Nest(_))) {
                visit(&nest.body, level + 1, out);
            } else {
                out.push(FlatNest { nest, level });
            }
        }
    }
    let mut out = Vec::new();
    visit(items, 0, &mut out);
    out
}

/// The operands a nest of one level reads, each with its length along `t` (nests in its
/// body keep their layout).
fn operands(nest: &Nest) -> Vec<(Affine, u32)> {
    if nest.body.iter().any(|b| matches!(b, Item::Nest(_))) {
        return Vec::new();
    }
    nest.body
        .iter()
        .flat_map(Item::accesses)
        .filter(|a| matches!(a.kind, AccessKind::Reads { .. }))
        .map(|a| (a.at, a.len))
        .collect()
}

/// `item` (inside nests of `counts` repetitions, outermost first) with param slot `s` moved
/// to `to[s]`; clears `ok` if a moved sequence is no longer affine.
fn remap(item: &Item, to: &[u32], counts: &[u32], ok: &mut bool) -> Item {
    match item {
        Item::Nest(nest) => {
            let counts: Vec<u32> = counts.iter().copied().chain([nest.count]).collect();
            Item::Nest(Nest {
                body: nest
                    .body
                    .iter()
                    .map(|b| remap(b, to, &counts, ok))
                    .collect(),
                ..nest.clone()
            })
        }
        Item::Straight(_) | Item::SumPart { .. } => item.clone(),
        _ => item.map_affines(&mut |a, len| {
            remap_affine(a, len, counts, to).unwrap_or_else(|| {
                *ok = false;
                a
            })
        }),
    }
}

/// `a` over `t < len` and the nests' repetitions with params moved, if still affine.
fn remap_affine(a: Affine, len: u32, counts: &[u32], to: &[u32]) -> Option<Affine> {
    let p = to.len() as i64;
    let moved = |s: u32| if (s as i64) < p { to[s as usize] } else { s };
    // A level the sequence does not move along adds no slots: one repetition of it says all.
    let counts: Vec<u32> = counts
        .iter()
        .zip(&a.outer)
        .map(|(&count, &o)| if o == 0 { count.min(1) } else { count })
        .collect();
    if a.bounds(len, &counts).0 >= p {
        return Some(a);
    }
    let origin = moved(a.at(0).0) as i64;
    let mut b = Affine { base: origin, ..a };
    if len > 1 {
        b.stride = moved(a.at(1).0) as i64 - origin;
    }
    for (level, &count) in counts.iter().enumerate() {
        if count > 1 {
            let mut js = vec![0; counts.len()];
            js[level] = 1;
            b.outer[level] = moved(a.at_levels(0, &js).0) as i64 - origin;
        }
    }
    let affine = every_iteration(&counts, len, |t, js| {
        b.at_levels(t, js).0 == moved(a.at_levels(t, js).0)
    });
    affine.then_some(b)
}
