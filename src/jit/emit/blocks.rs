//! What every part of the emitter builds control flow and lane tests from: phis joining
//! arms, a loop counted at run time, whether lanes are finite or -0, the function being
//! emitted and its entry block's stack slots.

use inkwell::basic_block::BasicBlock;
use inkwell::types::BasicTypeEnum;
use inkwell::values::{FunctionValue, IntValue, PointerValue, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};

use super::{Emit, Emitter};

impl<'ctx> Emitter<'ctx, '_> {
    /// Per carried value, a phi of its `arms` (values, and the block each comes from).
    pub(super) fn join(
        &self,
        arms: &[(&[VectorValue<'ctx>], BasicBlock<'ctx>)],
    ) -> Emit<Vec<VectorValue<'ctx>>> {
        (0..arms[0].0.len())
            .map(|v| {
                let phi = self.builder.build_phi(arms[0].0[v].get_type(), "sum")?;
                for (values, from) in arms {
                    phi.add_incoming(&[(&values[v], *from)]);
                }
                Ok(phi.as_basic_value().into_vector_value())
            })
            .collect()
    }

    /// A loop over `k` in `0..n` (`n` known at run time only, maybe 0) carrying `carried`:
    /// `body(k, current)` returns the next values; the values after the last iteration.
    pub(super) fn counted_loop(
        &self,
        n: IntValue<'ctx>,
        carried: &[VectorValue<'ctx>],
        body: impl FnMut(&Self, IntValue<'ctx>, &[VectorValue<'ctx>]) -> Emit<Vec<VectorValue<'ctx>>>,
    ) -> Emit<Vec<VectorValue<'ctx>>> {
        let f = self.current_function();
        let entry = self.block();
        let (looped, done) = (
            self.context.append_basic_block(f, "steps"),
            self.context.append_basic_block(f, "steps_done"),
        );
        let zero = self.context.i64_type().const_zero();
        let empty = self
            .builder
            .build_int_compare(IntPredicate::EQ, n, zero, "empty")?;
        self.builder.build_conditional_branch(empty, done, looped)?;

        self.builder.position_at_end(looped);
        let after = self.loop_to(n, false, carried, body)?;
        let looped_end = self.block();
        self.builder.build_unconditional_branch(done)?;

        self.builder.position_at_end(done);
        self.join(&[(carried, entry), (&after, looped_end)])
    }

    /// Whether every lane of every vector of `xs` is finite (`x - x` is 0 exactly then).
    pub(super) fn all_finite(&self, xs: &[VectorValue<'ctx>]) -> Emit<IntValue<'ctx>> {
        let mut not_finite = Vec::with_capacity(xs.len());
        for &g in xs {
            let d = self.builder.build_float_sub(g, g, "")?;
            let zero = g.get_type().const_zero();
            let bad = self
                .builder
                .build_float_compare(FloatPredicate::UNE, d, zero, "")?;
            not_finite.push(self.any_lane(bad)?);
        }
        let any = self.or_all(&not_finite)?;
        self.builder.build_not(any, "finite")
    }

    /// Whether a lane of a vector of `sums` is -0.
    pub(super) fn any_negative_zero(&self, sums: &[VectorValue<'ctx>]) -> Emit<IntValue<'ctx>> {
        let i64t = self.context.i64_type();
        let mut found = Vec::with_capacity(sums.len());
        for &s in sums {
            let width = s.get_type().get_size();
            let bits = self
                .builder
                .build_bit_cast(s, i64t.vec_type(width), "")?
                .into_vector_value();
            let negative_zero = self.broadcast_int(i64t.const_int(1 << 63, false), width)?;
            let is = self
                .builder
                .build_int_compare(IntPredicate::EQ, bits, negative_zero, "")?;
            found.push(self.any_lane(is)?);
        }
        self.or_all(&found)
    }

    /// Whether any lane of the `i1` vector `v` is set.
    fn any_lane(&self, v: VectorValue<'ctx>) -> Emit<IntValue<'ctx>> {
        let or = self.intrinsic("llvm.vector.reduce.or", &[v.get_type().into()])?;
        let any = self.builder.build_call(or, &[v.into()], "any")?;
        Ok(any
            .try_as_basic_value()
            .basic()
            .map_or(self.context.bool_type().const_zero(), |v| {
                v.into_int_value()
            }))
    }

    /// The `or` of `bits` (false if there are none).
    fn or_all(&self, bits: &[IntValue<'ctx>]) -> Emit<IntValue<'ctx>> {
        let mut acc = self.context.bool_type().const_zero();
        for &b in bits {
            acc = self.builder.build_or(acc, b, "")?;
        }
        Ok(acc)
    }

    /// `x` in every lane of an integer vector of `width`.
    fn broadcast_int(&self, x: IntValue<'ctx>, width: u32) -> Emit<VectorValue<'ctx>> {
        self.broadcast(x.into(), x.get_type().vec_type(width))
    }

    /// The function being emitted.
    pub(super) fn current_function(&self) -> FunctionValue<'ctx> {
        self.block()
            .get_parent()
            .expect("the block is in a function")
    }

    /// A stack slot of `ty` in the function's entry block (so LLVM sees a fixed frame).
    pub(super) fn entry_alloca(
        &self,
        ty: BasicTypeEnum<'ctx>,
        name: &str,
    ) -> Emit<PointerValue<'ctx>> {
        let here = self.block();
        let entry = self
            .current_function()
            .get_first_basic_block()
            .expect("the function has an entry block");
        match entry.get_first_instruction() {
            Some(first) => self.builder.position_before(&first),
            None => self.builder.position_at_end(entry),
        }
        let slot = self.builder.build_alloca(ty, name)?;
        self.builder.position_at_end(here);
        Ok(slot)
    }
}
