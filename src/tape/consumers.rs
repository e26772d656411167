//! [`Consumers`]: who reads each slot, counted once for every pass that asks.

use std::collections::HashMap;

use super::{Slot, Tape};

/// Who reads each slot: what several planning passes ask of every slot, counted in one walk
/// over the operands ([`Tape::consumers`]). A batch's copies (the tape stores them once) are
/// counted once too: a copy's nodes read its own slots as the first copy's read the first's,
/// so copy `b`'s counts are the first copy's (its last consumers `b` copies on), plus what
/// the nodes after the copies, the outputs and the loss read of it (a sum over the copies'
/// losses; an output in one copy), kept apart.
#[derive(Clone, Debug)]
pub(crate) struct Consumers {
    /// Per stored slot (every slot but copies `1..`, [`Consumers::counted_at`]): its counts,
    /// a copy's from the copies' nodes only.
    counts: Vec<Count>,
    /// The tape's copies: (first slot, period, count).
    copies: Option<(u32, u32, u32)>,
    /// Per slot of the copies that a node after them, an output or the loss reads: those
    /// reads' counts.
    after: HashMap<u32, Count>,
    /// Per slot of a copy (its offset in it): whether any copy's slot there is in `after`.
    read_after: Vec<bool>,
}

/// The counts of one slot.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Count {
    /// The operand positions that read it, plus one per output or loss that names it (at most
    /// 255 counted).
    uses: u8,
    /// Where it takes a gradient ([`Tape::takes_grad`]): the additions compiled backward makes
    /// into it, one per operand position of a node it visits (at most 255 counted); 0 for any
    /// other slot.
    grad_additions: u8,
    /// The last node that adds into its gradient (backward's first, in the interpreter's
    /// order), or [`Consumers::NONE`].
    last_grad_consumer: u32,
}

impl Count {
    const ZERO: Count = Count {
        uses: 0,
        grad_additions: 0,
        last_grad_consumer: Consumers::NONE,
    };

    /// `reads` reads more, `adds` of which add into the gradient, the last of those by `by`.
    fn read(&mut self, reads: u32, adds: u32, by: u32) {
        let saturated = |n: u32| n.min(255) as u8;
        self.uses = self.uses.saturating_add(saturated(reads));
        if adds > 0 {
            self.grad_additions = self.grad_additions.saturating_add(saturated(adds));
            // (A copy past the first may come after a later copy's read of the same slot.)
            self.last_grad_consumer = self.later(by);
        }
    }

    /// The later of this count's last consumer and `by`.
    fn later(&self, by: u32) -> u32 {
        match self.last_grad_consumer {
            Consumers::NONE => by,
            last => last.max(by),
        }
    }
}

impl Consumers {
    pub const NONE: u32 = u32::MAX;

    pub(super) fn of(tape: &Tape) -> Consumers {
        let n = tape.len() as u32;
        let copies = tape.copies().map(|c| (c.first, c.period, c.count));
        let unstored = copies.map_or(0, |(_, period, count)| (count - 1) * period);
        let mut c = Consumers {
            counts: vec![Count::ZERO; (n - unstored) as usize],
            copies,
            after: HashMap::new(),
            read_after: vec![false; copies.map_or(0, |(_, period, _)| period as usize)],
        };
        match tape.copies() {
            None => (0..n).for_each(|s| c.count(tape, Slot(s))),
            Some(copies) => {
                (0..copies.first).for_each(|s| c.count(tape, Slot(s)));
                c.count_copies(tape);
                (copies.range().end..n).for_each(|s| c.count(tape, Slot(s)));
            }
        }
        for &o in tape.outputs.iter().chain(&tape.loss) {
            c.read(o, 1, 0, Consumers::NONE);
        }
        c
    }

    /// How many operand positions read `s`, plus one per output or loss that names it (at
    /// most 255 counted).
    pub fn uses(&self, s: Slot) -> u8 {
        self.count_of(s).uses
    }

    /// The additions compiled backward makes into `s`'s gradient (at most 255 counted).
    pub fn grad_additions(&self, s: Slot) -> u8 {
        self.count_of(s).grad_additions
    }

    /// The last node that adds into `s`'s gradient (backward's first, in the interpreter's
    /// order), or [`Consumers::NONE`].
    pub fn last_grad_consumer(&self, s: Slot) -> u32 {
        self.count_of(s).last_grad_consumer
    }

    /// Whether a node after the copies, an output or the loss reads the slot of any copy
    /// that lies where `s` lies in its own (false for a slot outside the copies).
    pub fn read_after_the_copies(&self, s: Slot) -> bool {
        match (self.copies, self.counted_at(s)) {
            (Some((first, period, _)), (_, Some(_))) => {
                self.read_after[((s.0 - first) % period) as usize]
            }
            _ => false,
        }
    }

    fn count_of(&self, s: Slot) -> Count {
        let (at, copy) = self.counted_at(s);
        let mut count = self.counts[at];
        let (Some(b), Some((first, period, _))) = (copy, self.copies) else {
            return count;
        };
        if count.last_grad_consumer != Consumers::NONE {
            count.last_grad_consumer += b * period;
        }
        let after = (self.read_after[((s.0 - first) % period) as usize])
            .then(|| self.after.get(&s.0))
            .flatten();
        if let Some(after) = after {
            count.uses = count.uses.saturating_add(after.uses);
            count.grad_additions = count.grad_additions.saturating_add(after.grad_additions);
            if after.last_grad_consumer != Consumers::NONE {
                count.last_grad_consumer = count.later(after.last_grad_consumer);
            }
        }
        count
    }

    /// Where `s`'s counts are stored, and its copy if it is in the copies (whose counts are
    /// the first copy's).
    fn counted_at(&self, s: Slot) -> (usize, Option<u32>) {
        match self.copies {
            Some((first, period, count)) if s.0 >= first => {
                let end = first + period * count;
                if s.0 >= end {
                    ((s.0 - (count - 1) * period) as usize, None)
                } else {
                    let within = s.0 - first;
                    ((first + within % period) as usize, Some(within / period))
                }
            }
            _ => (s.index(), None),
        }
    }

    /// Counts node `s`'s reads.
    fn count(&mut self, tape: &Tape, s: Slot) {
        let grad = tape.takes_grad(s);
        for a in tape.args(s) {
            let adds = grad && tape.takes_grad(a);
            self.read(a, 1, adds as u32, s.0);
        }
    }

    /// `reads` reads of `a`, `adds` of which add into its gradient, the last of those by `by`,
    /// a node that is not in the copies (or none: an output's or the loss's).
    fn read(&mut self, a: Slot, reads: u32, adds: u32, by: u32) {
        match self.counted_at(a) {
            (_, Some(_)) => {
                let (first, period, _) = self.copies.expect("in the copies");
                self.read_after[((a.0 - first) % period) as usize] = true;
                let after = self.after.entry(a.0).or_insert(Count::ZERO);
                after.read(reads, adds, by);
            }
            (at, None) => self.counts[at].read(reads, adds, by),
        }
    }

    /// The copies' reads: the first copy's, counted node by node (what they read of their
    /// own copy stands for every copy's), then each other copy's reads of the slots before
    /// the copies, as the first's moved (every copy the same slot of a shared param).
    fn count_copies(&mut self, tape: &Tape) {
        let c = tape.copies().expect("copies");
        let first_copy = c.first..c.first + c.period;
        // The first copy's reads of slots before it, per slot: (reads, additions, last).
        let mut before: Vec<(u32, u32, u32)> = Vec::new();
        let mut index_of = vec![u32::MAX; c.first as usize];
        for s in first_copy.map(Slot) {
            let grad = tape.takes_grad(s);
            for a in tape.args(s) {
                let adds = grad && tape.takes_grad(a);
                // (Its own copy's slots are stored where they are.)
                self.counts[a.index()].read(1, adds as u32, s.0);
                if a.0 < c.first {
                    let k = &mut index_of[a.index()];
                    if *k == u32::MAX {
                        *k = before.len() as u32;
                        before.push((a.0, 0, 0));
                    }
                    let entry = &mut before[*k as usize];
                    entry.1 += 1;
                    entry.2 += adds as u32;
                    // (The last adding read lies in the counts already.)
                }
            }
        }
        for &(a, reads, adds) in &before {
            let stride = c.stride(Slot(a)).expect("the first copy reads it");
            let last = self.counts[a as usize].last_grad_consumer;
            let others = c.count - 1;
            if stride == 0 {
                // A shared slot: every other copy's reads at once.
                let last_copy = last.wrapping_add(others * c.period);
                let times = |n: u32| n.saturating_mul(others);
                self.counts[a as usize].read(times(reads), times(adds), last_copy);
                continue;
            }
            for b in 1..c.count {
                let moved = (a as i64 + b as i64 * stride) as usize;
                self.counts[moved].read(reads, adds, last.wrapping_add(b * c.period));
            }
        }
    }

    /// Moves the params' counts as a param layout moves them: the one in slot `from[s]` to
    /// slot `s` (params read nothing: only their own counts move).
    pub(super) fn move_params(&mut self, from: &[u32]) {
        super::move_params(&mut self.counts, from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::{Activation, Layer};
    use crate::{Graph, Value};
    use rand::SeedableRng;

    /// The counts of a tape with copies are those of the same tape storing every node.
    #[test]
    fn copies_count_as_every_node_stored() {
        for with_grad in [false, true] {
            let g = Graph::new();
            let mut rng = rand::rngs::StdRng::seed_from_u64(5);
            let hidden = Layer::new(&g, 3, 4, Activation::Relu, &mut rng);
            let readout = Layer::new(&g, 4, 1, Activation::Linear, &mut rng);
            let mut hs = Vec::new();
            let outs: Vec<Value<'_>> = (0..6)
                .map(|_| {
                    let x = match with_grad {
                        true => g.inputs(3),
                        false => g.inputs_without_grad(3),
                    };
                    let h = hidden.call(&x).unwrap();
                    hs.push(h[1]);
                    let y = readout.call(&h).unwrap()[0];
                    y * y + x[0]
                })
                .collect();
            // After the copies: a read of copy 2's hidden value, and an output of copy 4's.
            g.add_output(hs[4]).unwrap();
            g.set_loss(g.sum(&outs) * hs[2]).unwrap();
            let tape = Tape::from_graph(&g).unwrap();
            assert_eq!(tape.copies().map(|c| c.count), Some(6));
            let counted = Consumers::of(&tape);
            let stored = Consumers::of(&tape.clone().without_copies());
            for s in tape.slots() {
                assert_eq!(counted.count_of(s), stored.count_of(s), "{s:?}");
            }
        }
    }
}
