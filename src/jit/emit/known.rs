//! Lane vectors known to be in registers: what a gather read or a scatter wrote earlier in
//! the same basic block, so a later gather of the same slots reuses the value instead of
//! reading memory.
//!
//! LLVM forwards a plain store to a later load of the same address, but not a
//! `llvm.masked.scatter` to a `llvm.masked.gather`: in a nest body of maps of one node
//! (a layer of 2-input neurons), each item's lanes would otherwise wait for the scatter the
//! item before it just issued. A value is reused only while nothing could have changed the
//! slots it came from: every write to a buffer while emitting loop code goes through
//! [`Emitter::write`](super::Emitter::write) (a write whose slots are known) or
//! [`Known::forget`] (any other), and a value is used only in the block that computed it,
//! which it dominates.
//!
//! The cache checks that rule instead of trusting it: before each use, it walks the
//! instructions emitted since it last looked, and a store or writing call into a buffer it
//! holds values of that did not go through `write` makes it drop everything it holds
//! ([`Known::check`]): a missed reuse, never a stale value. Debug builds panic there, so the
//! tests name the write that forgot.

use std::cell::{Cell, RefCell};

use inkwell::basic_block::BasicBlock;
use inkwell::values::{InstructionValue, IntValue, PointerValue, VectorValue};

use super::lane_io::{Reps, Vector};
use crate::passes::schedule::Affine;

/// The slots one lane access reaches: `buf[a(t, js with the lanes' level at first + offset
/// + l)]` for lanes `l` in `0..width`.
#[derive(Clone, PartialEq)]
pub(super) struct Place<'ctx> {
    pub(super) buf: PointerValue<'ctx>,
    pub(super) a: Affine,
    pub(super) t: IntValue<'ctx>,
    pub(super) js: Vec<IntValue<'ctx>>,
    /// Per level of `js`, its nest's repetitions: bounds every level's index.
    pub(super) counts: Vec<u32>,
    pub(super) offset: u32,
    pub(super) width: u32,
}

impl<'ctx> Place<'ctx> {
    pub(super) fn new(
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
    ) -> Self {
        Place {
            buf,
            a,
            t,
            js: reps.js.clone(),
            counts: reps.counts.clone(),
            offset: lanes.offset,
            width: lanes.width,
        }
    }

    /// Whether no slot of `self` is a slot of `other`, as far as the emitter can tell.
    fn disjoint(&self, other: &Place<'ctx>) -> bool {
        if self.buf != other.buf {
            return true;
        }
        let (Some(t), Some(u)) = (constant(self.t), constant(other.t)) else {
            return false;
        };
        // In the same repetitions with the same coefficients, the slots differ by a constant:
        // compare the lanes' slots themselves.
        if self.js == other.js && self.a.outer == other.a.outer {
            let theirs = other.lane_slots(u);
            return self.lane_slots(t).all(|s| !theirs.clone().any(|o| o == s));
        }
        // Otherwise the slots of every repetition: disjoint ranges never meet.
        let (lo, hi) = self.range(t);
        let (other_lo, other_hi) = other.range(u);
        hi < other_lo || other_hi < lo
    }

    /// The lanes' slots at step `t`, less what every lane's slot shares (the repetitions
    /// of the nests around): comparable between places of the same repetitions and
    /// coefficients.
    fn lane_slots(&self, t: i64) -> impl Iterator<Item = i64> + Clone {
        let level = self.js.len().saturating_sub(1);
        let (first, across, offset) = (
            self.a.base + self.a.stride * t,
            self.a.outer[level],
            self.offset as i64,
        );
        (0..self.width as i64).map(move |l| first + across * (offset + l))
    }

    /// The lowest and highest slot over every repetition of the nests around.
    fn range(&self, t: i64) -> (i64, i64) {
        let at_t = Affine {
            base: self.a.base + self.a.stride * t,
            stride: 0,
            ..self.a
        };
        at_t.bounds(1, &self.counts)
    }
}

/// `t`'s value, if it is a constant.
fn constant(t: IntValue) -> Option<i64> {
    t.get_sign_extended_constant()
}

struct Entry<'ctx> {
    block: BasicBlock<'ctx>,
    place: Place<'ctx>,
    value: VectorValue<'ctx>,
}

/// The lane vectors known in registers ([module docs](self)).
#[derive(Default)]
pub(super) struct Known<'ctx> {
    entries: RefCell<Vec<Entry<'ctx>>>,
    /// Where the cache last saw every write: a block and its last instruction then (`None`:
    /// it was empty), from which [`Known::check`] walks.
    seen: Cell<Option<(BasicBlock<'ctx>, Option<InstructionValue<'ctx>>)>>,
}

impl<'ctx> Known<'ctx> {
    /// The value of `place`, if known in `block`.
    pub(super) fn get(
        &self,
        block: BasicBlock<'ctx>,
        place: &Place<'ctx>,
    ) -> Option<VectorValue<'ctx>> {
        self.check(block);
        let entries = self.entries.borrow();
        let entry = entries
            .iter()
            .rev()
            .find(|e| e.block == block && e.place == *place)?;
        Some(entry.value)
    }

    /// `value` was read from `place` in `block`.
    pub(super) fn read(
        &self,
        block: BasicBlock<'ctx>,
        place: Place<'ctx>,
        value: VectorValue<'ctx>,
    ) {
        self.check(block);
        let mut entries = self.entries.borrow_mut();
        entries.retain(|e| e.block == block);
        entries.push(Entry {
            block,
            place,
            value,
        });
    }

    /// `place` is about to be written (the caller emits the write, then calls
    /// [`Known::written`]): what its slots held is gone; `value`, if given, is what they hold
    /// then.
    pub(super) fn will_write(
        &self,
        block: BasicBlock<'ctx>,
        place: Place<'ctx>,
        value: Option<VectorValue<'ctx>>,
    ) {
        self.check(block);
        let mut entries = self.entries.borrow_mut();
        entries.retain(|e| e.block == block && e.place.disjoint(&place));
        if let Some(value) = value {
            entries.push(Entry {
                block,
                place,
                value,
            });
        }
    }

    /// The write announced by [`Known::will_write`] is emitted, up to the end of `block`.
    pub(super) fn written(&self, block: BasicBlock<'ctx>) {
        self.seen.set(Some((block, block.get_last_instruction())));
    }

    /// Some slots were written that no [`Place`] describes (up to the end of `block`, if
    /// any): nothing is known any more.
    pub(super) fn forget(&self, block: Option<BasicBlock<'ctx>>) {
        self.entries.borrow_mut().clear();
        self.seen.set(block.map(|b| (b, b.get_last_instruction())));
    }

    /// Drops everything the cache holds if, since it last looked, an instruction of `block`
    /// wrote into a buffer whose values it holds without telling it (debug builds panic:
    /// [module docs](self)). Then it has seen everything up to the end of `block`.
    fn check(&self, block: BasicBlock<'ctx>) {
        let first = match self.seen.get() {
            Some((b, Some(last))) if b == block => last.get_next_instruction(),
            _ => block.get_first_instruction(),
        };
        let mut entries = self.entries.borrow_mut();
        let held = entries.iter().filter(|e| e.block == block);
        let held: Vec<PointerValue> = held.map(|e| e.place.buf).collect();
        if let Some(inst) = untold::first_write(first, &held) {
            debug_assert!(
                false,
                "loop code wrote a buffer behind Known's back: {inst:?}"
            );
            entries.clear();
        }
        self.seen.set(Some((block, block.get_last_instruction())));
    }
}

/// What [`Known::check`] looks for.
mod untold {
    use inkwell::values::{
        BasicValue, BasicValueEnum, InstructionOpcode, InstructionValue, Operand, PointerValue,
    };

    /// The first instruction from `first` on that writes into one of the buffers `held`.
    pub(super) fn first_write<'ctx>(
        first: Option<InstructionValue<'ctx>>,
        held: &[PointerValue<'ctx>],
    ) -> Option<InstructionValue<'ctx>> {
        let mut instructions = std::iter::successors(first, |i| i.get_next_instruction());
        instructions.find(|&inst| {
            written_bases(inst).any(|base| held.iter().any(|&b| base == BasicValueEnum::from(b)))
        })
    }

    /// The buffers `inst` may write into, each as the pointer its addresses start from: a
    /// store's, and any pointer operand's of a call that stores (a scatter, a masked or
    /// compressing store, `memset`, `memcpy`).
    fn written_bases(inst: InstructionValue<'_>) -> impl Iterator<Item = BasicValueEnum<'_>> {
        let operand = |k: u32| match inst.get_operand(k) {
            Some(Operand::Value(v)) => Some(v),
            _ => None,
        };
        let pointers: Vec<BasicValueEnum> = match inst.get_opcode() {
            InstructionOpcode::Store => operand(1).into_iter().collect(),
            InstructionOpcode::Call => {
                let n = inst.get_num_operands();
                let callee = operand(n.saturating_sub(1)).map(|f| f.get_name().to_owned());
                let stores = callee.is_some_and(|name| {
                    let name = name.to_string_lossy();
                    ["scatter", "store", "memset", "memcpy", "memmove"]
                        .iter()
                        .any(|w| name.contains(w))
                });
                match stores {
                    true => (0..n.saturating_sub(1)).filter_map(operand).collect(),
                    false => Vec::new(),
                }
            }
            _ => Vec::new(),
        };
        pointers.into_iter().map(base)
    }

    /// The pointer `v`'s addresses are formed from: through its `getelementptr`s to the first
    /// that is not one (a buffer's pointer).
    fn base(v: BasicValueEnum<'_>) -> BasicValueEnum<'_> {
        let mut v = v;
        while let Some(inst) = v.as_instruction_value() {
            match (inst.get_opcode(), inst.get_operand(0)) {
                (InstructionOpcode::GetElementPtr, Some(Operand::Value(from))) => v = from,
                _ => break,
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use inkwell::context::Context;
    use inkwell::AddressSpace;

    use super::*;
    use crate::passes::schedule::MAX_NEST_DEPTH;

    fn affine(base: i64, stride: i64, outer: &[i64]) -> Affine {
        let mut a = Affine {
            base,
            stride,
            outer: [0; MAX_NEST_DEPTH],
        };
        a.outer[..outer.len()].copy_from_slice(outer);
        a
    }

    #[test]
    fn places_are_disjoint_only_when_provably_so() {
        let context = Context::create();
        let module = context.create_module("known");
        let i64t = context.i64_type();
        let ptr = context.ptr_type(AddressSpace::default());
        let f = module.add_function(
            "f",
            i64t.fn_type(&[ptr.into(), ptr.into(), i64t.into()], false),
            None,
        );
        let (vals, grads) = (
            f.get_nth_param(0).unwrap().into_pointer_value(),
            f.get_nth_param(1).unwrap().into_pointer_value(),
        );
        let (copy, t_var) = (
            f.get_nth_param(2).unwrap().into_int_value(),
            i64t.const_zero(),
        );
        let zero = i64t.const_zero();
        // Lanes 0..8 of a layer of 16 neurons (slots 4 apart) in copy `copy` of 100 (369
        // apart).
        let place = |buf, a, t, offset| Place {
            buf,
            a,
            t,
            js: vec![copy, zero],
            counts: vec![100, 16],
            offset,
            width: 8,
        };
        let sums = place(grads, affine(639, 0, &[369, 4]), zero, 0);
        // Itself, and the same slots in the other buffer.
        assert!(!sums.disjoint(&sums));
        assert!(sums.disjoint(&place(vals, affine(639, 0, &[369, 4]), zero, 0)));
        // The next item's slots, and the other vector of lanes.
        assert!(sums.disjoint(&place(grads, affine(640, 0, &[369, 4]), zero, 0)));
        assert!(sums.disjoint(&place(grads, affine(639, 0, &[369, 4]), zero, 8)));
        // A slot 32 on is lane 8: the first vector misses it, the second meets it.
        let further = place(grads, affine(671, 0, &[369, 4]), zero, 0);
        assert!(sums.disjoint(&further));
        assert!(!place(grads, affine(639, 0, &[369, 4]), zero, 8).disjoint(&further));
        // The biases (params, shared by the copies) lie below every copy's slots; a slot of
        // the copies' region may be any copy's.
        assert!(sums.disjoint(&place(grads, affine(32, 0, &[0, 1]), zero, 0)));
        assert!(!sums.disjoint(&place(grads, affine(700, 0, &[0, 1]), zero, 0)));
        // A step the emitter cannot see is any step.
        let stepped = place(grads, affine(700, 1, &[369, 4]), t_var, 0);
        assert!(!sums.disjoint(&Place { t: copy, ..stepped }));
    }

    /// A store into a buffer whose lanes the cache holds, emitted without
    /// [`Known::will_write`], is caught at the next look (a panic in debug builds; the lanes
    /// dropped in others); one that announced itself is not.
    #[test]
    fn an_untold_write_into_a_held_buffer_is_refused() {
        let context = Context::create();
        let module = context.create_module("known");
        let (f64t, i64t) = (context.f64_type(), context.i64_type());
        let ptr = context.ptr_type(AddressSpace::default());
        let f = module.add_function("f", context.void_type().fn_type(&[ptr.into()], false), None);
        let vals = f.get_nth_param(0).unwrap().into_pointer_value();
        let block = context.append_basic_block(f, "entry");
        let builder = context.create_builder();
        builder.position_at_end(block);
        let zero = i64t.const_zero();
        let place = Place {
            buf: vals,
            a: affine(0, 0, &[1]),
            t: zero,
            js: vec![zero],
            counts: vec![8],
            offset: 0,
            width: 8,
        };
        let lanes = f64t.vec_type(8).const_zero();
        let store = |at: u64| {
            // SAFETY: (of the GEP, not of Rust code) the function never runs.
            let p = unsafe { builder.build_gep(f64t, vals, &[i64t.const_int(at, false)], "") };
            builder.build_store(p.unwrap(), f64t.const_zero()).unwrap();
        };
        let known = Known::default();
        known.read(block, place.clone(), lanes);
        known.will_write(block, place.clone(), Some(lanes));
        store(0);
        known.written(block);
        assert!(known.get(block, &place).is_some());
        store(100);
        let reused =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| known.get(block, &place)));
        // Debug builds name the forgetful write; others no longer reuse the lanes.
        assert_eq!(reused.is_err(), cfg!(debug_assertions));
        if let Ok(value) = reused {
            assert!(value.is_none(), "a stale value reused");
        }
    }
}
