//! Per-slot plan data, stored once per copy where the schedule runs a batch's copies alike.
//!
//! The plan answers questions per slot (is it kept? at which address?), and a batch written
//! as copies has millions of slots: at B = 128 copies of MNIST's 784-50-10, 5.2 million,
//! each copy asking what the one before it asked. Where the tape stores its copies once
//! ([`Tape::copies`]) and the schedule runs every copy alike ([`Alike`]: one nest over the
//! copies, and whatever else reaches into them reading every copy the same way), every
//! per-slot answer in copy `b >= 2` follows from copies 0 and 1: a flag is copy 1's, an
//! address continues from copy 0 to copy 1 (copies lie side by side, each as far after the
//! one before). So a [`PerSlot`] stores copies 0 and 1 and everything outside the copies,
//! and the passes that fill one walk the copies nest over its first two repetitions only
//! ([`Alike::counts`]): the plan's cost no longer grows with the batch, but for what lies
//! outside the copies (the inputs, a sum over the copies' losses).
//!
//! Why it holds: every repetition of the nest is the first moved by the copies' period, the
//! tape's copies are the first moved likewise (both checked, [`Tape::verify`] and
//! [`super::Plan::verify`]), and nothing else reads one copy differently from another; so a
//! pass that decides per slot from the item and the tape decides the same in every copy, and
//! a layout that places each copy as it placed the one before places copy `b` as far after
//! copy 1 as copy 1 lies after copy 0. The plan's tests compare every answer with a plan
//! that stores every slot.

use std::borrow::Cow;
use std::num::NonZeroU32;
use std::ops::Range;

use crate::passes::schedule::{every_iteration, AccessKind, Affine, Item, Nest};
use crate::tape::{Slot, Tape};

/// A tape's copies that the schedule runs alike: a top-level item is a nest over all of
/// them (each repetition writing its own copy, [`Alike::nests_copies`]), and every other
/// item, the outputs and the loss read copies `1..` alike (of each slot of a copy read, that
/// slot in every copy from 1 on, as many times: a sum over the copies' losses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Alike {
    first: u32,
    period: u32,
    count: u32,
}

impl Alike {
    /// The tape's copies, if `items` (top-level) run them alike.
    pub fn of(tape: &Tape, items: &[Item]) -> Option<Alike> {
        let alike = Alike::copies_of(tape)?;
        let nest = items.iter().position(|item| alike.nests_copies(item))?;
        let shown = tape.outputs().iter().copied().chain(tape.loss());
        let read = (items.iter().enumerate())
            .all(|(k, item)| k == nest || alike.reads_copies_alike(tape, item));
        (read && alike.reads_alike(shown)).then_some(alike)
    }

    /// These copies, if every sum part of `functions` (the plan's cut of the schedule they
    /// were found in) reads none of them: a sum over the copies cut into parts reads some
    /// copies in one function, others in the next.
    pub fn in_functions(self, tape: &Tape, functions: &[Vec<Item>]) -> Option<Alike> {
        let parts_alike = (functions.iter().flatten()).all(|item| {
            !matches!(item, Item::SumPart { .. }) || self.reads_copies_alike(tape, item)
        });
        parts_alike.then_some(self)
    }

    /// The tape's copies (at least 3), whether or not a schedule runs them alike: what
    /// [`Alike::nests_copies`] and [`Alike::first_two_of`] ask about.
    pub fn copies_of(tape: &Tape) -> Option<Alike> {
        let c = tape.copies()?;
        (c.count >= 3).then_some(Alike {
            first: c.first,
            period: c.period,
            count: c.count,
        })
    }

    /// `alike`, if `item` (a top-level item) is its copies' nest: what a walk over the item
    /// cuts to the first two copies.
    pub fn around<'a>(alike: Option<&'a Alike>, item: &Item) -> Option<&'a Alike> {
        alike.filter(|a| a.nests_copies(item))
    }

    /// The slots of the copies.
    pub fn copies(&self) -> Range<u32> {
        self.first..self.first + self.period * self.count
    }

    /// The slots of copies `2..`: those whose data follow copies 0 and 1.
    pub fn past_second(&self) -> Range<u32> {
        self.copy(2).start..self.copies().end
    }

    /// The slots of copy `b`.
    pub fn copy(&self, b: u32) -> Range<u32> {
        let start = self.first + b * self.period;
        start..start + self.period
    }

    /// How many copies.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Whether `item` is a nest over every copy, each repetition writing its own copy: every
    /// write moves by the period per repetition and stays in the copies.
    pub fn nests_copies(&self, item: &Item) -> bool {
        let Item::Nest(n) = item else { return false };
        let copies = self.copies();
        n.count == self.count
            && item.nested_accesses().iter().all(|(access, counts)| {
                let AccessKind::Writes { .. } = access.kind else {
                    return true;
                };
                let (lo, hi) = access.at.bounds(access.len, counts);
                let first_copy = self.first as i64..(self.first + self.period) as i64;
                access.at.outer[0] == self.period as i64
                    && first_copy.contains(&access.at.base)
                    && lo >= copies.start as i64
                    && hi < copies.end as i64
            })
    }

    /// Whether `item` (not the copies' nest) reads copies `1..` alike: each straight-line
    /// node and each loop's access reads, of each slot of a copy it reads, that slot in every
    /// copy from 1 on, as many times (copy 0 is stored: a sum over the copies' losses may read
    /// it first, then loop over the others).
    fn reads_copies_alike(&self, tape: &Tape, item: &Item) -> bool {
        let copies = self.copies();
        match item {
            Item::Straight(range) => {
                (range.clone().map(Slot)).all(|s| self.reads_alike(tape.args(s).into_iter()))
            }
            // (A part of a sum cut across functions: alike if the sum reads no copy.)
            Item::SumPart { slot, .. } => {
                (tape.args(*slot).into_iter()).all(|a| !copies.contains(&a.0))
            }
            _ => item.nested_accesses().iter().all(|(access, counts)| {
                let (lo, hi) = access.at.bounds(access.len, counts);
                if hi < copies.start as i64 || lo >= copies.end as i64 {
                    return true;
                }
                let mut slots = Vec::new();
                every_iteration(counts, access.len, |t, js| {
                    slots.push(access.at.at_levels(t, js));
                    true
                });
                self.reads_alike(slots.into_iter())
            }),
        }
    }

    /// Whether one reader's reads of `slots` read copies `1..` alike (above).
    fn reads_alike(&self, slots: impl Iterator<Item = Slot>) -> bool {
        let later = self.copy(1).start..self.copies().end;
        let mut read: Vec<(u32, u32)> = (slots.filter(|a| later.contains(&a.0)))
            .map(|a| {
                (
                    (a.0 - self.first) % self.period,
                    (a.0 - self.first) / self.period,
                )
            })
            .collect();
        read.sort_unstable();
        // Offset by offset: copies 1, 1, .., 2, 2, .., each as many times.
        let copies = self.count as usize - 1;
        read.chunk_by(|x, y| x.0 == y.0).all(|reads| {
            let times = reads.len() / copies;
            reads.len() % copies == 0
                && (reads.iter().enumerate()).all(|(i, r)| r.1 as usize == 1 + i / times)
        })
    }

    /// `counts`, the repetitions of the nests around a sequence `at` (outermost first) in a
    /// top-level item whose copies' nest is `around` ([`Alike::around`]), with the copies cut
    /// to the first two where `at` moves with them (the others' data follow theirs): a walk
    /// over `at`'s slots asks those of copies 0 and 1 and every slot outside the copies.
    pub fn cut(around: Option<&Alike>, at: Affine, counts: &[u32]) -> Vec<u32> {
        let mut out = counts.to_vec();
        if let (Some(a), Some(copies)) = (around, out.first_mut()) {
            if at.outer[0] == a.period as i64 {
                *copies = (*copies).min(2);
            }
        }
        out
    }

    /// [`Alike::cut`], and each level `at` does not move along cut to one repetition
    /// ([`Affine::moving_counts`]): the repetitions whose slots differ.
    pub fn counts(around: Option<&Alike>, at: Affine, counts: &[u32]) -> Vec<u32> {
        Alike::cut(around, at, &at.moving_counts(counts))
    }

    /// `counts` (of the nests around a nest in the copies' nest `around`, outermost first),
    /// the copies cut to the first two: for a walk over what each repetition writes, all of
    /// which moves with the copies.
    pub fn outer_counts(around: Option<&Alike>, counts: &[u32]) -> Vec<u32> {
        let mut out = counts.to_vec();
        if let (Some(_), Some(copies)) = (around, out.first_mut()) {
            *copies = (*copies).min(2);
        }
        out
    }

    /// `item` cut to its first two repetitions, if it is the copies' nest.
    pub fn first_two_of(&self, item: &Item) -> Option<Item> {
        match item {
            Item::Nest(n) if self.nests_copies(item) => Some(Item::Nest(Nest {
                count: 2,
                ..n.clone()
            })),
            _ => None,
        }
    }

    /// `items` with the copies' nest cut to its first two repetitions, for a walk over what
    /// each repetition writes.
    pub fn first_two<'i>(alike: Option<&Alike>, items: &'i [Item]) -> Vec<Cow<'i, Item>> {
        (items.iter())
            .map(|item| match alike.and_then(|a| a.first_two_of(item)) {
                Some(first_two) => Cow::Owned(first_two),
                None => Cow::Borrowed(item),
            })
            .collect()
    }
}

/// A value per slot: how one of copies `2..` gets its own from copies 0 and 1.
pub trait Rule: Copy {
    /// The value in copy `b >= 2`, given the same slot's in copies 0 and 1.
    fn in_copy(copy0: Self, copy1: Self, b: u32) -> Self;
}

impl Rule for bool {
    fn in_copy(_: bool, copy1: bool, _: u32) -> bool {
        copy1
    }
}

impl Rule for Option<NonZeroU32> {
    fn in_copy(_: Self, copy1: Self, _: u32) -> Self {
        copy1
    }
}

/// An address: copy `b` lies as far after copy `b - 1` as copy 1 after copy 0.
impl Rule for u32 {
    fn in_copy(copy0: u32, copy1: u32, b: u32) -> u32 {
        (copy1 as i64 + (b as i64 - 1) * (copy1 as i64 - copy0 as i64)) as u32
    }
}

/// A value per slot of a tape, stored for every slot but those of copies `2..` where the
/// schedule runs the copies alike ([`Alike`]): theirs follow copies 0 and 1 ([`Rule`]), and
/// a write to one of them changes nothing (the same pass writes copy 1 alike).
#[derive(Clone, Debug, PartialEq)]
pub struct PerSlot<T> {
    values: Vec<T>,
    len: u32,
    ruled: Option<Ruled>,
}

impl<T> Default for PerSlot<T> {
    /// No slots.
    fn default() -> Self {
        PerSlot {
            values: Vec::new(),
            len: 0,
            ruled: None,
        }
    }
}

/// Slots `from..end`: copies `2..` of copies of `period` slots from `first`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ruled {
    first: u32,
    period: u32,
    from: u32,
    end: u32,
}

impl Ruled {
    fn of(a: &Alike) -> Ruled {
        let ruled = a.past_second();
        Ruled {
            first: a.first,
            period: a.period,
            from: ruled.start,
            end: ruled.end,
        }
    }
}

/// Where [`PerSlot`] keeps a slot's value.
enum At {
    Stored(usize),
    /// Copy `b`'s, from copy 0's and copy 1's at these indices.
    Ruled(usize, usize, u32),
}

impl<T: Rule> PerSlot<T> {
    /// `value` for each of `len` slots, copies 2.. of `alike` ruled.
    pub fn new(len: usize, alike: Option<&Alike>, value: T) -> PerSlot<T> {
        let ruled = alike.map(Ruled::of);
        let unstored = ruled.map_or(0, |r| (r.end - r.from) as usize);
        PerSlot {
            values: vec![value; len - unstored],
            len: len as u32,
            ruled,
        }
    }

    /// `f(s)` for each of `len` slots (asked of the stored ones only).
    pub fn from_fn(len: usize, alike: Option<&Alike>, f: impl FnMut(usize) -> T) -> Self {
        let mut out = PerSlot {
            values: Vec::new(),
            len: len as u32,
            ruled: alike.map(Ruled::of),
        };
        out.values = out.stored_slots().map(f).collect();
        out
    }

    /// How many slots.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    fn at(&self, s: usize) -> At {
        match self.ruled {
            Some(r) if s >= r.end as usize => At::Stored(s - (r.end - r.from) as usize),
            Some(r) if s >= r.from as usize => {
                let within = s as u32 - r.first;
                let (b, offset) = (within / r.period, (within % r.period) as usize);
                let copy0 = r.first as usize + offset;
                At::Ruled(copy0, copy0 + r.period as usize, b)
            }
            _ => At::Stored(s),
        }
    }

    /// Slot `s`'s value.
    #[inline]
    pub fn get(&self, s: usize) -> T {
        match self.at(s) {
            At::Stored(i) => self.values[i],
            At::Ruled(c0, c1, b) => T::in_copy(self.values[c0], self.values[c1], b),
        }
    }

    /// Sets slot `s`'s value (nothing, for a ruled slot).
    #[inline]
    pub fn set(&mut self, s: usize, value: T) {
        if let At::Stored(i) = self.at(s) {
            self.values[i] = value;
        }
    }

    /// Sets the value of every slot of `range` (the stored ones).
    pub fn fill(&mut self, range: Range<usize>, value: T) {
        let (start, end) = (self.stored_index(range.start), self.stored_index(range.end));
        self.values[start..end.max(start)].fill(value);
    }

    /// Where slots from `s` on are stored: the index of the first stored one.
    fn stored_index(&self, s: usize) -> usize {
        match self.ruled {
            Some(r) if s >= r.end as usize => s - (r.end - r.from) as usize,
            Some(r) if s >= r.from as usize => r.from as usize,
            _ => s,
        }
    }

    /// The slots whose values are stored, in order.
    pub fn stored_slots(&self) -> impl Iterator<Item = usize> {
        let len = self.len as usize;
        let (from, end) = self
            .ruled
            .map_or((len, len), |r| (r.from as usize, r.end as usize));
        (0..from).chain(end..len)
    }

    /// The ruled slots: copies `2..` (empty where every slot is stored).
    pub fn ruled_slots(&self) -> Range<usize> {
        self.ruled.map_or(0..0, |r| r.from as usize..r.end as usize)
    }

    /// Where `s` is a slot of copy 1, the same slot of copies `2..` (ruled); else none.
    pub fn in_later_copies(&self, s: usize) -> impl Iterator<Item = usize> {
        let (start, step, end) = match self.ruled {
            Some(r) if (r.first + r.period..r.from).contains(&(s as u32)) => {
                (s + r.period as usize, r.period as usize, r.end as usize)
            }
            _ => (0, 1, 0),
        };
        (start..end).step_by(step)
    }

    /// Applies `f` to the value of every stored slot from `s` on (a slot before the copies);
    /// a ruled one's moves with copies 0 and 1 (`f` of an address a shift).
    pub fn update_from(&mut self, s: usize, f: impl FnMut(&mut T)) {
        debug_assert!(self.ruled.map_or(true, |r| s <= r.first as usize));
        self.values[s..].iter_mut().for_each(f);
    }
}
