//! [`Arith`] as LLVM IR: the JIT's instance of the op formulas.

use inkwell::builder::{Builder, BuilderError};
use inkwell::intrinsics::Intrinsic;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicTypeEnum, FloatType, VectorType};
use inkwell::values::{
    BasicValue, BasicValueEnum, FastMathFlags, FloatMathValue, FloatValue, FunctionValue,
    IntMathValue, IntValue, VectorValue,
};
use inkwell::FloatPredicate;

use crate::op::{Arith, MathFn, Table, LOG_OFFSET, ROUNDER};

/// What emitting IR returns: inkwell's builder fails only on misuse.
pub(super) type Emit<T> = Result<T, BuilderError>;

/// What [`IrArith`] computes on: one `f64` (a [`FloatValue`]), or a vector of them (a
/// [`VectorValue`]), one lane per repetition of a nest. Every IEEE operation acts lane by
/// lane, so a lane computes exactly what the scalar code would.
pub(super) trait ScalarOrVector<'ctx>: FloatMathValue<'ctx> + Copy {
    /// The IR type of a value.
    type Ty: Copy + inkwell::types::BasicType<'ctx>;
    /// An `i64` per lane, for building numbers from bits.
    type Int: IntMathValue<'ctx> + BasicValue<'ctx> + Copy;
    /// Whether [`MathFn::formula`]s are emitted inline by default (on vectors: one formula
    /// computes every lane) rather than called (on scalars: a formula is some 50
    /// instructions, and straight-line code may use it thousands of times; loop code asks
    /// for them inline, [`IrArith::with_formulas_inline`]).
    const INLINE_FORMULAS: bool;
    fn ty_of(self) -> Self::Ty;
    /// The type of [`ScalarOrVector::Int`] of as many lanes as `ty`.
    fn int_ty(ty: Self::Ty) -> BasicTypeEnum<'ctx>;
    fn int_splat(ty: Self::Ty, c: u64) -> Self::Int;
    fn int_from_basic(v: BasicValueEnum<'ctx>) -> Self::Int;
    fn splat(ty: Self::Ty, c: f64) -> Self;
    fn undef(ty: Self::Ty) -> Self;
    fn from_basic(v: BasicValueEnum<'ctx>) -> Self;
    /// `f(args...)`, lane by lane: the math functions are scalar.
    fn call(
        builder: &Builder<'ctx>,
        ty: Self::Ty,
        f: FunctionValue<'ctx>,
        args: &[Self],
    ) -> Emit<Self>;
}

impl<'ctx> ScalarOrVector<'ctx> for FloatValue<'ctx> {
    type Ty = FloatType<'ctx>;
    type Int = IntValue<'ctx>;
    const INLINE_FORMULAS: bool = false;
    fn ty_of(self) -> Self::Ty {
        self.get_type()
    }
    fn int_ty(ty: Self::Ty) -> BasicTypeEnum<'ctx> {
        ty.get_context().i64_type().into()
    }
    fn int_splat(ty: Self::Ty, c: u64) -> Self::Int {
        ty.get_context().i64_type().const_int(c, false)
    }
    fn int_from_basic(v: BasicValueEnum<'ctx>) -> Self::Int {
        v.into_int_value()
    }
    fn splat(ty: Self::Ty, c: f64) -> Self {
        ty.const_float(c)
    }
    fn undef(ty: Self::Ty) -> Self {
        ty.get_undef()
    }
    fn from_basic(v: BasicValueEnum<'ctx>) -> Self {
        v.into_float_value()
    }
    fn call(
        builder: &Builder<'ctx>,
        ty: Self::Ty,
        f: FunctionValue<'ctx>,
        args: &[Self],
    ) -> Emit<Self> {
        let args: Vec<_> = args.iter().map(|&a| a.into()).collect();
        let call = builder.build_call(f, &args, "")?;
        Ok(call
            .try_as_basic_value()
            .basic()
            .map_or_else(|| ty.get_undef(), |v| v.into_float_value()))
    }
}

impl<'ctx> ScalarOrVector<'ctx> for VectorValue<'ctx> {
    type Ty = VectorType<'ctx>;
    type Int = VectorValue<'ctx>;
    const INLINE_FORMULAS: bool = true;
    fn ty_of(self) -> Self::Ty {
        self.get_type()
    }
    fn int_ty(ty: Self::Ty) -> BasicTypeEnum<'ctx> {
        ty.get_context().i64_type().vec_type(ty.get_size()).into()
    }
    fn int_splat(ty: Self::Ty, c: u64) -> Self::Int {
        let lane = ty.get_context().i64_type().const_int(c, false);
        VectorType::const_vector(&vec![lane; ty.get_size() as usize])
    }
    fn int_from_basic(v: BasicValueEnum<'ctx>) -> Self::Int {
        v.into_vector_value()
    }
    fn splat(ty: Self::Ty, c: f64) -> Self {
        let lane = ty.get_element_type().into_float_type().const_float(c);
        VectorType::const_vector(&vec![lane; ty.get_size() as usize])
    }
    fn undef(ty: Self::Ty) -> Self {
        ty.get_undef()
    }
    fn from_basic(v: BasicValueEnum<'ctx>) -> Self {
        v.into_vector_value()
    }
    fn call(
        builder: &Builder<'ctx>,
        ty: Self::Ty,
        f: FunctionValue<'ctx>,
        args: &[Self],
    ) -> Emit<Self> {
        let lane_ty = ty.get_element_type().into_float_type();
        let i32t = ty.get_context().i32_type();
        let mut out = ty.get_undef();
        for lane in 0..ty.get_size() {
            let index = i32t.const_int(lane as u64, false);
            let scalars = args
                .iter()
                .map(|&a| {
                    Ok(builder
                        .build_extract_element(a, index, "")?
                        .into_float_value())
                })
                .collect::<Emit<Vec<_>>>()?;
            let r = FloatValue::call(builder, lane_ty, f, &scalars)?;
            out = builder.build_insert_element(out, r, index, "")?;
        }
        Ok(out)
    }
}

/// The module's declaration of each [`MathFn`].
pub(super) type MathTable<'ctx> = std::collections::HashMap<MathFn, FunctionValue<'ctx>>;

/// [`Arith`] over an LLVM builder: each method emits the one instruction (or math call) the
/// interpreter performs, on one value or on every lane of a vector. Builder errors (an
/// unpositioned builder, a bug of ours) are kept and reported by [`IrArith::finish`].
pub(super) struct IrArith<'a, 'ctx, V: ScalarOrVector<'ctx> = FloatValue<'ctx>> {
    builder: &'a Builder<'ctx>,
    /// Where intrinsics (`llvm.fma`) are declared.
    module: &'a Module<'ctx>,
    ty: V::Ty,
    math: &'a MathTable<'ctx>,
    error: Option<BuilderError>,
    /// Fast-math flags for every arithmetic instruction (none in exact code).
    flags: Option<FastMathFlags>,
    /// Whether [`MathFn::formula`]s are emitted inline, not called
    /// ([`ScalarOrVector::INLINE_FORMULAS`] unless [`IrArith::with_formulas_inline`]).
    inline: bool,
}

impl<'a, 'ctx, V: ScalarOrVector<'ctx>> IrArith<'a, 'ctx, V> {
    /// An emitter at the builder's position for values of type `ty`, calling the math
    /// functions `math` declares.
    pub(super) fn new(
        builder: &'a Builder<'ctx>,
        module: &'a Module<'ctx>,
        ty: V::Ty,
        math: &'a MathTable<'ctx>,
    ) -> Self {
        IrArith {
            builder,
            module,
            ty,
            math,
            error: None,
            flags: None,
            inline: V::INLINE_FORMULAS,
        }
    }

    /// The same emitter, emitting formulas inline on scalars too: for loop code, emitted
    /// once per loop (straight-line code may use a formula thousands of times, each a call).
    /// Inline, a loop body's independent calls overlap, and their branches are branches.
    pub(super) fn with_formulas_inline(mut self) -> Self {
        self.inline = true;
        self
    }

    /// The same emitter, putting `flags` on every arithmetic instruction.
    pub(super) fn with_fast_math(mut self, flags: Option<FastMathFlags>) -> Self {
        self.flags = flags;
        self
    }

    pub(super) fn finish(self) -> Emit<()> {
        self.error.map_or(Ok(()), Err)
    }

    /// [`Arith::branch_gt_with`] on lanes: `then` alone where every lane has `a > b`,
    /// `otherwise` alone where none has, both and a select where they disagree.
    fn branch_on_lanes(
        &mut self,
        a: V,
        b: V,
        then: &impl Fn(&mut Self) -> V,
        otherwise: &impl Fn(&mut Self) -> V,
    ) -> Emit<V> {
        let builder = self.builder;
        let here = builder
            .get_insert_block()
            .ok_or(BuilderError::UnsetPosition)?;
        let f = here.get_parent().ok_or(BuilderError::UnsetPosition)?;
        let context = f.get_type().get_context();
        let gt = builder.build_float_compare(FloatPredicate::OGT, a, b, "gt")?;
        let mask = gt.as_basic_value_enum();
        let reduce = |name: &str| -> Emit<IntValue<'ctx>> {
            if let BasicValueEnum::IntValue(one) = mask {
                // (One lane: its own answer.)
                return Ok(one);
            }
            let intrinsic = self.intrinsic(name, mask.get_type())?;
            let call = builder.build_call(intrinsic, &[mask.into()], name)?;
            call.try_as_basic_value()
                .basic()
                .map(|v| v.into_int_value())
                .ok_or(BuilderError::UnsetPosition)
        };
        let (all, any) = (
            reduce("llvm.vector.reduce.and")?,
            reduce("llvm.vector.reduce.or")?,
        );
        let [then_only, not_all, otherwise_only, both, join] =
            ["then_only", "not_all", "otherwise_only", "both", "join"]
                .map(|name| context.append_basic_block(f, name));
        builder.build_conditional_branch(all, then_only, not_all)?;
        builder.position_at_end(not_all);
        builder.build_conditional_branch(any, both, otherwise_only)?;
        let mut incoming = Vec::with_capacity(3);
        for (block, case) in [(then_only, 0), (otherwise_only, 1), (both, 2)] {
            builder.position_at_end(block);
            let v = match case {
                0 => then(self),
                1 => otherwise(self),
                _ => {
                    let (t, o) = (then(self), otherwise(self));
                    V::from_basic(builder.build_select(V::int_from_basic(mask), t, o, "")?)
                }
            };
            let end = builder
                .get_insert_block()
                .ok_or(BuilderError::UnsetPosition)?;
            builder.build_unconditional_branch(join)?;
            incoming.push((v, end));
        }
        builder.position_at_end(join);
        let phi = builder.build_phi(a.as_basic_value_enum().get_type(), "branch")?;
        for (v, end) in &incoming {
            phi.add_incoming(&[(&v.as_basic_value_enum(), *end)]);
        }
        Ok(V::from_basic(phi.as_basic_value()))
    }

    /// LLVM's intrinsic `name` for operands of type `ty`, declared in the module.
    fn intrinsic(&self, name: &str, ty: BasicTypeEnum<'ctx>) -> Emit<FunctionValue<'ctx>> {
        Intrinsic::find(name)
            .and_then(|i| i.get_declaration(self.module, &[ty]))
            .ok_or(BuilderError::UnsetPosition)
    }

    /// [`Arith::log_split`] in integer operations on the bits, lane by lane. The integers
    /// `k` and `i` become `f64`s as `pow2` reads them: `from_bits(bits(1.5 * 2^52) + n) -
    /// 1.5 * 2^52` is `n` exactly for `|n| < 2^51`.
    fn emit_log_split(&mut self, x: V) -> Emit<[V; 3]> {
        let (b, ty) = (self.builder, self.ty);
        let float_ty = x.as_basic_value_enum().get_type();
        let int = |c: u64| V::int_splat(ty, c);
        let bits = V::int_from_basic(b.build_bit_cast(x, V::int_ty(ty), "")?);
        let t = b.build_int_sub(bits, int(LOG_OFFSET), "")?;
        let k = b.build_right_shift(t, int(52), true, "")?;
        let i = b.build_right_shift(t, int(45), false, "")?;
        let i = b.build_and(i, int(127), "")?;
        let top = b.build_and(t, int(0xfff << 52), "")?;
        let z = b.build_int_sub(bits, top, "")?;
        let z = V::from_basic(b.build_bit_cast(z, float_ty, "")?);
        let as_float = |n: V::Int| -> Emit<V> {
            let biased = b.build_int_add(n, int(ROUNDER.to_bits()), "")?;
            let f = V::from_basic(b.build_bit_cast(biased, float_ty, "")?);
            b.build_float_sub(f, V::splat(ty, ROUNDER), "")
        };
        Ok([as_float(k)?, z, as_float(i)?])
    }

    /// [`Arith::lookup`]: the table a private constant of the module, each lane's entry
    /// loaded (the index read back from `i + 1.5 * 2^52`'s low bits).
    fn emit_lookup(&mut self, table: &'static Table, i: V) -> Emit<V> {
        let (b, ty) = (self.builder, self.ty);
        let context = self.module.get_context();
        let f64t = context.f64_type();
        let global = match self.module.get_global(table.name) {
            Some(made) => made,
            None => {
                let values: Vec<_> = (0..128).map(|i| f64t.const_float(table.value(i))).collect();
                let init = f64t.const_array(&values);
                let g = self.module.add_global(init.get_type(), None, table.name);
                g.set_initializer(&init);
                g.set_constant(true);
                g.set_linkage(Linkage::Private);
                g.set_unnamed_addr(true);
                g
            }
        };
        let biased = b.build_float_add(i, V::splat(ty, ROUNDER), "")?;
        let index = V::int_from_basic(b.build_bit_cast(biased, V::int_ty(ty), "")?);
        let index = b.build_and(index, V::int_splat(ty, 127), "")?;
        let load = |at: IntValue<'ctx>| -> Emit<FloatValue<'ctx>> {
            // SAFETY: (of the GEP, not of Rust code) `at` is masked to 0..128, the table's
            // length.
            let ptr = unsafe { b.build_in_bounds_gep(f64t, global.as_pointer_value(), &[at], "")? };
            Ok(b.build_load(f64t, ptr, "")?.into_float_value())
        };
        match index.as_basic_value_enum() {
            BasicValueEnum::IntValue(at) => Ok(V::from_basic(load(at)?.into())),
            BasicValueEnum::VectorValue(lanes) => {
                let i32t = context.i32_type();
                let mut out = V::undef(ty).as_basic_value_enum().into_vector_value();
                for lane in 0..lanes.get_type().get_size() {
                    let k = i32t.const_int(lane as u64, false);
                    let at = b.build_extract_element(lanes, k, "")?.into_int_value();
                    out = b.build_insert_element(out, load(at)?, k, "")?;
                }
                Ok(V::from_basic(out.into()))
            }
            _ => unreachable!("an index is an integer or a vector of them"),
        }
    }

    fn emit(&mut self, r: Emit<V>) -> V {
        if let (Ok(v), Some(flags)) = (&r, self.flags) {
            if let Some(inst) = v.as_instruction_value() {
                // Arithmetic instructions always take fast-math flags.
                let _ = inst.set_fast_math_flags(flags);
            }
        }
        r.unwrap_or_else(|e| {
            self.error.get_or_insert(e);
            V::undef(self.ty)
        })
    }
}

impl<'ctx, V: ScalarOrVector<'ctx>> Arith for IrArith<'_, 'ctx, V> {
    type V = V;
    fn constant(&mut self, c: f64) -> V {
        V::splat(self.ty, c)
    }
    fn add(&mut self, a: V, b: V) -> V {
        let r = self.builder.build_float_add(a, b, "");
        self.emit(r)
    }
    fn sub(&mut self, a: V, b: V) -> V {
        let r = self.builder.build_float_sub(a, b, "");
        self.emit(r)
    }
    fn mul(&mut self, a: V, b: V) -> V {
        let r = self.builder.build_float_mul(a, b, "");
        self.emit(r)
    }
    fn div(&mut self, a: V, b: V) -> V {
        let r = self.builder.build_float_div(a, b, "");
        self.emit(r)
    }
    fn neg(&mut self, a: V) -> V {
        let r = self.builder.build_float_neg(a, "");
        self.emit(r)
    }
    fn call(&mut self, f: MathFn, args: &[V]) -> V {
        if self.inline {
            // Exactly the compiled function's operations: no fast-math flags.
            let flags = self.flags.take();
            let inline = f.formula(self, args);
            self.flags = flags;
            if let Some(v) = inline {
                return v;
            }
        }
        if let Some(name) = f.intrinsic() {
            // One instruction on every lane at once.
            let ty = args[0].as_basic_value_enum().get_type();
            let r = self
                .intrinsic(name, ty)
                .and_then(|declared| {
                    let args: Vec<_> = args
                        .iter()
                        .map(|v| v.as_basic_value_enum().into())
                        .collect();
                    self.builder.build_call(declared, &args, "")
                })
                .map(|call| {
                    call.try_as_basic_value()
                        .basic()
                        .map_or_else(|| V::undef(self.ty), V::from_basic)
                });
            return self.emit(r);
        }
        // The emitter declares every other `MathFn` before emitting any code.
        let r = match self.math.get(&f) {
            Some(&declared) => V::call(self.builder, self.ty, declared, args),
            None => Err(BuilderError::UnsetPosition),
        };
        self.emit(r)
    }
    fn branch_gt_with(
        &mut self,
        a: V,
        b: V,
        then: impl Fn(&mut Self) -> V,
        otherwise: impl Fn(&mut Self) -> V,
    ) -> V {
        if !self.inline {
            return self.select_gt_with(a, b, then, otherwise);
        }
        let r = self.branch_on_lanes(a, b, &then, &otherwise);
        self.emit(r)
    }
    fn select_gt(&mut self, a: V, b: V, then: V, otherwise: V) -> V {
        let r = self
            .builder
            .build_float_compare(FloatPredicate::OGT, a, b, "")
            .and_then(|c| self.builder.build_select(c, then, otherwise, ""))
            .map(V::from_basic);
        self.emit(r)
    }
    fn mul_add(&mut self, a: V, b: V, c: V) -> V {
        // `llvm.fma`: one rounding, as `f64::mul_add` (an instruction where the CPU has
        // one, else the C library's `fma`, exact either way).
        let ty = a.as_basic_value_enum().get_type();
        let r = self
            .intrinsic("llvm.fma", ty)
            .and_then(|fma| {
                let args = [a, b, c].map(|v| v.as_basic_value_enum().into());
                self.builder.build_call(fma, &args, "")
            })
            .map(|call| {
                call.try_as_basic_value()
                    .basic()
                    .map_or_else(|| V::undef(self.ty), V::from_basic)
            });
        self.emit(r)
    }
    fn pow2(&mut self, k: V) -> V {
        // Integer and bit operations: no fast-math flags to set.
        let b = self.builder;
        let float_ty = k.as_basic_value_enum().get_type();
        let r = b
            .build_float_add(k, V::splat(self.ty, ROUNDER), "")
            .and_then(|sum| b.build_bit_cast(sum, V::int_ty(self.ty), ""))
            .and_then(|bits| {
                let bits = V::int_from_basic(bits);
                b.build_int_add(bits, V::int_splat(self.ty, 1023), "")
            })
            .and_then(|biased| b.build_left_shift(biased, V::int_splat(self.ty, 52), ""))
            .and_then(|exponent| b.build_bit_cast(exponent, float_ty, ""))
            .map(V::from_basic);
        r.unwrap_or_else(|e| {
            self.error.get_or_insert(e);
            V::undef(self.ty)
        })
    }
    fn log_split(&mut self, x: V) -> [V; 3] {
        let r = self.emit_log_split(x);
        r.unwrap_or_else(|e| {
            self.error.get_or_insert(e);
            [V::undef(self.ty); 3]
        })
    }
    fn lookup(&mut self, table: &'static Table, i: V) -> V {
        let r = self.emit_lookup(table, i);
        r.unwrap_or_else(|e| {
            self.error.get_or_insert(e);
            V::undef(self.ty)
        })
    }
}
