//! A function's scratch: the values and gradients that never leave a nest's repetition
//! ([`crate::plan::local`]), in an `alloca` of the function's entry block, which the
//! pipeline's SROA turns into registers: per local a double, or where its nest runs in
//! lanes a double per lane of the group, which each vector of the group loads and stores
//! as one.

use inkwell::values::{BasicValue, PointerValue};

use super::lane_io::{LaneIo, Reps, Vector};
use super::{Emit, Emitter, Frame};
use crate::passes::schedule::{Affine, Item};
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
        let ty = self.f64_type().array_type(len);
        Ok(Some(self.builder.build_alloca(ty, "scratch")?))
    }

    /// Where the gradient of `a` for `lanes` lives if it is local: its elements of the
    /// scratch.
    fn local_grad_ptr(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        lanes: Vector,
    ) -> Emit<Option<PointerValue<'ctx>>> {
        let Some(element) = self.plan.grads.local.place(a) else {
            return Ok(None);
        };
        let Scratch::Backward(Some(scratch)) = frame.scratch else {
            unreachable!("backward_body gives every function with local gradients its scratch")
        };
        self.element(scratch, element + lanes.offset).map(Some)
    }

    /// The gradient of `a` for `lanes`, if it is local.
    pub(super) fn local_grad<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        lanes: Vector,
    ) -> Emit<Option<V>> {
        match self.local_grad_ptr(frame, a, lanes)? {
            Some(ptr) => self.load_scratch(ptr, lanes).map(Some),
            None => Ok(None),
        }
    }

    /// Adds `d` into the gradient of `a` for `lanes` if it is local, as into memory:
    /// whether it did.
    pub(super) fn add_local_grad<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        lanes: Vector,
        d: V,
    ) -> Emit<bool> {
        let Some(ptr) = self.local_grad_ptr(frame, a, lanes)? else {
            return Ok(false);
        };
        let before: V = self.load_scratch(ptr, lanes)?;
        let after = self.builder.build_float_add(before, d, "")?;
        self.store_scratch(ptr, after)?;
        Ok(true)
    }

    /// Where the value of `a` for `lanes` lives: not local (the buffers), its elements of
    /// the scratch in forward, or nowhere in backward, which reads no local value.
    fn local_value_place(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        lanes: Vector,
    ) -> Emit<ValuePlace<'ctx>> {
        let Some(element) = self.plan.local_values.place(a) else {
            return Ok(ValuePlace::Buffers);
        };
        match frame.scratch {
            Scratch::Forward(Some(scratch)) => Ok(ValuePlace::Scratch(
                self.element(scratch, element + lanes.offset)?,
            )),
            Scratch::Forward(None) => {
                unreachable!("every forward function with local values gets its scratch")
            }
            Scratch::Backward(_) => Ok(ValuePlace::Unread),
        }
    }

    fn element(&self, scratch: PointerValue<'ctx>, element: u32) -> Emit<PointerValue<'ctx>> {
        let index = self.context.i64_type().const_int(element as u64, false);
        // SAFETY: (of the GEP, not of Rust code) `element` is below the scratch's length,
        // the number of elements of its function's locals (a local's lanes after its first).
        Ok(unsafe {
            self.builder
                .build_in_bounds_gep(self.f64_type(), scratch, &[index], "local")?
        })
    }

    /// The value of `lanes` at `ptr` in the scratch.
    fn load_scratch<V: LaneIo<'ctx>>(&self, ptr: PointerValue<'ctx>, lanes: Vector) -> Emit<V> {
        let v = self.builder.build_load(V::ty(self, lanes), ptr, "")?;
        if let Some(inst) = v.as_instruction_value() {
            // Loads always take an alignment: the scratch's doubles'.
            let _ = inst.set_alignment(8);
        }
        Ok(V::from_basic(v))
    }

    /// Stores `v` at `ptr` in the scratch.
    fn store_scratch<V: LaneIo<'ctx>>(&self, ptr: PointerValue<'ctx>, v: V) -> Emit<()> {
        let _ = self.builder.build_store(ptr, v)?.set_alignment(8);
        Ok(())
    }

    /// The value of `a` for `lanes`, if it is local: from the scratch in forward; in
    /// backward, whose derivatives never read it, NaN (which would poison any that did).
    pub(super) fn local_value<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        lanes: Vector,
    ) -> Emit<Option<V>> {
        match self.local_value_place(frame, a, lanes)? {
            ValuePlace::Buffers => Ok(None),
            ValuePlace::Scratch(ptr) => self.load_scratch(ptr, lanes).map(Some),
            ValuePlace::Unread => {
                V::shared(self, self.f64_type().const_float(f64::NAN), lanes).map(Some)
            }
        }
    }

    /// Stores `v`, the value of `a` for `lanes`, in the scratch if it is local (forward,
    /// which alone stores values): whether it did.
    pub(super) fn store_local_value<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        lanes: Vector,
        v: V,
    ) -> Emit<bool> {
        let ValuePlace::Scratch(ptr) = self.local_value_place(frame, a, lanes)? else {
            return Ok(false);
        };
        self.store_scratch(ptr, v)?;
        Ok(true)
    }

    /// Starts the local gradients of `body` for `reps` (a repetition or a lane group) from
    /// 0, as the zeroed buffer would.
    pub(super) fn zero_local_grads<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        body: &[Item],
        reps: &Reps<'ctx>,
    ) -> Emit<()> {
        for item in body {
            let Item::Map(map) = item else { continue };
            for &lanes in &reps.vectors {
                if let Some(ptr) = self.local_grad_ptr(frame, map.out, lanes)? {
                    let zero = V::shared(self, self.f64_type().const_zero(), lanes)?;
                    self.store_scratch(ptr, zero)?;
                }
            }
        }
        Ok(())
    }
}
