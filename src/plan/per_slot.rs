//! [`PerSlot`], the plan's table of a value per slot of the tape: kept, address, a local's
//! place, a gradient's. Every decision module fills one, with or without copies; where the
//! schedule runs a batch's copies alike ([`CopiesRunAlike`], [`super::copies`]), it stores
//! copies 0 and 1 only, and the others' values follow from theirs ([`CopyRule`]).

use std::num::NonZeroU32;
use std::ops::Range;

use super::copies::CopiesRunAlike;

/// A value per slot: how one of copies `2..` gets its own from copies 0 and 1.
pub trait CopyRule: Copy {
    /// The value in copy `b >= 2`, given the same slot's in copies 0 and 1.
    fn in_copy(copy0: Self, copy1: Self, b: u32) -> Self;
}

impl CopyRule for bool {
    fn in_copy(_: bool, copy1: bool, _: u32) -> bool {
        copy1
    }
}

impl CopyRule for Option<NonZeroU32> {
    fn in_copy(_: Self, copy1: Self, _: u32) -> Self {
        copy1
    }
}

/// An address: copy `b` lies as far after copy `b - 1` as copy 1 after copy 0.
impl CopyRule for u32 {
    fn in_copy(copy0: u32, copy1: u32, b: u32) -> u32 {
        (copy1 as i64 + (b as i64 - 1) * (copy1 as i64 - copy0 as i64)) as u32
    }
}

/// A value per slot of a tape, stored for every slot but those of copies `2..` where the
/// schedule runs the copies alike ([`CopiesRunAlike`]): theirs follow copies 0 and 1
/// ([`CopyRule`]), and a write to one of them changes nothing (the same pass writes copy 1
/// alike).
#[derive(Clone, Debug, PartialEq)]
pub struct PerSlot<T> {
    values: Vec<T>,
    len: u32,
    ruled: Option<RuledCopies>,
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
struct RuledCopies {
    first: u32,
    period: u32,
    from: u32,
    end: u32,
}

impl RuledCopies {
    fn of(copies: &CopiesRunAlike) -> RuledCopies {
        let (copy0, ruled) = (copies.copy(0), copies.past_second());
        RuledCopies {
            first: copy0.start,
            period: copy0.end - copy0.start,
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

impl<T: CopyRule> PerSlot<T> {
    /// `value` for each of `len` slots, copies 2.. of `copies` ruled.
    pub fn new(len: usize, copies: Option<&CopiesRunAlike>, value: T) -> PerSlot<T> {
        let ruled = copies.map(RuledCopies::of);
        let unstored = ruled.map_or(0, |r| (r.end - r.from) as usize);
        PerSlot {
            values: vec![value; len - unstored],
            len: len as u32,
            ruled,
        }
    }

    /// `f(s)` for each of `len` slots (asked of the stored ones only).
    pub fn from_fn(len: usize, copies: Option<&CopiesRunAlike>, f: impl FnMut(usize) -> T) -> Self {
        let mut out = PerSlot {
            values: Vec::new(),
            len: len as u32,
            ruled: copies.map(RuledCopies::of),
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
