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
            args: *self,
            next: 0,
            end: self.len(),
        }
    }

    pub fn contains(&self, s: Slot) -> bool {
        self.iter().any(|a| a == s)
    }

    pub fn to_vec(&self) -> Vec<Slot> {
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
    args: Args<'t>,
    next: usize,
    end: usize,
}

impl Iterator for ArgsIter<'_> {
    type Item = Slot;

    #[inline]
    fn next(&mut self) -> Option<Slot> {
        (self.next < self.end).then(|| {
            self.next += 1;
            self.args.get(self.next - 1)
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.end - self.next, Some(self.end - self.next))
    }
}

impl ExactSizeIterator for ArgsIter<'_> {}

impl DoubleEndedIterator for ArgsIter<'_> {
    fn next_back(&mut self) -> Option<Slot> {
        (self.next < self.end).then(|| {
            self.end -= 1;
            self.args.get(self.end)
        })
    }
}

impl PartialEq<[Slot]> for Args<'_> {
    fn eq(&self, other: &[Slot]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}
