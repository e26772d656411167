//! Gradients that never leave a repetition: a rollout step's intermediate results.
//!
//! Where a nest's repetitions run backward one at a time, its body's nodes (maps of one)
//! take their gradients from the nodes after them in the body, and most of those are in
//! the same repetition: `dx` of a spring feeds `dx * dx` and `f * dx` of the same spring.
//! When every addition into a node's gradient comes from its own repetition's body, that
//! gradient is complete by the time backward (which runs the body from its last item)
//! reaches the node, and nothing else reads it. It needs no memory: the emitter keeps it in
//! its function's scratch (an `alloca` LLVM turns into registers), set to 0 when each
//! repetition's backward starts and added into as memory would be, so every bit is the
//! same. The gradients buffer does not keep it: nothing zeroes it there,
//! [`crate::Program::grad`] calls it not kept, and
//! [`crate::Program::every_value_and_grad`] recomputes it.

use std::collections::HashMap;

use crate::passes::loops::{every_repetition, Affine, Item, MapLoop};
use crate::tape::{Slot, Tape};

/// The gradients that live in their function's scratch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalGrads {
    /// Per local gradient (the output of a map of one in a nest's body, stride 0): its
    /// element of its function's scratch.
    place: HashMap<Affine, u32>,
    /// Per function: how many elements its scratch has.
    scratch: Vec<u32>,
    /// Per slot: whether its gradient is local.
    slots: Vec<bool>,
}

impl LocalGrads {
    /// The local gradients of `functions`' nests.
    pub fn find(tape: &Tape, functions: &[Vec<Item>]) -> LocalGrads {
        let mut found = LocalGrads {
            place: HashMap::new(),
            scratch: vec![0; functions.len()],
            slots: vec![false; tape.len()],
        };
        let mut outputs = vec![false; tape.len()];
        for s in tape.outputs().iter().chain(&tape.loss()) {
            outputs[s.index()] = true;
        }
        let finder = Finder { tape, outputs };
        for (k, function) in functions.iter().enumerate() {
            for item in function {
                finder.visit(item, &mut Vec::new(), k, &mut found);
            }
        }
        found
    }

    /// The scratch element of the gradient of `a`, a map of one's output or operand in a
    /// nest's body, if it is local.
    pub fn place(&self, a: Affine) -> Option<u32> {
        self.place.get(&key(a)).copied()
    }

    /// How many gradients backward function `function` keeps in its scratch.
    pub fn scratch_len(&self, function: usize) -> u32 {
        self.scratch.get(function).copied().unwrap_or(0)
    }

    /// Whether `slot`'s gradient is local (not in the gradients buffer).
    pub fn is_local(&self, slot: Slot) -> bool {
        self.slots.get(slot.index()).copied().unwrap_or(false)
    }

    /// How many slots' gradients are local.
    pub fn count(&self) -> usize {
        self.slots.iter().filter(|&&l| l).count()
    }
}

/// A map of one's slot in every repetition: its stride says nothing.
fn key(a: Affine) -> Affine {
    Affine { stride: 0, ..a }
}

struct Finder<'t> {
    tape: &'t Tape,
    /// Per slot: an output or the loss (read from outside).
    outputs: Vec<bool>,
}

impl Finder<'_> {
    /// Finds the local gradients in `item`'s nests, inside nests of `counts` repetitions
    /// whose backward runs one repetition at a time.
    fn visit(&self, item: &Item, counts: &mut Vec<u32>, function: usize, found: &mut LocalGrads) {
        let Item::Nest(nest) = item else { return };
        if nest.lanes.backward().is_some() || !nest.shared_grads.is_empty() {
            return;
        }
        counts.push(nest.count);
        self.body(&nest.body, counts, function, found);
        for b in &nest.body {
            self.visit(b, counts, function, found);
        }
        counts.pop();
    }

    /// The local gradients among the maps of one of a body: those whose additions, in
    /// every repetition, all come from maps of one of the same body and repetition.
    fn body(&self, body: &[Item], counts: &[u32], function: usize, found: &mut LocalGrads) {
        let maps: Vec<&MapLoop> = body
            .iter()
            .filter_map(|b| match b {
                Item::Map(m) if m.len == 1 && m.needs_grad => Some(m),
                _ => None,
            })
            .collect();
        let mut additions: HashMap<Affine, u32> = HashMap::new();
        for m in &maps {
            for (&a, _) in m.args.iter().zip(&m.grad_args).filter(|(_, &g)| g) {
                *additions.entry(key(a)).or_default() += 1;
            }
        }
        let counted = &self.tape.consumers().grad_additions;
        for m in maps {
            let n = additions.get(&key(m.out)).copied().unwrap_or(0);
            // (`grad_additions` stops counting at 255.)
            let all_local = n < u8::MAX as u32
                && every_repetition(counts, |js| {
                    let s = m.out.at_levels(0, js);
                    counted[s.index()] as u32 == n && !self.outputs[s.index()]
                });
            if !all_local || found.place.contains_key(&key(m.out)) {
                continue;
            }
            found.place.insert(key(m.out), found.scratch[function]);
            found.scratch[function] += 1;
            every_repetition(counts, |js| {
                found.slots[m.out.at_levels(0, js).index()] = true;
                true
            });
        }
    }
}
