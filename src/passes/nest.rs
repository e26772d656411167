//! Structure recovery: repeated sequences of items become [`Nest`]s, to any depth.
//!
//! A graph written by scalar code repeats itself at every scale: neurons in a layer, a layer
//! in each copy of a batch, a whole network in each time step of a rollout. In the tape this
//! is a sequence of items (nodes, loops) followed by the same sequence again, every slot of
//! the second copy either the same as in the first (a shared param, a constant) or moved by
//! a constant (its own nodes, its own inputs, the previous step's state). This pass finds
//! those repetitions bottom-up:
//!
//! 1. Every straight-line node becomes an item of its own (a map of one node): a [`Unit`]
//!    that is only the node's slot until a nest takes it (its shape hashed and its slots
//!    read from the tape), so a tape's worth of nodes costs no allocation.
//! 2. A round scans the items once. At each item it tries, as periods, the distances to the
//!    next few items of the same shape (everything but the slots' bases equal); the shortest
//!    period repeated at least [`MIN_NEST`] times with every slot moving by the same amount per
//!    repetition becomes a nest over those items. The shapes are hashed and the slots
//!    compared as integers, so a round is linear in the items plus the nests it checks.
//! 3. Rounds repeat on their own output (nests become items of the next round's nests), the
//!    longest period allowed doubling from one item per round, back to one after a round
//!    that nested something: inner repetitions collapse
//!    into nests before any outer one is tried, so the outer one repeats nests that are
//!    alike (and bodies are not rotated around an inner repetition). Back at short periods,
//!    a round rescans only from just before the first new nest ([`Settled`]): the items
//!    before it are unchanged and were tried at those periods already. Nests nest up to
//!    [`MAX_NEST_DEPTH`] levels; the rounds take `O(n log n)`.
//! 4. Nests too small to pay ([`MIN_NEST_NODES`]) unroll, and single nodes left outside nests
//!    merge back into straight-line ranges.
//!
//! A nest runs its repetitions in tape order (backward in reverse, body reversed), so every
//! node's arithmetic, and every gradient's sequence of additions, is the interpreter's.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

use rustc_hash::FxHasher;

use super::schedule::{AccessKind, Affine, Item, MapLoop, Nest, NestId, SumLoop, MAX_NEST_DEPTH};
use crate::op::Op;
use crate::tape::{Slot, Tape};

/// Nests need at least this many repetitions.
pub const MIN_NEST: u32 = 3;
/// How many later items of the same shape are tried as the period of a nest: single nodes
/// share shapes often (a mass-spring step repeats `sub` every few nodes, its masses every 22).
const CANDIDATE_PERIODS: usize = 16;

/// `items` (in tape order, covering every non-leaf slot) with their repetitions nested.
pub fn recover(tape: &Tape, items: Vec<Item>) -> Vec<Item> {
    let mut items = singles(tape, items);
    let mut shapes = Shapes::of(tape, &items);
    let mut max_period = 1;
    let mut settled = Settled {
        period: 0,
        rescan_from: 0,
    };
    while max_period * MIN_NEST as usize <= items.len() {
        let from = if max_period <= settled.period {
            settled.rescan_from
        } else {
            0
        };
        let nests = round(tape, &items, &shapes, max_period, from);
        if let Some(&(first, _)) = nests.first() {
            let nested: Vec<(usize, usize)> = nests
                .iter()
                .map(|(start, n)| (*start, n.count as usize * n.body.len()))
                .collect();
            items = with_nests(items, nests);
            shapes.renest(tape, &items, &nested);
            settled = Settled::before(first, max_period);
            // New nests may repeat with a short period again (copies of a layer's nest).
            max_period = 1;
        } else {
            if from == 0 {
                settled = Settled::before(items.len(), max_period);
            }
            // Double, but try the longest period that can still repeat before giving up
            // (three copies of an 11-item body: periods 8, then 11, not 16).
            let longest = items.len() / MIN_NEST as usize;
            max_period = if max_period < longest {
                (2 * max_period).min(longest)
            } else {
                longest + 1
            };
        }
    }
    merge_singles(unroll_small(items))
}

/// How far the rounds since items last changed got: every repetition of at most `period`
/// items starting before `rescan_from` was tried and made no nest, and the items it looked
/// at are unchanged. A round of such a period starts at `rescan_from`: after a nest at the
/// tape's end (a loss summed over a few outputs), the rounds that look for short periods
/// again rescan only the end.
struct Settled {
    period: usize,
    rescan_from: usize,
}

impl Settled {
    /// Settled up to `period` for the items before `changed`, less the items whose
    /// repetitions (and the rotations [`better_rotation_ahead`] compares) reach it.
    fn before(changed: usize, period: usize) -> Settled {
        Settled {
            period,
            rescan_from: changed.saturating_sub((MIN_NEST as usize + 1) * period),
        }
    }
}

/// What the rounds scan: a tape node that no nest has taken yet (most of a tape, until
/// rounds nest it: built as an item only then, one such item is 128 bytes and two
/// allocations), or an item.
enum Unit {
    Node(Slot),
    Item(Box<Item>),
}

impl Unit {
    fn item(item: Item) -> Unit {
        Unit::Item(Box::new(item))
    }

    /// The unit as an item (a node as a map of one node).
    fn to_item(&self, tape: &Tape) -> std::borrow::Cow<'_, Item> {
        match self {
            Unit::Node(s) => std::borrow::Cow::Owned(single(tape, *s)),
            Unit::Item(item) => std::borrow::Cow::Borrowed(item),
        }
    }

    /// [`Item::for_each_affine`] of [`Unit::to_item`], without building it.
    fn for_each_affine(&self, tape: &Tape, f: &mut impl FnMut(&Affine)) {
        match self {
            Unit::Node(s) => {
                f(&Affine::fixed(*s));
                tape.args(*s).iter().for_each(|a| f(&Affine::fixed(a)));
            }
            Unit::Item(item) => item.for_each_affine(f),
        }
    }

    /// Whether `body` is the unit but for its slots.
    fn same_shape_as(&self, tape: &Tape, body: &Item) -> bool {
        match (self, body) {
            (Unit::Item(item), _) => same_shape(item, body),
            (Unit::Node(s), Item::Map(m)) => {
                m.op == tape.op(*s)
                    && m.len == 1
                    && m.needs_grad == tape.takes_grad(*s)
                    && m.args.len() == tape.args(*s).len()
                    && m.grad_args
                        .iter()
                        .zip(tape.args(*s))
                        .all(|(&g, a)| g == tape.takes_grad(a))
            }
            (Unit::Node(_), _) => false,
        }
    }

    /// The first slot the unit writes (items write slots in increasing order).
    fn first_write(&self) -> u32 {
        match self {
            Unit::Node(s) => s.0,
            Unit::Item(item) => first_write(item),
        }
    }

    /// Whether the unit reads a slot in `range`.
    fn reads_within(&self, tape: &Tape, range: std::ops::Range<u32>) -> bool {
        match self {
            Unit::Node(s) => tape.args(*s).iter().any(|a| range.contains(&a.0)),
            Unit::Item(item) => reads_within(item, range),
        }
    }
}

/// A top-level nest covering fewer nodes than this runs faster straight-line: its loop
/// saves no compile time worth having, and costs loads, stores and a branch per repetition
/// that straight-line code keeps in registers.
pub const MIN_NEST_NODES: usize = 32;

/// Nests smaller than [`MIN_NEST_NODES`] back as their items, repeated: at the top level
/// they run straight-line; in a nest's body, the body's loop runs their nodes in sequence
/// (and a body without nests may run in lanes).
fn unroll_small(units: Vec<Unit>) -> Vec<Unit> {
    let mut out = Vec::with_capacity(units.len());
    for unit in units {
        match unit {
            Unit::Item(item) if matches!(*item, Item::Nest(_)) => {
                out.extend(unroll_small_at(vec![*item], 0).into_iter().map(Unit::item));
            }
            other => out.push(other),
        }
    }
    out
}

/// [`unroll_small`] for the body of a nest inside `level` nests.
fn unroll_small_at(items: Vec<Item>, level: usize) -> Vec<Item> {
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let Item::Nest(n) = item else {
            out.push(item);
            continue;
        };
        let body = unroll_small_at(n.body, level + 1);
        let nodes: usize = n.count as usize * body.iter().map(Item::loop_nodes).sum::<usize>();
        if nodes < MIN_NEST_NODES {
            for j in 0..n.count as i64 {
                out.extend(
                    body.iter()
                        .map(|b| b.map_affines(&mut |a, _| a.unnested_at(level, j))),
                );
            }
        } else {
            out.push(Item::Nest(Nest { body, ..n }));
        }
    }
    out
}

/// Straight-line ranges as one unit per node (leaves skipped: no item computes them).
fn singles(tape: &Tape, items: Vec<Item>) -> Vec<Unit> {
    // Sized once: growing a vector of a million items copies hundreds of megabytes.
    let len = items
        .iter()
        .map(|item| match item {
            Item::Straight(range) => range.len(),
            _ => 1,
        })
        .sum();
    let mut out = Vec::with_capacity(len);
    for item in items {
        match item {
            Item::Straight(range) => out.extend(
                range
                    .map(Slot)
                    .filter(|&s| !tape.op(s).is_leaf())
                    .map(Unit::Node),
            ),
            other => out.push(Unit::item(other)),
        }
    }
    out
}

/// Node `s` as a map of one node.
pub fn single(tape: &Tape, s: Slot) -> Item {
    Item::Map(MapLoop {
        op: tape.op(s),
        out: Affine::fixed(s),
        args: tape.args(s).iter().map(Affine::fixed).collect(),
        len: 1,
        needs_grad: tape.takes_grad(s),
        grad_args: tape.args(s).iter().map(|a| tape.takes_grad(a)).collect(),
    })
}

/// The slot of a top-level single-node item.
fn single_slot(item: &Item) -> Option<u32> {
    match item {
        Item::Map(m) if m.len == 1 && m.out.stride == 0 && m.out.outer == [0; MAX_NEST_DEPTH] => {
            Some(m.out.base as u32)
        }
        _ => None,
    }
}

/// Nodes and single-node items outside nests back as straight-line ranges.
fn merge_singles(units: Vec<Unit>) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::with_capacity(units.len());
    for unit in units {
        let (slot, item) = match unit {
            Unit::Node(s) => (Some(s.0), None),
            Unit::Item(item) => (single_slot(&item), Some(*item)),
        };
        match (slot, out.last_mut(), item) {
            (Some(s), Some(Item::Straight(range)), _) => range.end = s + 1,
            (Some(s), _, _) => out.push(Item::Straight(s..s + 1)),
            (None, _, Some(item)) => out.push(item),
            (None, _, None) => unreachable!("a node has a slot"),
        }
    }
    out
}

/// What a round compares: per item, its shape's hash (`None` if it cannot be nested) and
/// its slots' bases, and the next item of the same shape. Kept from round to round: a round
/// that nests changes only the items it nests.
struct Shapes {
    keys: Vec<Option<u64>>,
    /// Item `i`'s bases are `bases[spans[i].0..spans[i].1]`.
    spans: Vec<(usize, usize)>,
    bases: Vec<i64>,
    next: Vec<Option<usize>>,
}

impl Shapes {
    fn of(tape: &Tape, units: &[Unit]) -> Shapes {
        let mut shapes = Shapes {
            keys: node_keys_memoized(tape, units),
            spans: Vec::with_capacity(units.len()),
            bases: Vec::with_capacity(units.len() * 3),
            next: Vec::new(),
        };
        for unit in units {
            let span = shapes.append_bases(tape, unit);
            shapes.spans.push(span);
        }
        shapes.next = next_of_same_shape(&shapes.keys, Vec::new(), 0);
        shapes
    }

    /// The bases of `item`, appended; their span.
    fn append_bases(&mut self, tape: &Tape, unit: &Unit) -> (usize, usize) {
        let start = self.bases.len();
        unit.for_each_affine(tape, &mut |a| self.bases.push(a.base));
        (start, self.bases.len())
    }

    /// The shapes of `items`, which are the items these shapes described with the runs
    /// `nested` (first index and length) replaced by the nest each became.
    fn renest(&mut self, tape: &Tape, units: &[Unit], nested: &[(usize, usize)]) {
        // Items before the first nest keep their index and shape.
        let first = nested.first().map_or(self.keys.len(), |(start, _)| *start);
        let mut nested = nested.iter().peekable();
        let (mut read, mut write) = (first, first);
        let mut nests = Vec::with_capacity(nested.len());
        while read < self.keys.len() {
            match nested.next_if(|(start, _)| *start == read) {
                Some(&(_, len)) => {
                    nests.push(write);
                    read += len;
                }
                None => {
                    self.keys[write] = self.keys[read];
                    self.spans[write] = self.spans[read];
                    read += 1;
                }
            }
            write += 1;
        }
        self.keys.truncate(write);
        self.spans.truncate(write);
        for w in nests {
            self.keys[w] = unit_shape_key(tape, &units[w]);
            self.spans[w] = self.append_bases(tape, &units[w]);
        }
        self.next = next_of_same_shape(&self.keys, std::mem::take(&mut self.next), first);
    }

    fn bases(&self, i: usize) -> &[i64] {
        let (start, end) = self.spans[i];
        &self.bases[start..end]
    }

    fn same_shape(&self, a: usize, b: usize) -> bool {
        self.keys[a].is_some()
            && self.keys[a] == self.keys[b]
            && self.bases(a).len() == self.bases(b).len()
    }

    /// How many times the `period` items at `i` repeat, each repetition of the same shapes
    /// with every slot moved by the same amount as from the first to the second.
    /// Counting stops at `limit`.
    fn repetitions(&self, i: usize, period: usize, limit: usize) -> usize {
        let mut count = 1;
        while count < limit && i + (count + 1) * period <= self.keys.len() {
            if !(0..period).all(|k| self.repeats(i + k, period, count)) {
                break;
            }
            count += 1;
        }
        count
    }

    /// Whether the first item at `i` repeats at least [`MIN_NEST`] times with `period`:
    /// the necessary condition [`Shapes::repetitions`] checks item by item, asked of the
    /// first item alone, which rejects most candidates at a fraction of the cost.
    fn first_item_repeats(&self, i: usize, period: usize) -> bool {
        let last = i + (MIN_NEST as usize - 1) * period;
        last < self.keys.len() && (1..MIN_NEST as usize).all(|c| self.repeats(i, period, c))
    }

    /// Whether item `first + count * period` is repetition `count` of item `first`: the same
    /// shape, and (from the third on) every slot moved from the previous repetition by what
    /// the second moved from the first.
    fn repeats(&self, first: usize, period: usize, count: usize) -> bool {
        let (this, prev) = (first + count * period, first + (count - 1) * period);
        self.same_shape(first, this)
            && (count == 1
                || self
                    .bases(this)
                    .iter()
                    .zip(self.bases(prev))
                    .zip(self.bases(first + period).iter().zip(self.bases(first)))
                    .all(|((t, p), (s, f))| t - p == s - f))
    }

    /// Periods to try at item `i`: the distances to the next few items of its shape, up to
    /// `max_period` and as long as two repetitions fit. (An iterator, not a vector: a round
    /// asks at every item.)
    fn periods(&self, i: usize, max_period: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(self.next[i], |&k| self.next[k])
            .map(move |k| k - i)
            .take(CANDIDATE_PERIODS)
            .take_while(move |&p| p <= max_period && i + 2 * p <= self.keys.len())
    }
}

/// One scan over `items` from index `from`: the nests it makes, each with the index of its
/// first item, for the shortest repetition (of at most `max_period` items) starting at each
/// item.
fn round(
    tape: &Tape,
    items: &[Unit],
    shapes: &Shapes,
    max_period: usize,
    from: usize,
) -> Vec<(usize, Nest)> {
    let mut nests = Vec::new();
    let mut i = from;
    while i < items.len() {
        let nest = shapes
            .periods(i, max_period)
            .filter(|&p| shapes.first_item_repeats(i, p))
            .map(|p| (shapes.repetitions(i, p, usize::MAX), p))
            // The shortest period that repeats: inner structure first (neurons before the
            // layers they form), so that the next round finds the outer repetition over
            // nests that are alike.
            .find(|&(count, _)| count >= MIN_NEST as usize)
            .filter(|&(_, p)| !better_rotation_ahead(tape, items, shapes, i, p))
            .and_then(|(count, p)| nest_of(tape, &items[i..i + count * p], p));
        match nest {
            Some(nest) => {
                let covered = nest.count as usize * nest.body.len();
                nests.push((i, nest));
                i += covered;
            }
            None => i += 1,
        }
    }
    nests
}

/// How many rotations of a chained body [`better_rotation_ahead`] tries.
const MAX_ROTATIONS: usize = 64;

/// Whether the nest of period `p` at `i` is a rotation of a better one starting at one of
/// the next `p - 1` items (at most [`MAX_ROTATIONS`]): one whose repetitions do not read
/// what the previous one wrote right away, which `[relu, dot]` repeated does where
/// `[dot, relu]` does not. A rotated
/// body chains its repetitions (no lanes); the scan moves on and finds the right start.
fn better_rotation_ahead(tape: &Tape, items: &[Unit], shapes: &Shapes, i: usize, p: usize) -> bool {
    let chained = |start: usize| {
        let (lo, hi) = (items[start].first_write(), items[start + p].first_write());
        items[start + p].reads_within(tape, lo..hi)
    };
    let nest = MIN_NEST as usize;
    chained(i)
        && (1..p.min(MAX_ROTATIONS)).any(|r| {
            i + r + nest * p <= items.len()
                && !chained(i + r)
                && shapes.first_item_repeats(i + r, p)
                && shapes.repetitions(i + r, p, nest) == nest
        })
}

/// The first slot `item` writes (items write slots in increasing order).
fn first_write(item: &Item) -> u32 {
    item.nested_accesses()
        .into_iter()
        .filter(|(access, _)| matches!(access.kind, AccessKind::Writes { .. }))
        .map(|(access, counts)| access.at.bounds(access.len, &counts).0 as u32)
        .min()
        .unwrap_or(u32::MAX)
}

/// Whether `item` reads a slot in `range`.
fn reads_within(item: &Item, range: std::ops::Range<u32>) -> bool {
    let mut hit = false;
    for (access, counts) in item.nested_accesses() {
        if let AccessKind::Reads { .. } = access.kind {
            access.for_each_slot(&counts, |s| hit |= range.contains(&s.0));
        }
    }
    hit
}

/// `items` with the items of each nest replaced by the nest, in place: on a tape of a
/// million nodes the items are hundreds of megabytes, and a fresh vector per round costs
/// more in page faults and copies than the round itself.
fn with_nests(mut items: Vec<Unit>, nests: Vec<(usize, Nest)>) -> Vec<Unit> {
    // Items before the first nest stay where they are.
    let first = nests.first().map_or(items.len(), |(start, _)| *start);
    let mut nests = nests.into_iter().peekable();
    let (mut read, mut write) = (first, first);
    while read < items.len() {
        match nests.next_if(|(start, _)| *start == read) {
            Some((_, nest)) => {
                read += nest.count as usize * nest.body.len();
                items[write] = Unit::item(Item::Nest(nest));
            }
            None => {
                items.swap(write, read);
                read += 1;
            }
        }
        write += 1;
    }
    items.truncate(write);
    items
}

/// Per item, the index of the next item of the same shape, given `old`: the answer for items
/// that were the same before index `changed` (empty if none were).
fn next_of_same_shape(
    keys: &[Option<u64>],
    mut old: Vec<Option<usize>>,
    changed: usize,
) -> Vec<Option<usize>> {
    let changed = changed.min(old.len());
    old.truncate(changed);
    old.resize(keys.len(), None);
    let mut next = old;
    // The keys are hashes already.
    let mut first_seen: HashMap<u64, usize, BuildHasherDefault<FxHasher>> = HashMap::default();
    for (i, key) in keys.iter().enumerate().skip(changed).rev() {
        if let Some(key) = key {
            next[i] = first_seen.insert(*key, i);
        }
    }
    // An unchanged item whose next lay before the change keeps it; the others' next is the
    // first of their shape from the change on.
    for i in 0..changed {
        if !next[i].is_some_and(|n| n < changed) {
            next[i] = keys[i].and_then(|key| first_seen.get(&key).copied());
        }
    }
    next
}

/// The nest whose repetitions are `items`, `period` at a time, if they are exactly that
/// (the hashes that led here may collide).
fn nest_of(tape: &Tape, items: &[Unit], period: usize) -> Option<Nest> {
    let count = items.len() / period;
    let body: Vec<Item> = items[..period]
        .iter()
        .zip(&items[period..2 * period])
        .map(|(a, b)| with_outer(&a.to_item(tape), &b.to_item(tape)))
        .collect::<Option<_>>()?;
    // Each item is repetition j of its body item (`iteration(b, j) == item`), checked
    // without building the repetition.
    let mut slots = Vec::new();
    let exact = (0..count).all(|j| {
        body.iter()
            .zip(&items[j * period..(j + 1) * period])
            .all(|(b, item)| is_repetition(tape, item, b, j as i64, &mut slots))
    });
    exact.then_some(Nest {
        count: count as u32,
        body,
        // (Numbered once recovery is done.)
        id: NestId::default(),
    })
}

/// Whether `unit` is repetition `j` of the nest body's item `b` (`slots`: scratch space).
fn is_repetition(tape: &Tape, unit: &Unit, b: &Item, j: i64, slots: &mut Vec<Affine>) -> bool {
    if !unit.same_shape_as(tape, b) {
        return false;
    }
    let at = |a: &Affine| a.unnested(j);
    if let (Unit::Node(s), Item::Map(m)) = (unit, b) {
        // Most units are nodes: their slot and their operands' (the shape check saw as many),
        // compared field by field (`at(a) == Affine::fixed(x)` builds both on the stack and
        // reads them back wider than it wrote them, a stall per comparison).
        let fixed_at = |a: &Affine, x: Slot| {
            a.stride == 0
                && a.outer[1..].iter().all(|&o| o == 0)
                && a.base + a.outer[0] * j == x.0 as i64
        };
        return fixed_at(&m.out, *s)
            && m.args
                .iter()
                .zip(tape.args(*s))
                .all(|(a, x)| fixed_at(a, x));
    }
    slots.clear();
    unit.for_each_affine(tape, &mut |a| slots.push(*a));
    let mut k = 0;
    let mut same = true;
    b.for_each_affine(&mut |a| {
        same &= slots.get(k) == Some(&at(a));
        k += 1;
    });
    same && k == slots.len()
}

/// A hash of the item's shape: everything but its slots' bases. `None` for items that
/// cannot be nested (straight-line ranges, nests already [`MAX_NEST_DEPTH`] deep).
fn shape_key(item: &Item) -> Option<u64> {
    if matches!(item, Item::Straight(_) | Item::SumPart { .. }) || item.depth() >= MAX_NEST_DEPTH {
        return None;
    }
    let mut h = FxHasher::default();
    hash_shape(item, &mut h);
    item.for_each_affine(&mut |a| (a.stride, a.outer).hash(&mut h));
    Some(h.finish())
}

/// [`shape_key`] of a unit: of a node as a map of one node, without building that map.
fn unit_shape_key(tape: &Tape, unit: &Unit) -> Option<u64> {
    let s = match unit {
        Unit::Node(s) => *s,
        Unit::Item(item) => return shape_key(item),
    };
    let mut h = FxHasher::default();
    MAP_TAG.hash(&mut h);
    hash_op(tape.op(s), &mut h);
    let args = tape.args(s);
    let mut grads = [false; 8];
    let grad_args: std::borrow::Cow<[bool]> = if args.len() <= grads.len() {
        for (g, a) in grads.iter_mut().zip(args) {
            *g = tape.takes_grad(a);
        }
        std::borrow::Cow::Borrowed(&grads[..args.len()])
    } else {
        std::borrow::Cow::Owned(args.iter().map(|a| tape.takes_grad(a)).collect())
    };
    (1u32, tape.takes_grad(s), &*grad_args).hash(&mut h);
    for _ in 0..=args.len() {
        (0i64, [0i64; MAX_NEST_DEPTH]).hash(&mut h);
    }
    Some(h.finish())
}

/// [`unit_shape_key`] of every unit, computed once per kind of node: a tape has a few
/// dozen (op, constant, which operands take gradients), and hundreds of thousands of nodes.
fn node_keys_memoized(tape: &Tape, units: &[Unit]) -> Vec<Option<u64>> {
    type Kind = (std::mem::Discriminant<Op>, u64, u64, usize);
    let kind = |s: Slot| -> Option<Kind> {
        let op = tape.op(s);
        let constant = match op {
            Op::Powf(c) | Op::Const(c) => c.to_bits(),
            _ => 0,
        };
        let args = tape.args(s);
        (args.len() < 64).then(|| {
            let grads = args.iter().fold(tape.takes_grad(s) as u64, |mask, a| {
                mask << 1 | tape.takes_grad(a) as u64
            });
            (std::mem::discriminant(&op), constant, grads, args.len())
        })
    };
    let mut memo: HashMap<Kind, Option<u64>, BuildHasherDefault<FxHasher>> = HashMap::default();
    units
        .iter()
        .map(|unit| match unit {
            Unit::Node(s) => match kind(*s) {
                Some(k) => *memo.entry(k).or_insert_with(|| unit_shape_key(tape, unit)),
                None => unit_shape_key(tape, unit),
            },
            Unit::Item(_) => unit_shape_key(tape, unit),
        })
        .collect()
}

/// Which variant an item is, for [`hash_shape`].
fn variant_tag(item: &Item) -> u8 {
    match item {
        Item::Straight(_) => 0,
        Item::Map(_) => MAP_TAG,
        Item::Sum(_) => 2,
        Item::Dot(_) => 3,
        Item::Nest(_) => 4,
        Item::SumPart { .. } => 5,
    }
}

const MAP_TAG: u8 = 1;

fn hash_op(op: Op, h: &mut impl Hasher) {
    op.name().hash(h);
    if let Op::Powf(c) | Op::Const(c) = op {
        c.to_bits().hash(h);
    }
}

fn hash_shape(item: &Item, h: &mut impl Hasher) {
    fn map(m: &MapLoop, h: &mut impl Hasher) {
        hash_op(m.op, h);
        (m.len, m.needs_grad, &m.grad_args).hash(h);
    }
    fn sum(s: &SumLoop, h: &mut impl Hasher) {
        (s.tail_len, s.needs_grad, s.grad_first, s.grad_tail).hash(h);
        s.links.is_some().hash(h);
    }
    variant_tag(item).hash(h);
    match item {
        Item::Map(m) => map(m, h),
        Item::Sum(s) => sum(s, h),
        Item::Dot(d) => {
            map(&d.products, h);
            sum(&d.sum, h);
        }
        Item::Nest(n) => {
            (n.count, n.body.len()).hash(h);
            n.body.iter().for_each(|b| hash_shape(b, h));
        }
        Item::Straight(_) | Item::SumPart { .. } => {}
    }
}

/// Whether `a` and `b` are the same but for their slots.
fn same_shape(a: &Item, b: &Item) -> bool {
    let maps = |x: &MapLoop, y: &MapLoop| {
        x.op == y.op
            && x.len == y.len
            && x.args.len() == y.args.len()
            && x.needs_grad == y.needs_grad
            && x.grad_args == y.grad_args
    };
    let sums = |x: &SumLoop, y: &SumLoop| {
        x.tail_len == y.tail_len
            && x.needs_grad == y.needs_grad
            && (x.grad_first, x.grad_tail) == (y.grad_first, y.grad_tail)
            && x.links.is_some() == y.links.is_some()
    };
    match (a, b) {
        (Item::Map(x), Item::Map(y)) => maps(x, y),
        (Item::Sum(x), Item::Sum(y)) => sums(x, y),
        (Item::Dot(x), Item::Dot(y)) => maps(&x.products, &y.products) && sums(&x.sum, &y.sum),
        (Item::Nest(x), Item::Nest(y)) => {
            x.count == y.count
                && x.body.len() == y.body.len()
                && x.body.iter().zip(&y.body).all(|(a, b)| same_shape(a, b))
        }
        _ => false,
    }
}

/// `a` with outer strides that lead to `b`, if `b` is `a` one repetition later.
fn with_outer(a: &Item, b: &Item) -> Option<Item> {
    let mut fb = Vec::new();
    b.for_each_affine(&mut |x| fb.push(*x));
    let mut fa = Vec::with_capacity(fb.len());
    a.for_each_affine(&mut |x| fa.push(*x));
    let agree = fa.len() == fb.len()
        && fa
            .iter()
            .zip(&fb)
            .all(|(x, y)| x.stride == y.stride && x.outer == y.outer)
        && fa.iter().all(|x| x.outer[MAX_NEST_DEPTH - 1] == 0);
    if !(agree && same_shape(a, b)) {
        return None;
    }
    let mut steps = fa.iter().zip(&fb).map(|(x, y)| y.base - x.base);
    Some(a.map_affines(&mut |x, _| x.nested(steps.next().unwrap_or(0))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Graph;

    #[test]
    fn a_nodes_shape_key_is_its_single_items() {
        let g = Graph::new();
        let x = g.inputs(3);
        let w = g.param(0.5);
        let y = g.sum(&[
            x[0] * w,
            (x[1] - w).relu(),
            x[2].powf(0.5),
            x[1].powf(2.0),
            w.exp(),
        ]);
        let wide = g.sum(&(0..12).map(|k| x[k % 3] * (k as f64)).collect::<Vec<_>>());
        g.set_loss(y * wide + x[0].tanh()).unwrap();
        let tape = Tape::from_graph(&g).unwrap();
        let nodes: Vec<Unit> = tape
            .slots()
            .filter(|&s| !tape.op(s).is_leaf())
            .map(Unit::Node)
            .collect();
        let memoized = node_keys_memoized(&tape, &nodes);
        for (unit, memo) in nodes.iter().zip(memoized) {
            let Unit::Node(s) = unit else { unreachable!() };
            let key = unit_shape_key(&tape, unit);
            assert_eq!(key, shape_key(&single(&tape, *s)), "slot {}", s.0);
            assert_eq!(key, memo, "memoized, slot {}", s.0);
        }
    }
}
