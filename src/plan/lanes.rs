//! Which nests run their repetitions side by side in vector lanes, and how many at a time.
//!
//! A nest whose body holds no nest runs in lanes where `passes::lanes` proves it exact:
//! forward when no repetition reads what another writes, backward when the lane order adds
//! every gradient's contributions in the interpreter's order. Nests of nests run one
//! repetition after the other.

use crate::passes::lanes::{backward_lanes_keep_order, repetitions_independent};
use crate::passes::loops::{Item, Lanes, Nest};

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

/// `item` with its lanes decided (a nest's; anything else is returned as it is).
pub fn decide(item: &Item) -> Item {
    let Item::Nest(nest) = item else {
        return item.clone();
    };
    let flat = nest.body.iter().all(|b| !matches!(b, Item::Nest(_)));
    let group = lane_group(nest.count);
    let lanes = if !flat || !repetitions_independent(&nest.body, nest.count) {
        Lanes::None
    } else if backward_lanes_keep_order(&nest.body, nest.count, group) {
        Lanes::Both { group }
    } else {
        Lanes::Forward { group }
    };
    Item::Nest(Nest {
        lanes,
        ..nest.clone()
    })
}
