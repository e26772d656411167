//! A node's operand slots, as [`super::Tape::args`] gives them: stored, or (a copy past the
//! first of a batch's, [`super::copies`]) the first copy's moved.

use super::Slot;

/// Operand `k` is `slots[k] + copy * moves[k]` (`moves` empty: `slots[k]`).
#[derive(Clone, Copy, Debug)]
pub struct Args<'t> {
    slots: &'t [Slot],
    moves: &'t [i64],
    copy: i64,
}

impl<'t> Args<'t> {
    /// Operands as stored.
    pub(super) fn stored(slots: &'t [Slot]) -> Args<'t> {
        Args {
            slots,
            moves: &[],
            copy: 0,
        }
    }

    /// The first copy's operands `slots`, each moved `copy` times by its `moves`.
    pub(super) fn moved(slots: &'t [Slot], moves: &'t [i64], copy: u32) -> Args<'t> {
        debug_assert_eq!(slots.len(), moves.len());
        Args {
            slots,
            moves,
            copy: copy as i64,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Operand `k`; panics past the last, as indexing a slice does.
    #[inline]
    pub fn get(&self, k: usize) -> Slot {
        match self.moves.is_empty() {
            true => self.slots[k],
            false => Slot((self.slots[k].0 as i64 + self.copy * self.moves[k]) as u32),
        }
    }

    /// Operands `range`.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Args<'t> {
        Args {
            slots: &self.slots[range.clone()],
            moves: if self.moves.is_empty() {
                &[]
            } else {
                &self.moves[range]
            },
            copy: self.copy,
        }
    }

    pub fn iter(&self) -> ArgsIter<'t> {
        ArgsIter {
            slots: self.slots.iter(),
            moves: self.moves.iter(),
            copy: self.copy,
        }
    }

    pub fn contains(&self, s: Slot) -> bool {
        self.iter().any(|a| a == s)
    }

    pub fn to_vec(self) -> Vec<Slot> {
        self.iter().collect()
    }
}

impl<'t> IntoIterator for Args<'t> {
    type Item = Slot;
    type IntoIter = ArgsIter<'t>;

    fn into_iter(self) -> ArgsIter<'t> {
        self.iter()
    }
}

/// [`Args::iter`]: the operands in order.
#[derive(Clone, Debug)]
pub struct ArgsIter<'t> {
    slots: std::slice::Iter<'t, Slot>,
    /// Empty for stored operands: as fast as the slice's own iterator then.
    moves: std::slice::Iter<'t, i64>,
    copy: i64,
}

impl ArgsIter<'_> {
    #[inline]
    fn moved(&self, s: Slot, by: Option<&i64>) -> Slot {
        match by {
            None => s,
            Some(&by) => Slot((s.0 as i64 + self.copy * by) as u32),
        }
    }
}

impl Iterator for ArgsIter<'_> {
    type Item = Slot;

    #[inline]
    fn next(&mut self) -> Option<Slot> {
        let s = *self.slots.next()?;
        let by = self.moves.next();
        Some(self.moved(s, by))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.slots.size_hint()
    }
}

impl ExactSizeIterator for ArgsIter<'_> {}

impl DoubleEndedIterator for ArgsIter<'_> {
    #[inline]
    fn next_back(&mut self) -> Option<Slot> {
        let s = *self.slots.next_back()?;
        let by = self.moves.next_back();
        Some(self.moved(s, by))
    }
}

impl PartialEq<[Slot]> for Args<'_> {
    fn eq(&self, other: &[Slot]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}
