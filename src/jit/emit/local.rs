//! A function's scratch: the values and gradients that never leave a nest's repetition
//! ([`crate::plan::local`]), in an `alloca` of the function's entry block, which the
//! pipeline's SROA turns into registers. Only scalar code (a repetition at a time) reaches
//! them.

use inkwell::values::PointerValue;

use super::lanes::{LaneIo, Vector};
use super::{Emit, Emitter, Frame};
use crate::passes::loops::{Affine, Item};
use crate::plan::local::Locals;

/// A function's scratch, and which pass it belongs to.
#[derive(Clone, Copy)]
pub(super) enum Scratch<'ctx> {
    /// A forward function's local values, if it has any.
    Forward(Option<PointerValue<'ctx>>),
    /// A backward function's local gradients, if it has any (its derivatives read no
    /// local value).
    Backward(Option<PointerValue<'ctx>>),
}

/// Where a value lives ([`Emitter::local_value_place`]).
enum ValuePlace<'ctx> {
    /// Not local: in the buffers.
    Buffers,
    /// A local value in forward: its element of the scratch.
    Scratch(PointerValue<'ctx>),
    /// A local value in backward, which reads none.
    Unread,
}

impl<'ctx, 't> Emitter<'ctx, 't> {
    /// Forward function `function`'s scratch, emitted where the builder is: the function's
    /// entry block (where SROA finds an `alloca`).
    pub(super) fn value_scratch(&self, function: usize) -> Emit<Scratch<'ctx>> {
        Ok(Scratch::Forward(
            self.scratch(&self.plan.local_values, function)?,
        ))
    }

    /// Backward function `function`'s scratch, as [`Emitter::value_scratch`].
    pub(super) fn grad_scratch(&self, function: usize) -> Emit<Scratch<'ctx>> {
        Ok(Scratch::Backward(
            self.scratch(&self.plan.grads.local, function)?,
        ))
    }

    fn scratch(&self, locals: &Locals, function: usize) -> Emit<Option<PointerValue<'ctx>>> {
        let len = locals.scratch_len(function);
        if len == 0 {
            return Ok(None);
        }
        let ty = self.f64_type.array_type(len);
        Ok(Some(self.builder.build_alloca(ty, "scratch")?))
    }

    /// Where the gradient of `a` lives if it is local: its element of the scratch.
    pub(super) fn local_grad_ptr(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
    ) -> Emit<Option<PointerValue<'ctx>>> {
        let Some(element) = self.plan.grads.local.place(a) else {
            return Ok(None);
        };
        let Scratch::Backward(Some(scratch)) = frame.scratch else {
            unreachable!("backward_body gives every function with local gradients its scratch")
        };
        self.element(scratch, element).map(Some)
    }

    /// Where the value of `a` lives: not local (the buffers), its element of the scratch in
    /// forward, or nowhere in backward, which reads no local value.
    fn local_value_place(&self, frame: Frame<'ctx>, a: Affine) -> Emit<ValuePlace<'ctx>> {
        let Some(element) = self.plan.local_values.place(a) else {
            return Ok(ValuePlace::Buffers);
        };
        match frame.scratch {
            Scratch::Forward(Some(scratch)) => {
                Ok(ValuePlace::Scratch(self.element(scratch, element)?))
            }
            Scratch::Forward(None) => {
                unreachable!("every forward function with local values gets its scratch")
            }
            Scratch::Backward(_) => Ok(ValuePlace::Unread),
        }
    }

    fn element(&self, scratch: PointerValue<'ctx>, element: u32) -> Emit<PointerValue<'ctx>> {
        let index = self.context.i64_type().const_int(element as u64, false);
        // SAFETY: (of the GEP, not of Rust code) `element` is below the scratch's length,
        // the number of locals of its kind in this function.
        Ok(unsafe {
            self.builder
                .build_in_bounds_gep(self.f64_type, scratch, &[index], "local")?
        })
    }

    /// The value of `a` for one repetition, if it is local: from the scratch in forward; in
    /// backward, whose derivatives never read it, NaN (which would poison any that did).
    pub(super) fn local_value<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        lanes: Vector,
    ) -> Emit<Option<V>> {
        let x = match self.local_value_place(frame, a)? {
            ValuePlace::Buffers => return Ok(None),
            ValuePlace::Scratch(ptr) => {
                let x = self.builder.build_load(self.f64_type, ptr, "")?;
                x.into_float_value()
            }
            ValuePlace::Unread => self.f64_type.const_float(f64::NAN),
        };
        V::shared(self, x, lanes).map(Some)
    }

    /// Stores `v`, the value of `a` for one repetition, in the scratch if it is local
    /// (forward, which alone stores values): whether it did.
    pub(super) fn store_local_value<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        v: V,
    ) -> Emit<bool> {
        let ValuePlace::Scratch(ptr) = self.local_value_place(frame, a)? else {
            return Ok(false);
        };
        let Some(v) = V::scalar(v) else {
            unreachable!("only a repetition at a time has local values")
        };
        self.builder.build_store(ptr, v)?;
        Ok(true)
    }

    /// Starts the local gradients of a repetition's `body` from 0, as the zeroed buffer
    /// would.
    pub(super) fn zero_local_grads(&self, frame: Frame<'ctx>, body: &[Item]) -> Emit<()> {
        for item in body {
            let Item::Map(map) = item else { continue };
            if let Some(ptr) = self.local_grad_ptr(frame, map.out)? {
                self.builder.build_store(ptr, self.f64_type.const_zero())?;
            }
        }
        Ok(())
    }
}
