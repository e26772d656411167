//! A batch's copies in the plan: where the schedule runs the tape's copies alike, the plan
//! stores their per-slot data once.
//!
//! The plan answers questions per slot (is it kept? at which address?), and a batch written
//! as copies has millions of slots: at B = 128 copies of MNIST's 784-50-10, 5.2 million,
//! each copy asking what the one before it asked. Where the tape stores its copies once
//! ([`Tape::copies`]) and the schedule runs every copy alike ([`CopiesRunAlike`]: one nest
//! over the copies, and whatever else reaches into them reading every copy the same way),
//! every per-slot answer in copy `b >= 2` follows from copies 0 and 1: a flag is copy 1's, an
//! address continues from copy 0 to copy 1 (copies lie side by side, each as far after the
//! one before). So a [`PerSlot`] stores copies 0 and 1 and everything outside the copies,
//! and the passes that fill one walk the copies nest over its first two repetitions only
//! ([`CopiesRunAlike::counts`]): the plan's cost no longer grows with the batch, but for what
//! lies outside the copies (the inputs, a sum over the copies' losses).
//!
//! Why it holds: every repetition of the nest is the first moved by the copies' period, the
//! tape's copies are the first moved likewise (both checked, [`Tape::verify`] and
//! [`super::Plan::verify`]), and nothing else reads one copy differently from another; so a
//! pass that decides per slot from the item and the tape decides the same in every copy, and
//! a layout that places each copy as it placed the one before places copy `b` as far after
//! copy 1 as copy 1 lies after copy 0. The plan's tests compare every answer with a plan
//! that stores every slot.
//!
//! [`PerSlot`]: super::PerSlot

use std::borrow::Cow;
use std::ops::Range;

use crate::passes::schedule::{every_iteration, AccessKind, Affine, Item, Nest};
use crate::tape::{Slot, Tape};

/// A tape's copies that the schedule runs alike: a top-level item is a nest over all of
/// them (each repetition writing its own copy, [`CopiesRunAlike::nests_copies`]), and every
/// other item, the outputs and the loss read copies `1..` alike (of each slot of a copy
/// read, that slot in every copy from 1 on, as many times: a sum over the copies' losses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopiesRunAlike {
    first: u32,
    period: u32,
    count: u32,
}

impl CopiesRunAlike {
    /// The tape's copies, if `items` (top-level) run them alike.
    pub fn of(tape: &Tape, items: &[Item]) -> Option<CopiesRunAlike> {
        let copies = CopiesRunAlike::of_tape(tape)?;
        let nest = items.iter().position(|item| copies.nests_copies(item))?;
        let shown = tape.outputs().iter().copied().chain(tape.loss());
        let read = (items.iter().enumerate())
            .all(|(k, item)| k == nest || copies.reads_copies_alike(tape, item));
        (read && copies.reads_alike(shown)).then_some(copies)
    }

    /// These copies, if every sum part of `functions` (the plan's cut of the schedule they
    /// were found in) reads none of them: a sum over the copies cut into parts reads some
    /// copies in one function, others in the next.
    pub fn in_functions(self, tape: &Tape, functions: &[Vec<Item>]) -> Option<CopiesRunAlike> {
        let parts_alike = (functions.iter().flatten()).all(|item| {
            !matches!(item, Item::SumPart { .. }) || self.reads_copies_alike(tape, item)
        });
        parts_alike.then_some(self)
    }

    /// The tape's copies (at least 3), whether or not a schedule runs them alike: what
    /// [`CopiesRunAlike::nests_copies`] and [`CopiesRunAlike::first_two_of`] ask about.
    pub fn of_tape(tape: &Tape) -> Option<CopiesRunAlike> {
        let c = tape.copies()?;
        (c.count >= 3).then_some(CopiesRunAlike {
            first: c.first,
            period: c.period,
            count: c.count,
        })
    }

    /// `copies`, if `item` (a top-level item) is their nest: what a walk over the item cuts
    /// to the first two copies.
    pub fn around<'a>(
        copies: Option<&'a CopiesRunAlike>,
        item: &Item,
    ) -> Option<&'a CopiesRunAlike> {
        copies.filter(|c| c.nests_copies(item))
    }

    /// The slots of the copies.
    pub fn slots(&self) -> Range<u32> {
        self.first..self.first + self.period * self.count
    }

    /// The slots of copies `2..`: those whose data follow copies 0 and 1.
    pub fn past_second(&self) -> Range<u32> {
        self.copy(2).start..self.slots().end
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
        let copies = self.slots();
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
        let copies = self.slots();
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
        let later = self.copy(1).start..self.slots().end;
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
    /// top-level item whose copies' nest is `around` ([`CopiesRunAlike::around`]), with the
    /// copies cut to the first two where `at` moves with them (the others' data follow
    /// theirs): a walk over `at`'s slots asks those of copies 0 and 1 and every slot outside
    /// the copies.
    pub fn cut(around: Option<&CopiesRunAlike>, at: Affine, counts: &[u32]) -> Vec<u32> {
        let mut out = counts.to_vec();
        if let (Some(a), Some(copies)) = (around, out.first_mut()) {
            if at.outer[0] == a.period as i64 {
                *copies = (*copies).min(2);
            }
        }
        out
    }

    /// [`CopiesRunAlike::cut`], and each level `at` does not move along cut to one repetition
    /// ([`Affine::moving_counts`]): the repetitions whose slots differ.
    pub fn counts(around: Option<&CopiesRunAlike>, at: Affine, counts: &[u32]) -> Vec<u32> {
        CopiesRunAlike::cut(around, at, &at.moving_counts(counts))
    }

    /// `counts` (of the nests around a nest in the copies' nest `around`, outermost first),
    /// the copies cut to the first two: for a walk over what each repetition writes, all of
    /// which moves with the copies.
    pub fn outer_counts(around: Option<&CopiesRunAlike>, counts: &[u32]) -> Vec<u32> {
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
    pub fn first_two<'i>(copies: Option<&CopiesRunAlike>, items: &'i [Item]) -> Vec<Cow<'i, Item>> {
        (items.iter())
            .map(|item| match copies.and_then(|c| c.first_two_of(item)) {
                Some(first_two) => Cow::Owned(first_two),
                None => Cow::Borrowed(item),
            })
            .collect()
    }
}
