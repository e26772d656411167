//! Lane vectors known to be in registers: what a gather read or a scatter wrote earlier in
//! the same basic block, so a later gather of the same slots reuses the value instead of
//! reading memory.
//!
//! LLVM forwards a plain store to a later load of the same address, but not a
//! `llvm.masked.scatter` to a `llvm.masked.gather`: in a nest body of maps of one node
//! (a layer of 2-input neurons), each item's lanes would otherwise wait for the scatter the
//! item before it just issued. A value is reused only while nothing could have changed the
//! slots it came from: every write to a buffer while emitting loop code goes through
//! [`Known::wrote`] (a write whose slots are known) or [`Known::forget`] (any other), and a
//! value is used only in the block that computed it, which it dominates.

use std::cell::RefCell;

use inkwell::basic_block::BasicBlock;
use inkwell::values::{IntValue, PointerValue, VectorValue};

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
}

impl<'ctx> Known<'ctx> {
    /// The value of `place`, if known in `block`.
    pub(super) fn get(
        &self,
        block: BasicBlock<'ctx>,
        place: &Place<'ctx>,
    ) -> Option<VectorValue<'ctx>> {
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
        let mut entries = self.entries.borrow_mut();
        entries.retain(|e| e.block == block);
        entries.push(Entry {
            block,
            place,
            value,
        });
    }

    /// `place` was written: what its slots held is gone; `value`, if given, is what they
    /// hold now.
    pub(super) fn wrote(
        &self,
        block: BasicBlock<'ctx>,
        place: Place<'ctx>,
        value: Option<VectorValue<'ctx>>,
    ) {
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

    /// Some slots were written that no [`Place`] describes: nothing is known any more.
    pub(super) fn forget(&self) {
        self.entries.borrow_mut().clear();
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
}
