//! Loop recovery: finds the tape's repeated patterns and schedules them as loops
//! ([`super::schedule`]: the shapes it recovers).
//!
//! A graph built by scalar code hides its loops, but not their trace: a dot product is a run
//! of `mul` nodes whose operand slots advance by a constant step, one layer is that run
//! repeated, a `sum` over such a run reads its operands at evenly spaced slots. This pass
//! recovers these shapes, for any graph (nothing here knows about `nn`); a batch written as
//! copies goes to `copies.rs`, repetitions to `nest.rs`.

use std::ops::Range;

use super::copies;
use super::schedule::{ends_with, number_nests, Affine, DotLoop, Item, MapLoop, Schedule, SumLoop};
use crate::op::Op;
use crate::tape::{Slot, Tape};

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
    let recovered = |range| recovered(tape, range);
    out.items = (tape.copies())
        .and_then(|c| copies::items(tape, c, recovered))
        .unwrap_or_else(|| recovered(first..end));
    out.nests = number_nests(&mut out.items);
    out.loops = out.items.iter().map(Item::loops).sum();
    out.loop_nodes = out.items.iter().map(Item::loop_nodes).sum();
    out
}

/// The slots of `range` as loops, nested where they repeat, and straight-line ranges.
pub(super) fn recovered(tape: &Tape, range: Range<u32>) -> Vec<Item> {
    let mut items = Vec::new();
    let mut straight = range.start;
    let mut s = range.start;
    while s < range.end {
        let slot = Slot(s);
        if tape.op(slot).is_leaf() {
            s += 1;
            continue;
        }
        let (item, next) = if let Some(chain) = chained_dot_at(tape, slot, range.end) {
            let next = chain.sum.slot.at(0).0 + 1;
            (Item::Dot(Box::new(chain)), next)
        } else if let Some(run) = map_run_at(tape, slot, range.end) {
            let next = run.out.at(run.len - 1).0 + 1;
            (Item::Map(run), next)
        } else if let Some(sum) = sum_loop_at(tape, slot) {
            (Item::Sum(Box::new(sum)), s + 1)
        } else {
            s += 1;
            continue;
        };
        if straight < s {
            items.push(Item::Straight(straight..s));
        }
        items.push(item);
        s = next;
        straight = s;
    }
    if straight < range.end {
        items.push(Item::Straight(straight..range.end));
    }
    super::nest::recover(tape, fuse_dots(tape, items))
}

/// The next non-leaf slot after `s` and before `end`, if only leaves lie between.
fn next_node(tape: &Tape, s: Slot, end: u32) -> Option<Slot> {
    ((s.0 + 1)..end).map(Slot).find(|&n| !tape.op(n).is_leaf())
}

/// The longest run of nodes isomorphic to `s` with affine slots before `end`, if at least
/// [`MIN_RUN`].
fn map_run_at(tape: &Tape, s: Slot, end: u32) -> Option<MapLoop> {
    tape.op(s).arity()?;
    // (Compared with `s` itself, so that the nodes that start no run, most of a
    // straight-line tape, allocate nothing.)
    let second = next_node(tape, s, end).filter(|&n| same_kind(tape, s, n))?;
    let map = map_through(tape, s, second);
    let mut len = 2;
    // Member `len` must be the very next node after member `len - 1`.
    while let Some(n) = next_node(tape, map.out.at(len - 1), end) {
        if !(n == map.out.at(len) && member(tape, &map, s, n, len)) {
            break;
        }
        len += 1;
    }
    (len >= MIN_RUN).then_some(MapLoop { len, ..map })
}

/// Whether `n` is the node of `s`'s kind: its op, and which of it and its operands take
/// gradients.
fn same_kind(tape: &Tape, s: Slot, n: Slot) -> bool {
    tape.op(n) == tape.op(s)
        && tape.takes_grad(n) == tape.takes_grad(s)
        && (tape.args(n).iter().zip(tape.args(s)))
            .all(|(a, b)| tape.takes_grad(a) == tape.takes_grad(b))
}

/// Whether `n` is member `t` of `map`, whose first member is `s`: of its kind, its operands
/// where the map's are at `t`.
fn member(tape: &Tape, map: &MapLoop, s: Slot, n: Slot, t: u32) -> bool {
    same_kind(tape, s, n) && (tape.args(n).iter().zip(&map.args)).all(|(a, f)| a == f.at(t))
}

/// The map of `s`'s op through `s` and `second` (two nodes of a kind), of length 2.
fn map_through(tape: &Tape, s: Slot, second: Slot) -> MapLoop {
    MapLoop {
        op: tape.op(s),
        out: Affine::through(s, second),
        args: (tape.args(s).iter().zip(tape.args(second)))
            .map(|(a, b)| Affine::through(a, b))
            .collect(),
        len: 2,
        needs_grad: tape.takes_grad(s),
        grad_args: tape.args(s).iter().map(|a| tape.takes_grad(a)).collect(),
    }
}

/// `s` as a [`SumLoop`], if it is a sum with at least [`MIN_RUN`] affine operands after the
/// first.
fn sum_loop_at(tape: &Tape, s: Slot) -> Option<SumLoop> {
    if tape.op(s) != Op::Sum {
        return None;
    }
    let args = tape.args(s);
    let tail = args.slice(1..args.len());
    if (tail.len() as u32) < MIN_RUN {
        return None;
    }
    let affine = Affine::through(tail.get(0), tail.get(1));
    let grad_tail = tape.takes_grad(tail.get(0));
    let all_fit = tail
        .iter()
        .enumerate()
        .all(|(t, a)| a == affine.at(t as u32) && tape.takes_grad(a) == grad_tail);
    all_fit.then(|| SumLoop {
        slot: Affine::fixed(s),
        first: Affine::fixed(args.get(0)),
        tail: affine,
        tail_len: tail.len() as u32,
        needs_grad: tape.takes_grad(s),
        grad_first: tape.takes_grad(args.get(0)),
        grad_tail,
        links: None,
    })
}

/// A dot added up one `add` at a time from `s` on, if at least [`MIN_RUN`] long: `p_t =
/// a(t) * b(t)` then `s_t = s_(t-1) + p_t` (`s_(-1)` a value from before, the sum's first
/// term), node after node, the products' and the links' slots affine, each product and
/// each link but the last read by the next link only (no other node, output or loss).
/// The same additions in the same order as the links: as a [`DotLoop`] whose sum has
/// [`SumLoop::links`], none of the products and links kept.
fn chained_dot_at(tape: &Tape, s: Slot, end: u32) -> Option<DotLoop> {
    let consumers = tape.consumers();
    // Product `p` then its link, the next node: `(p, link, the link's first operand)`.
    let pair = |p: Slot| -> Option<(Slot, Slot, Slot)> {
        let link = next_node(tape, p, end)?;
        let args = tape.args(link);
        let fits = tape.op(p) == Op::Mul
            && tape.op(link) == Op::Add
            && args.get(1) == p
            && consumers.uses(p) == 1
            && tape.takes_grad(link) == tape.takes_grad(s);
        fits.then(|| (p, link, args.get(0)))
    };
    let (_, link0, first) = pair(s)?;
    // (A quick no for most nodes: the next product must continue the chain.)
    let (p1, link1, from) = pair(next_node(tape, link0, end)?)?;
    if from != link0 || first.0 >= s.0 {
        return None;
    }
    if !same_kind(tape, s, p1) {
        return None;
    }
    let products = map_through(tape, s, p1);
    let links = Affine::through(link0, link1);
    let mut len = 2;
    let mut last = link1;
    while let Some(p) = next_node(tape, last, end) {
        let Some((p, link, from)) = pair(p) else {
            break;
        };
        let fits = from == last
            && consumers.uses(last) == 1
            && p == products.out.at(len)
            && link == links.at(len)
            && member(tape, &products, s, p, len);
        if !fits {
            break;
        }
        last = link;
        len += 1;
    }
    if len < MIN_RUN {
        return None;
    }
    let products = MapLoop { len, ..products };
    let grad_tail = products.needs_grad;
    Some(DotLoop {
        sum: SumLoop {
            slot: Affine::fixed(last),
            first: Affine::fixed(first),
            tail: products.out,
            tail_len: len,
            needs_grad: tape.takes_grad(last),
            grad_first: tape.takes_grad(first),
            grad_tail,
            links: Some(links),
        },
        products,
    })
}

/// Fuses each map of `mul` followed by a sum whose last terms are exactly its products into
/// a [`DotLoop`], when nothing else reads a product (no other node, output or loss).
fn fuse_dots(tape: &Tape, items: Vec<Item>) -> Vec<Item> {
    let consumers = tape.consumers();
    let mut out: Vec<Item> = Vec::with_capacity(items.len());
    for item in items {
        if let (Some(Item::Map(m)), Item::Sum(sum)) = (out.last(), &item) {
            let fusable = m.op == Op::Mul
                && ends_with(sum, m)
                && (0..m.len).all(|t| consumers.uses(m.out.at(t)) == 1);
            if fusable {
                let products = m.clone();
                out.pop();
                out.push(Item::Dot(Box::new(DotLoop {
                    products,
                    sum: (**sum).clone(),
                })));
                continue;
            }
        }
        out.push(item);
    }
    out
}
