//! Which gradients a nest adds over its repetitions after its backward
//! ([`SharedGrad`]), instead of in every repetition.
//!
//! A batch written as copies shares its weights: every copy's backward adds its one
//! contribution into the same weight gradients, so each copy reads and writes all of them
//! again (a store feeding the next copy's load). Added after the copies, each weight's
//! contributions from the last copy to the first meet in a register, and the gradient
//! crosses memory once: the same additions, in the same order.

use super::nests::{Nests, SharedGrad};
use crate::passes::schedule::{AccessKind, Item, Nest};
use crate::tape::{Slot, Tape};

/// The repetitions whose contributions a shared gradient adds in registers before storing
/// the running sum: the products' gradients of that many repetitions are held (spilled to
/// the stack where registers run out, which is as cheap as the loads they replace).
pub const SHARED_CHUNK: u32 = 8;

/// Decides the shared gradients of `item` (a nest's; its lanes, and its body's, decided in
/// `nests`) into `nests`.
pub fn decide(tape: &Tape, item: &Item, nests: &mut Nests) {
    let Item::Nest(nest) = item else {
        return;
    };
    let shared_grads = candidates(nest, nests)
        .filter(|&shared| qualifies(tape, nest, shared, nests))
        .collect();
    nests.of_mut(nest).shared_grads = shared_grads;
}

/// Every operand of a dot of a nest of lanes in the body that takes a gradient and is the
/// same in every repetition of the nest.
fn candidates<'n>(nest: &'n Nest, nests: &'n Nests) -> impl Iterator<Item = SharedGrad> + 'n {
    nest.body.iter().enumerate().flat_map(move |(b, item)| {
        let inner = match item {
            Item::Nest(inner) if nests.of(inner).lanes.backward().is_some() => {
                inner.body.as_slice()
            }
            _ => &[],
        };
        inner.iter().enumerate().flat_map(move |(d, item)| {
            let dot = match item {
                Item::Dot(dot) if dot.sum.needs_grad => Some(&dot.products),
                _ => None,
            };
            dot.into_iter().flat_map(move |m| {
                (0..m.args.len())
                    .filter(|&k| m.grad_args[k] && m.args[k].outer[0] == 0)
                    .map(move |operand| SharedGrad {
                        inner: b,
                        dot: d,
                        operand,
                    })
            })
        })
    })
}

/// Whether `shared` can be added after the repetitions: the nest's backward runs one
/// repetition after the other; the operand's slots are distinct across the lanes and steps,
/// and get no other addition anywhere in the nest; the other operand is no param (`step`
/// may have updated a param by then; nothing changes any other value); and the products'
/// gradients held while adding are few enough.
fn qualifies(tape: &Tape, nest: &Nest, shared: SharedGrad, nests: &Nests) -> bool {
    let Some((inner, dot)) = shared.dot_in(nest) else {
        return false;
    };
    let m = &dot.products;
    let lanes = (nests.of(inner).lanes, nests.of(nest).lanes);
    let (Some(group), true) = (lanes.0.backward(), lanes.1.backward().is_none()) else {
        return false;
    };
    if m.args.len() != 2 || group == 0 {
        return false;
    }
    let other = m.args[1 - shared.operand];
    let params = tape.num_params() as i64;
    if other.bounds(m.len, &[nest.count, inner.count]).0 < params {
        return false;
    }
    // The operand's slots, each once (their number is the nest's body size at most), flagged
    // over the range they span.
    let a = m.args[shared.operand];
    let (lo, hi) = a.bounds(m.len, &[1, inner.count]);
    let span = lo..hi + 1;
    let mut ours = vec![false; (hi + 1 - lo) as usize];
    let at = |s: Slot| (s.0 as i64 - span.start) as usize;
    let mut distinct = true;
    for j in 0..inner.count {
        for t in 0..m.len {
            let s = at(a.at_levels(t, &[0, j]));
            distinct &= !ours[s];
            ours[s] = true;
        }
    }
    // No other addition into them: every other access of the body that adds a gradient
    // (the shared one is the dot's first access of the operand's slots).
    let ours_access = (a, vec![inner.count]);
    let mut alone = distinct;
    for (b, item) in nest.body.iter().enumerate() {
        let mut skipped = b != shared.inner;
        for (access, counts) in item.nested_accesses() {
            if access.kind != (AccessKind::Reads { grad: true }) {
                continue;
            }
            if !skipped && (access.at, counts.clone()) == ours_access {
                skipped = true;
                continue;
            }
            let counts: Vec<u32> = [nest.count].into_iter().chain(counts).collect();
            // (An access whose slots all lie outside the span reaches none of ours.)
            let (lo, hi) = access.at.bounds(access.len, &counts);
            if hi < span.start || lo >= span.end {
                continue;
            }
            access.for_each_slot(&counts, |s| {
                alone &= !span.contains(&(s.0 as i64)) || !ours[at(s)];
            });
        }
    }
    alone
}
