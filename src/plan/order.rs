//! The order in which forward runs a nest's body items, where the nest's repetitions run one
//! after the other.
//!
//! Such a nest is usually a rollout: each repetition reads what the one before computed (an
//! RNN's state), so forward waits at every repetition on the chain through the items that
//! compute what the next repetition reads. Items off that chain (the RNN's readout of the
//! state just computed, which only the loss reads) are best issued after it, where the
//! processor runs them while the chain waits, rather than before it, where they hold up its
//! start: the items the next repetition reads first, then the others, each in body order
//! ([`super::NestPlan::forward_order`]; RNN T = 50: 6.2 -> 5.8 us per step).
//!
//! Values do not depend on the order in which independent items compute them, so forward may
//! run any order in which every item follows those whose values of the same repetition it
//! reads. Backward keeps the body's order (its additions' order is the interpreter's).

use std::collections::HashSet;

use super::nests::{Lanes, Nests};
use crate::passes::schedule::{every_repetition, Access, AccessKind, Item, Nest};

/// Decides the forward order of every nest in `item` (their lanes decided in `nests`) into
/// `nests`.
pub fn decide(item: &Item, nests: &mut Nests) {
    decide_within(item, &[], nests)
}

/// [`decide`] for an item inside nests of `outer` repetitions (outermost first).
fn decide_within(item: &Item, outer: &[u32], nests: &mut Nests) {
    let Item::Nest(nest) = item else {
        return;
    };
    let within: Vec<u32> = outer.iter().copied().chain([nest.count]).collect();
    for b in &nest.body {
        decide_within(b, &within, nests);
    }
    if nests.of(nest).lanes == Lanes::None {
        nests.of_mut(nest).forward_order = forward_order(nest, outer);
    }
}

/// The order of [`NestPlan::forward_order`](super::NestPlan::forward_order) for `nest`
/// (inside nests of `outer` repetitions, running one repetition after the other): the items
/// on the chain (those that compute what the next repetition reads, and those whose values
/// of the same repetition these read) first, the others after the chain's last item; empty
/// for the body's own order, where nothing moves, or where in some repetition an item on the
/// chain reads what an item that moves computes.
pub fn forward_order(nest: &Nest, outer: &[u32]) -> Vec<u32> {
    let n = nest.body.len();
    if nest.count < 2 || n < 2 {
        return Vec::new();
    }
    let level = outer.len();
    let ranges = |i: usize, kind: Kind| -> Vec<SlotRange> {
        let accesses = nest.body[i].nested_accesses().into_iter();
        let accesses = accesses.filter(|(a, _)| Kind::of(a) == kind);
        accesses
            .map(|(a, inner)| SlotRange::new(&a, outer, level, &inner))
            .collect()
    };
    // The chain starts at what repetition 1 reads of what repetition 0 wrote (below): where
    // their ranges say it reads none of it (a batch's copies), there is none, found without
    // listing every slot they read.
    let all = |kind: Kind| -> Vec<SlotRange> { (0..n).flat_map(|i| ranges(i, kind)).collect() };
    let written = all(Writes);
    if all(Reads)
        .iter()
        .all(|r| written.iter().all(|w| w.apart_from_next(r)))
    {
        return Vec::new();
    }
    // The chain, found in the first two repetitions (in the first of the nests around).
    let mut first = vec![0; outer.len() + 1];
    let read_next: HashSet<u32> = {
        first[outer.len()] = 1;
        let reads = nest.body.iter().flat_map(|item| slots(item, &first, Reads));
        let reads = reads.collect();
        first[outer.len()] = 0;
        reads
    };
    let mut on_chain = vec![false; n];
    let mut chain_reads = HashSet::new();
    for i in (0..n).rev() {
        let writes: Vec<u32> = slots(&nest.body[i], &first, Writes).collect();
        on_chain[i] = writes
            .iter()
            .any(|s| read_next.contains(s) || chain_reads.contains(s));
        if on_chain[i] {
            chain_reads.extend(slots(&nest.body[i], &first, Reads));
        }
    }
    let Some(last) = on_chain.iter().rposition(|&c| c) else {
        return Vec::new();
    };
    let moved: Vec<usize> = (0..last).filter(|&i| !on_chain[i]).collect();
    if moved.is_empty() {
        return Vec::new();
    }
    let chain: Vec<usize> = (0..=last).filter(|&i| on_chain[i]).collect();
    // In every repetition, no item on the chain reads what an item that moves computes: the
    // ranges of slots they write and read, which move linearly with the repetition, stay
    // apart from the first repetition to the last.
    let written: Vec<SlotRange> = moved.iter().flat_map(|&i| ranges(i, Writes)).collect();
    let last_j = nest.count as i64 - 1;
    let legal = chain
        .iter()
        .filter(|&&i| i > moved[0])
        .flat_map(|&i| ranges(i, Reads))
        .all(|r| written.iter().all(|w| w.apart(&r, last_j)));
    if !legal {
        return Vec::new();
    }
    let order = chain.iter().chain(&moved).copied().chain(last + 1..n);
    order.map(|i| i as u32).collect()
}

use Kind::{Reads, Writes};

/// Which accesses [`slots`] lists.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Reads,
    Writes,
}

impl Kind {
    fn of(access: &Access) -> Kind {
        match access.kind {
            AccessKind::Reads { .. } => Reads,
            AccessKind::Writes { .. } => Writes,
        }
    }
}

/// The slots an access reaches in repetition `j` of its nest, within
/// `lo + step * j ..= hi + step * j` (every iteration, every repetition of the nests inside,
/// and, conservatively, of the nests around).
struct SlotRange {
    lo: i64,
    hi: i64,
    step: i64,
}

impl SlotRange {
    /// The range of `access` at nest level `level`, inside nests of `outer` repetitions,
    /// with nests of `inner` repetitions inside.
    fn new(access: &Access, outer: &[u32], level: usize, inner: &[u32]) -> SlotRange {
        let a = access.at;
        let moves = std::iter::once((a.stride, access.len))
            .chain(outer.iter().enumerate().map(|(l, &n)| (a.outer[l], n)))
            .chain(
                inner
                    .iter()
                    .enumerate()
                    .map(|(k, &n)| (a.outer[level + 1 + k], n)),
            );
        let (mut lo, mut hi) = (a.base, a.base);
        for (stride, n) in moves {
            let reach = stride * (n as i64 - 1);
            lo += reach.min(0);
            hi += reach.max(0);
        }
        SlotRange {
            lo,
            hi,
            step: a.outer[level],
        }
    }

    /// Whether `self` in repetition 0 and `next` in repetition 1 share no slot.
    fn apart_from_next(&self, next: &SlotRange) -> bool {
        let (lo, hi) = (next.lo + next.step, next.hi + next.step);
        hi < self.lo || self.hi < lo
    }

    /// Whether `self` and `other` share no slot in any repetition `0..=last` (their
    /// distance is linear in it: apart at both ends, with the same one first, is apart
    /// throughout).
    fn apart(&self, other: &SlotRange, last: i64) -> bool {
        let below = |a: &SlotRange, b: &SlotRange, j: i64| a.hi + a.step * j < b.lo + b.step * j;
        (below(self, other, 0) && below(self, other, last))
            || (below(other, self, 0) && below(other, self, last))
    }
}

/// The value slots `item` reads or writes in repetition `js` of the nests around it (the
/// last of `js` the nest whose body holds it), in every repetition of the nests inside it.
fn slots(item: &Item, js: &[u32], kind: Kind) -> impl Iterator<Item = u32> {
    let mut out = Vec::new();
    for (access, inner) in item.nested_accesses() {
        if Kind::of(&access) != kind {
            continue;
        }
        every_repetition(&inner, |inner_js| {
            let at: Vec<u32> = js.iter().chain(inner_js).copied().collect();
            out.extend((0..access.len).map(|t| access.at.at_levels(t, &at).0));
            true
        });
    }
    out.into_iter()
}
