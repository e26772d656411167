//! A batch written as copies, stored once: which slots of a tape are copies of the first.
//!
//! micrograd's demo builds its MLP once per point and sums the points' losses; a minibatch
//! written the same way is B copies of a whole network (at B = 128 copies of MNIST's
//! 784-50-10, 5 million nodes). Linearization finds such copies from the `sum` that joins
//! them ([`hint`]: among the loss's first few operands, a sum whose operands lie at equal
//! distances in the graph, one per copy, each copy the stretch up to its operand), checks
//! while it places them that every copy is the first one moved (where the graph proved the
//! copies past the second the first moved as far as the second is, [`crate::graph::CopyRuns`],
//! it checks the second and what the graph does not prove), and stores the first copy's
//! nodes and operands only: the others' ops and gradient flags are the first's, their
//! operands the first's moved by [`Copies::stride`] ([`super::Args`]).
//!
//! A copy is the first one moved when every node is the node `period` slots back (the same
//! op, constants included, and gradient flags) and each of its operands either lies in its
//! own copy (`period` further on) or before the copies, moved by `b` times a stride of that
//! slot's own: 0 for the params every copy shares, the sample's width for its inputs; the
//! same stride wherever the first copy reads the slot, never reaching into the copies, and
//! taking a gradient as the first copy's does. So no copy reads another, and a slot's
//! stride is one number: structure recovery nests the first copy's items over the copies
//! without looking at the others ([`crate::passes::copies`]). The first copy that is not
//! ends the copies (at least [`MIN_COPIES`] of them, or none); it and everything after are
//! stored as they are. Copies of fewer than [`MIN_COPY_SLOTS`] slots are stored as they
//! are too.

use crate::graph::GraphData;
use crate::op::Op;

use super::linearize::{GRAD, LIVE, SHOWN};

use super::Slot;

/// The fewest copies stored once.
pub const MIN_COPIES: u32 = 3;
/// The fewest slots a copy stored once takes: fewer (a loss's terms, such as micrograd's
/// `relu(1 - y * score)` per point) save little and cost every slot's accessor a question.
pub const MIN_COPY_SLOTS: u32 = 8;

/// How deep below the loss the hint is looked for (`loss = sum(copies) * (1 / B) + l2`:
/// two levels).
const HINT_DEPTH: usize = 3;
/// How many nodes of each level below the loss the hint looks at.
const HINT_WIDTH: usize = 64;

/// Slots `first..first + period * count`: `count` copies of the first `period` of them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Copies {
    pub first: u32,
    pub period: u32,
    pub count: u32,
    /// Where the first copy's operands start among the stored ones.
    pub(super) first_args: u32,
    /// Per operand of the first copy (from `first_args`): how far it moves per copy (its
    /// slot's [`Copies::stride`]).
    pub(super) moves: Vec<i64>,
    /// Per slot before `first`: how far the copies' reads of it move per copy, or [`UNREAD`].
    pub(super) strides: Vec<i64>,
    /// `u64::MAX / period + 1`: `s / period` as a multiplication ([`Copies::split`]).
    reciprocal: u64,
}

/// A slot before the copies that the first copy does not read.
pub(super) const UNREAD: i64 = i64::MIN;

impl Copies {
    pub(super) fn new(first: u32, period: u32, first_args: u32) -> Copies {
        debug_assert!(period >= MIN_COPY_SLOTS);
        Copies {
            first,
            period,
            count: 1,
            first_args,
            moves: Vec::new(),
            strides: vec![UNREAD; first as usize],
            reciprocal: u64::MAX / period as u64 + 1,
        }
    }

    /// The slots the copies cover.
    pub fn range(&self) -> std::ops::Range<u32> {
        self.first..self.first + self.period * self.count
    }

    /// The slots past the first copy that are not stored: `(count - 1) * period`.
    pub(super) fn unstored(&self) -> u32 {
        (self.count - 1) * self.period
    }

    /// How far slot `s`, read or written by the first copy, moves per copy: the copy's own
    /// nodes by `period`, the slots before it by their stride; `None` for any other slot.
    pub fn stride(&self, s: Slot) -> Option<i64> {
        if (self.first..self.first + self.period).contains(&s.0) {
            return Some(self.period as i64);
        }
        let stride = *self.strides.get(s.index())?;
        (stride != UNREAD).then_some(stride)
    }

    /// The slots before the copies that the copies read at a stride other than 0, with it.
    pub(super) fn strided_reads(&self) -> impl Iterator<Item = (Slot, i64)> + '_ {
        (self.strides.iter().enumerate())
            .filter(|&(_, &d)| d != UNREAD && d != 0)
            .map(|(a, &d)| (Slot(a as u32), d))
    }

    /// Records each of the first copy's operands' (`args`) moves, once the copies are known.
    pub(super) fn record_moves(&mut self, args: &[Slot]) {
        self.moves = (args.iter())
            .map(|&a| self.stride(a).expect("the first copy reads it"))
            .collect();
    }

    /// Whether moving param `a` to slot `to[a]` (for every param) keeps every copy's read
    /// of a param at its stride: it does if they all read the same params, which never
    /// move apart.
    pub(super) fn keeps_strides(&self, to: &[u32]) -> bool {
        (0..to.len()).all(|a| match self.strides[a] {
            UNREAD | 0 => true,
            stride => (1..self.count as i64).all(|b| {
                let read = a as i64 + b * stride;
                (to.get(read as usize)).is_some_and(|&t| t as i64 == to[a] as i64 + b * stride)
            }),
        })
    }

    /// Hands the copies as stored to `out` ([`super::structure`]); the reciprocal follows
    /// from the period.
    pub(super) fn write_structure(&self, out: &mut super::structure::Bytes<'_>) {
        let Copies {
            first,
            period,
            count,
            first_args,
            moves,
            strides,
            reciprocal: _,
        } = self;
        for x in [first, period, count, first_args] {
            out.u32(*x);
        }
        out.i64s(moves.iter().copied(), moves.len());
        out.i64s(strides.iter().copied(), strides.len());
    }

    /// Slot `s` of a copy past the first as (copy, the first copy's slot).
    #[inline]
    pub(super) fn split(&self, s: u32) -> (u32, u32) {
        let rel = s - self.first;
        // Lemire's division by a constant: exact for every 32-bit `rel`.
        let b = ((self.reciprocal as u128 * rel as u128) >> 64) as u32;
        (b, s - b * self.period)
    }

    /// Whether operand `moved` of copy `b`'s node is operand `a` of the first copy's, moved
    /// (module docs); records the stride of `a` from copy 1. `takes_grad` says of a slot
    /// before the copies whether it takes a gradient.
    pub(super) fn moves(
        &mut self,
        a: Slot,
        moved: Slot,
        b: u32,
        last_copy: u32,
        takes_grad: impl Fn(Slot) -> bool,
    ) -> bool {
        if a.0 >= self.first {
            return moved.0 as i64 == a.0 as i64 + (b * self.period) as i64;
        }
        let by = moved.0 as i64 - a.0 as i64;
        let stride = &mut self.strides[a.index()];
        if *stride == UNREAD {
            // (Copy 1 reads every slot the first copy reads, so this is copy 1.) The last
            // copy's read must lie before the copies too.
            let last = a.0 as i64 + by * last_copy as i64;
            if b != 1 || !(0..self.first as i64).contains(&last) {
                return false;
            }
            *stride = by;
        } else if *stride * b as i64 != by {
            return false;
        }
        // (`moved` lies between `a` and the last copy's read: before the copies.)
        takes_grad(a) == takes_grad(moved)
    }
}

/// Whether copy nodes `a` and `b` are alike: the same op (an input or a param each, or
/// the same op to the bit), both kept or not, both needing a gradient or not, and (for a
/// constant, whose gradient compiled code adds into only if it is shown) both shown or not.
pub(super) fn alike(a: Op, b: Op, flags_a: u8, flags_b: u8) -> bool {
    let same_op = a.repeated_as(b);
    let compared = match a {
        Op::Const(_) => LIVE | GRAD | SHOWN,
        _ => LIVE | GRAD,
    };
    same_op && flags_a & compared == flags_b & compared
}

/// Where the graph's copies would be: `(start, period, count)` in graph nodes, copy `b`
/// being nodes `start + b * period..start + (b + 1) * period`, from the operands of a `sum`
/// near the loss that lie at equal distances (more than one node) apart, at least
/// [`MIN_COPIES`] of them, one per copy.
pub(super) fn hint(g: &GraphData) -> Option<(usize, usize, u32)> {
    let mut level = vec![g.loss?];
    for _ in 0..HINT_DEPTH {
        let mut next = Vec::new();
        for &id in &level {
            let node = &g.nodes[id as usize];
            if node.op.is_leaf() {
                continue;
            }
            let args = g.args_of(node);
            if node.op == Op::Sum && args.len() >= MIN_COPIES as usize {
                let period = args[1].wrapping_sub(args[0]);
                let spaced = args.windows(2).all(|w| w[1].wrapping_sub(w[0]) == period);
                let start = (args[0] as usize + 1).checked_sub(period as usize);
                if let (true, true, Some(start)) = (spaced, period > 1, start) {
                    return Some((start, period as usize, args.len() as u32));
                }
            }
            next.extend_from_slice(args);
        }
        // (The loss's sum over every param's square has thousands of operands, none of
        // them a copy's.)
        next.truncate(HINT_WIDTH);
        level = next;
    }
    None
}
