//! Values and gradients that never leave a repetition: a rollout step's intermediate results.
//!
//! A nest's body's nodes (maps of one) read values, and take gradients, from the nodes of
//! the same repetition: `dx` of a spring feeds `dx * dx` and `f * dx` of the same spring.
//! Two kinds of them need no memory; the emitter keeps them in their function's scratch (an
//! `alloca` that LLVM turns into registers: a scalar per local where the nest runs one
//! repetition at a time, a vector per local and vector of a lane group where it runs in
//! lanes, each lane its own repetition's), and the buffers do not keep them:
//!
//! - **Local gradients**: a node whose every gradient addition comes from its own
//!   repetition's body. Its gradient is complete when backward (the body from its last item)
//!   reaches the node, and nothing else reads it. It starts from 0 as each repetition's (or
//!   lane group's) backward starts and is added into as memory would be, so every bit is the
//!   same; nothing zeroes it in memory.
//! - **Local values**: a node whose every reader is in its own repetition's body and whose
//!   value no derivative reads ([`crate::op::Op::backward_reads`]: not its own, not its
//!   readers'), such as `dx * dx`, read only by a sum. Backward never loads it.
//!
//! Not in a nest whose backward adds shared gradients after its repetitions
//! ([`crate::plan::SharedGrad`]).
//!
//! [`crate::Program::value`] and `grad` call what the buffers do not keep not kept;
//! [`crate::Program::every_value_and_grad`] recomputes it. Outputs and the loss are never
//! local.

use std::collections::HashMap;

use crate::op::BackwardReads;
use crate::passes::schedule::{every_repetition, Affine, Item, MapLoop};
use crate::plan::{CopiesRunAlike, Nests, PerSlot};
use crate::tape::{Slot, Tape};

/// Slots of one kind (values or gradients) kept in their function's scratch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Locals {
    /// Per local slot sequence (the output of a map of one in a nest's body, stride 0): its
    /// element of its function's scratch.
    place: HashMap<Affine, u32>,
    /// Per function: how many elements its scratch has.
    scratch: Vec<u32>,
    /// Per slot: whether it is local.
    slots: PerSlot<bool>,
    /// How many slots are local.
    count: usize,
}

impl Locals {
    fn new(tape: &Tape, functions: usize, copies: Option<&CopiesRunAlike>) -> Locals {
        Locals {
            place: HashMap::new(),
            scratch: vec![0; functions],
            slots: PerSlot::new(tape.len(), copies, false),
            count: 0,
        }
    }

    /// The scratch element of `a` (a map of one's output or operand in a nest's body), if
    /// it is local: its first lane's (the lanes of a group follow it).
    pub fn place(&self, a: Affine) -> Option<u32> {
        self.place.get(&key(a)).copied()
    }

    /// How many elements function `function`'s scratch has.
    pub fn scratch_len(&self, function: usize) -> u32 {
        self.scratch.get(function).copied().unwrap_or(0)
    }

    /// Whether `slot` is local.
    pub fn is_local(&self, slot: Slot) -> bool {
        slot.index() < self.slots.len() && self.slots.get(slot.index())
    }

    /// How many slots are local.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The places forgotten, the slots still local: a plan `Plan::verify` must refuse.
    #[cfg(test)]
    pub fn forget_places(&mut self) {
        self.place.clear();
    }

    /// Makes `out` (a map of one's output, in nests of `counts` repetitions, `lanes` of them
    /// at a time; `around`: the copies, if it lies in their nest) local to `function`:
    /// `lanes` elements of its scratch, one per lane. (Each body item is visited once: no
    /// slot is inserted twice.)
    fn insert(
        &mut self,
        out: Affine,
        counts: &[u32],
        around: Option<&CopiesRunAlike>,
        function: usize,
        lanes: u32,
    ) {
        self.place.insert(key(out), self.scratch[function]);
        self.scratch[function] += lanes;
        self.count += counts.iter().map(|&c| c as usize).product::<usize>();
        every_repetition(&CopiesRunAlike::cut(around, out, counts), |js| {
            self.slots.set(out.at_levels(0, js).index(), true);
            true
        });
    }
}

/// The local gradients and the local values of `functions`' nests (run as `nests` says;
/// copies `2..` of `copies` stored once).
pub fn find(
    tape: &Tape,
    functions: &[Vec<Item>],
    nests: &Nests,
    copies: Option<&CopiesRunAlike>,
) -> (Locals, Locals) {
    let mut found = Found {
        grads: Locals::new(tape, functions.len(), copies),
        values: Locals::new(tape, functions.len(), copies),
    };
    let mut outputs: Vec<Slot> = tape.outputs().iter().copied().chain(tape.loss()).collect();
    outputs.sort_unstable();
    let finder = Finder {
        tape,
        nests,
        outputs,
    };
    for (k, function) in functions.iter().enumerate() {
        for item in function {
            let around = CopiesRunAlike::around(copies, item);
            finder.visit(item, &mut Vec::new(), (k, around), &mut found);
        }
    }
    (found.grads, found.values)
}

/// A map of one's slot in every repetition: its stride says nothing.
fn key(a: Affine) -> Affine {
    Affine { stride: 0, ..a }
}

/// A slot sequence's readers among a body's maps of one (the same slots in the same
/// repetition): operand positions, gradient additions, and whether a derivative reads it.
#[derive(Clone, Copy, Default)]
struct Readers {
    uses: u32,
    additions: u32,
    read_back: bool,
}

struct Found {
    grads: Locals,
    values: Locals,
}

/// How many repetitions a nest's forward and backward run at a time.
#[derive(Clone, Copy)]
struct GroupSizes {
    forward: u32,
    backward: u32,
}

struct Finder<'t> {
    tape: &'t Tape,
    nests: &'t Nests,
    /// The outputs and the loss (read from outside), sorted.
    outputs: Vec<Slot>,
}

impl Finder<'_> {
    /// Finds the locals in `item`'s nests, inside nests of `counts` repetitions that run
    /// one repetition at a time (`around`: the copies, if they lie in their nest).
    fn visit(
        &self,
        item: &Item,
        counts: &mut Vec<u32>,
        function: (usize, Option<&CopiesRunAlike>),
        found: &mut Found,
    ) {
        let Item::Nest(nest) = item else { return };
        let plan = self.nests.of(nest);
        if !plan.shared_grads.is_empty() {
            return;
        }
        counts.push(nest.count);
        let lanes = GroupSizes {
            forward: plan.lanes.forward().unwrap_or(1),
            backward: plan.lanes.backward().unwrap_or(1),
        };
        self.body(&nest.body, counts, function, found, lanes);
        for b in &nest.body {
            self.visit(b, counts, function, found);
        }
        counts.pop();
    }

    /// The locals among the maps of one of a body, checked in every repetition: gradients
    /// whose additions all come from maps of one of the same body and repetition, and
    /// values that only such maps read and that no derivative reads. In lanes, each lane's
    /// repetition keeps them in its own element.
    fn body(
        &self,
        body: &[Item],
        counts: &[u32],
        (function, around): (usize, Option<&CopiesRunAlike>),
        found: &mut Found,
        lanes: GroupSizes,
    ) {
        // The maps of one, each with what its derivative reads (if backward runs it).
        let maps: Vec<(&MapLoop, BackwardReads)> = body
            .iter()
            .filter_map(|b| match b {
                Item::Map(m) if m.len == 1 => Some((m, m.op.backward_reads(&m.grad_args))),
                _ => None,
            })
            .collect();
        let mut readers: HashMap<Affine, Readers> = HashMap::new();
        for (m, backward) in &maps {
            for (i, &a) in m.args.iter().enumerate() {
                let r = readers.entry(key(a)).or_default();
                r.uses += 1;
                r.additions += (m.needs_grad && m.grad_args[i]) as u32;
                r.read_back |= m.needs_grad && backward.operands[i];
            }
        }
        let consumers = self.tape.consumers();
        for (m, backward) in maps {
            let Readers {
                uses,
                additions,
                read_back,
            } = readers.get(&key(m.out)).copied().unwrap_or_default();
            // (`Consumers` stops counting at 255.)
            let all = |counted: &dyn Fn(Slot) -> u8, n: u32| {
                n < u8::MAX as u32
                    && every_repetition(&CopiesRunAlike::cut(around, m.out, counts), |js| {
                        let s = m.out.at_levels(0, js);
                        counted(s) as u32 == n && self.outputs.binary_search(&s).is_err()
                    })
            };
            let grad_additions = |s| consumers.grad_additions(s);
            if m.needs_grad && all(&grad_additions, additions) {
                found
                    .grads
                    .insert(m.out, counts, around, function, lanes.backward);
            }
            let own_read_back = m.needs_grad && backward.out;
            if !read_back && !own_read_back && all(&|s| consumers.uses(s), uses) {
                found
                    .values
                    .insert(m.out, counts, around, function, lanes.forward);
            }
        }
    }
}
