//! Where each slot lives in the native buffers.
//!
//! The tape gives every node a slot, but the native code keeps a fused dot's products in
//! registers: their slots are never read or written. Left in place, they space out what is:
//! a layer's sums sit a whole row of products apart, and each copy of a batch spreads its
//! activations over a page per neuron. So the buffers hold the kept slots only, in slot order
//! (a slot's address is the number of kept slots before it): a layer's sums side by side, a
//! copy's activations in a few lines. Params and inputs come first on the tape and are all
//! kept, so they keep their slots: whatever writes them (inputs, `set_params`) is unchanged.
//!
//! Loops address memory by affine sequences of slots; the emitter maps each to addresses
//! ([`Buffers::affine`]). That is exact only where the sequence stays affine once mapped (as
//! it does wherever a loop's repetitions are alike: each holds as many kept slots); where one
//! does not, every slot keeps its own address.

use crate::passes::loops::{every_repetition, Affine, Item};
use crate::tape::{Slot, Tape};

/// The address of each slot in the values and gradients buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffers {
    /// Per slot, and one past the last: the kept slots before it.
    address: Vec<u32>,
}

impl Buffers {
    /// Kept slots side by side, if every loop's addresses stay affine; else every slot at
    /// its own.
    pub fn new(tape: &Tape, kept: &[bool], functions: &[Vec<Item>]) -> Buffers {
        let mut address = Vec::with_capacity(kept.len() + 1);
        let mut n = 0u32;
        for &k in kept {
            address.push(n);
            n += k as u32;
        }
        address.push(n);
        let compact = Buffers { address };
        let leaves_in_place =
            (0..tape.num_params() + tape.num_inputs()).all(|s| compact.address[s] as usize == s);
        if leaves_in_place && compact.keeps_loops_affine(kept, functions) {
            compact
        } else {
            Buffers::slot_by_slot(tape.len())
        }
    }

    /// Every slot at its own address.
    pub fn slot_by_slot(slots: usize) -> Buffers {
        Buffers {
            address: (0..=slots as u32).collect(),
        }
    }

    /// The buffers' length: how many slots they hold.
    pub fn buffer_len(&self) -> usize {
        *self.address.last().expect("one past the last slot") as usize
    }

    /// The address of slot `s` (of a kept slot; an unkept one gets the next kept one's).
    pub fn address(&self, s: Slot) -> usize {
        self.address[s.index()] as usize
    }

    /// Whether every slot is at its own address.
    pub fn in_place(&self) -> bool {
        self.buffer_len() + 1 == self.address.len()
    }

    /// A buffer in slot order (one number per slot), laid out.
    pub fn lay_out(&self, in_slot_order: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; self.buffer_len()];
        for (s, &x) in in_slot_order.iter().enumerate() {
            if self.holds(s) {
                out[self.address[s] as usize] = x;
            }
        }
        out
    }

    /// A laid-out buffer in slot order, into `out` (0 for the slots it does not hold).
    pub fn in_slot_order(&self, laid_out: &[f64], out: &mut Vec<f64>) {
        out.clear();
        let slots = self.address.len() - 1;
        out.extend((0..slots).map(|s| match self.holds(s) {
            true => laid_out[self.address[s] as usize],
            false => 0.0,
        }));
    }

    /// Whether the buffers hold slot `s`.
    fn holds(&self, s: usize) -> bool {
        self.address[s + 1] > self.address[s]
    }

    /// Per address, `which` of its slot.
    pub fn compact(&self, which: &[bool]) -> Vec<bool> {
        let mut out = vec![false; self.buffer_len()];
        for (s, &w) in which.iter().enumerate() {
            if w && self.holds(s) {
                out[self.address[s] as usize] = true;
            }
        }
        out
    }

    /// The addresses of the slots of `a` (`a` at iteration `t`, repetitions `js`, is at
    /// `affine(a)` there). Exact for the sequences of kept slots that loops read and write
    /// ([`Buffers::new`] checked them all) and, since they keep their slots, any sequence of
    /// params and inputs.
    pub fn affine(&self, a: Affine) -> Affine {
        let at = |s: i64| -> i64 {
            usize::try_from(s)
                .ok()
                .and_then(|s| self.address.get(s))
                .map_or(s, |&addr| addr as i64)
        };
        let base = at(a.base);
        let mut out = a;
        out.base = base;
        if a.stride != 0 {
            out.stride = at(a.base + a.stride) - base;
        }
        for (o, &step) in out.outer.iter_mut().zip(&a.outer) {
            if step != 0 {
                *o = at(a.base + step) - base;
            }
        }
        out
    }

    /// Whether every sequence of kept slots a loop reads or writes is affine in addresses.
    fn keeps_loops_affine(&self, kept: &[bool], functions: &[Vec<Item>]) -> bool {
        functions.iter().flatten().all(|item| {
            item.nested_accesses().iter().all(|(access, counts)| {
                let (a, mapped) = (access.at, self.affine(access.at));
                // Slots and addresses computed per repetition, then moved by their strides.
                every_repetition(counts, |js| {
                    let (s0, m0) = (
                        a.at_levels(0, js).0 as i64,
                        mapped.at_levels(0, js).0 as i64,
                    );
                    (0..access.len as i64).all(|t| {
                        let s = (s0 + a.stride * t) as usize;
                        kept[s] && self.address[s] as i64 == m0 + mapped.stride * t
                    })
                })
            })
        })
    }
}
