//! [`Consumers`]: who reads each slot, counted once for every pass that asks.

use super::{Slot, Tape};

/// Who reads each slot: what several planning passes ask of every slot, counted in one walk
/// over the operands ([`Tape::consumers`]).
#[derive(Clone, Debug)]
pub(crate) struct Consumers {
    /// Per slot: the operand positions that read it, plus one per output or loss that names
    /// it (at most 255 counted).
    pub uses: Vec<u8>,
    /// Per slot that takes a gradient ([`Tape::takes_grad`]): the additions compiled backward
    /// makes into it, one per operand position of a node it visits (at most 255 counted); 0
    /// for any other slot.
    pub grad_additions: Vec<u8>,
    /// Per slot: the last node that adds into its gradient (backward's first, in the
    /// interpreter's order), or [`Consumers::NONE`].
    pub last_grad_consumer: Vec<u32>,
}

impl Consumers {
    pub const NONE: u32 = u32::MAX;

    pub(super) fn of(tape: &Tape) -> Consumers {
        let n = tape.len();
        let mut c = Consumers {
            uses: vec![0u8; n],
            grad_additions: vec![0u8; n],
            last_grad_consumer: vec![Consumers::NONE; n],
        };
        match tape.copies() {
            None => (0..n as u32).for_each(|s| c.count(tape, Slot(s))),
            Some(copies) => {
                (0..copies.first).for_each(|s| c.count(tape, Slot(s)));
                c.count_copies(tape);
                (copies.range().end..n as u32).for_each(|s| c.count(tape, Slot(s)));
            }
        }
        for o in tape.outputs.iter().chain(&tape.loss) {
            c.uses[o.index()] = c.uses[o.index()].saturating_add(1);
        }
        c
    }

    /// Counts node `s`'s reads.
    fn count(&mut self, tape: &Tape, s: Slot) {
        let grad = tape.takes_grad(s);
        for a in tape.args(s) {
            let adds = grad && tape.takes_grad(a);
            self.read(a, 1, adds as u32, s.0);
        }
    }

    /// `reads` reads of `a`, `adds` of which add into its gradient, the last of those by `by`.
    fn read(&mut self, a: Slot, reads: u32, adds: u32, by: u32) {
        let i = a.index();
        let saturated = |n: u32| n.min(255) as u8;
        self.uses[i] = self.uses[i].saturating_add(saturated(reads));
        if adds > 0 {
            self.grad_additions[i] = self.grad_additions[i].saturating_add(saturated(adds));
            let last = &mut self.last_grad_consumer[i];
            // (A copy past the first may come after a later copy's read of the same slot.)
            if *last == Consumers::NONE || *last < by {
                *last = by;
            }
        }
    }

    /// The copies' reads: the first copy's, counted node by node, then each other copy's as
    /// the first's moved (a copy reads its own slots as the first reads its own, and the slots
    /// before the copies at their strides: every copy the same slot of a shared param).
    fn count_copies(&mut self, tape: &Tape) {
        let c = tape.copies().expect("copies");
        let first_copy = c.first as usize..(c.first + c.period) as usize;
        // The first copy's reads of slots before it, per slot: (reads, additions, last).
        let mut before: Vec<(u32, u32, u32)> = Vec::new();
        let mut index_of = vec![u32::MAX; c.first as usize];
        for s in first_copy.clone().map(|s| Slot(s as u32)) {
            let grad = tape.takes_grad(s);
            for a in tape.args(s) {
                let adds = grad && tape.takes_grad(a);
                self.read(a, 1, adds as u32, s.0);
                if a.0 < c.first {
                    let k = &mut index_of[a.index()];
                    if *k == u32::MAX {
                        *k = before.len() as u32;
                        before.push((a.0, 0, 0));
                    }
                    let entry = &mut before[*k as usize];
                    entry.1 += 1;
                    entry.2 += adds as u32;
                    // (The last adding read lies in `last_grad_consumer` already.)
                }
            }
        }
        let period = c.period as usize;
        for b in 1..c.count as usize {
            // The copy's own slots: the first copy's counts, its last consumers moved.
            let copy = first_copy.start + b * period..first_copy.end + b * period;
            self.uses.copy_within(first_copy.clone(), copy.start);
            self.grad_additions
                .copy_within(first_copy.clone(), copy.start);
            for (k, s) in copy.enumerate() {
                let last = self.last_grad_consumer[first_copy.start + k];
                self.last_grad_consumer[s] = match last {
                    Consumers::NONE => last,
                    _ => last + (b * period) as u32,
                };
            }
        }
        for &(a, reads, adds) in &before {
            let stride = c.stride(Slot(a)).expect("the first copy reads it");
            let last = self.last_grad_consumer[a as usize];
            let others = c.count - 1;
            if stride == 0 {
                // A shared slot: every other copy's reads at once.
                let last_copy = last.wrapping_add(others * c.period);
                let times = |n: u32| n.saturating_mul(others);
                self.read(Slot(a), times(reads), times(adds), last_copy);
                continue;
            }
            for b in 1..c.count {
                let moved = Slot((a as i64 + b as i64 * stride) as u32);
                self.read(moved, reads, adds, last.wrapping_add(b * c.period));
            }
        }
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
            assert_eq!(counted.uses, stored.uses);
            assert_eq!(counted.grad_additions, stored.grad_additions);
            assert_eq!(counted.last_grad_consumer, stored.last_grad_consumer);
        }
    }
}
