//! Repetitions of nests, and how a loop item reads and writes its slots for them: one
//! repetition at a time as scalars, or several side by side in vector lanes.
//!
//! A layer's neurons are independent: neuron `j` computes exactly what it would alone, so
//! several neurons can share one vector instruction, lane `j` doing neuron `j`'s operation.
//! Every lane performs the interpreter's operations in the interpreter's order; only
//! *different* repetitions' operations interleave, where the plan proved that harmless
//! ([`Lanes`](crate::plan::Lanes)). A repetition run alone is the width-1 case: the
//! item emitters (`items.rs`) are written once, generic over [`LaneIo`], for both.

use inkwell::basic_block::BasicBlock;
use inkwell::types::{BasicTypeEnum, FloatType, VectorType};
use inkwell::values::{
    BasicValue, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue, VectorValue,
};

use super::known::Place;
use super::{Emit, Emitter, Frame};
use crate::passes::schedule::{Affine, MapLoop};
use crate::plan::lanes::VECTOR_WIDTH;
use crate::plan::memory::Addition;

/// The lanes of one vector: repetitions `first + offset ..` `first + offset + width` of the
/// innermost nest, `first` its [`Reps`]' last repetition index.
#[derive(Clone, Copy)]
pub(super) struct Vector {
    pub(super) offset: u32,
    pub(super) width: u32,
}

/// The repetitions an item runs for: the repetition of every enclosing nest, outermost
/// first (for the innermost, the first of a lane group), and the vectors of lanes.
#[derive(Clone)]
pub(super) struct Reps<'ctx> {
    pub(super) js: Vec<IntValue<'ctx>>,
    /// Per level of `js`: how many repetitions its nest has.
    pub(super) counts: Vec<u32>,
    pub(super) vectors: Vec<Vector>,
    /// The lanes' backward runs in the vertical order ([`crate::plan::Lanes`]).
    pub(super) vertical: bool,
    /// The map being emitted adds into its operands from the last in backward
    /// ([`crate::plan::NestPlan::operands_from_last`]).
    pub(super) operands_from_last: bool,
}

impl<'ctx> Reps<'ctx> {
    /// Outside any nest: the one repetition, as a scalar.
    pub(super) fn top() -> Self {
        Reps {
            js: Vec::new(),
            counts: Vec::new(),
            vectors: vec![Vector {
                offset: 0,
                width: 1,
            }],
            vertical: false,
            operands_from_last: false,
        }
    }

    /// Repetition `j` of a nest of `count` inside these repetitions, as a scalar.
    pub(super) fn scalar_in(&self, j: IntValue<'ctx>, count: u32) -> Self {
        self.group_in(j, count, 1)
    }

    /// `size` repetitions from `first` of a nest of `count` inside these repetitions, in
    /// vectors of up to [`VECTOR_WIDTH`] lanes.
    pub(super) fn group_in(&self, first: IntValue<'ctx>, count: u32, size: u32) -> Self {
        let vectors = (0..size.div_ceil(VECTOR_WIDTH))
            .map(|v| Vector {
                offset: v * VECTOR_WIDTH,
                width: VECTOR_WIDTH.min(size - v * VECTOR_WIDTH),
            })
            .collect();
        Reps {
            js: self.js.iter().copied().chain([first]).collect(),
            counts: self.counts.iter().copied().chain([count]).collect(),
            vectors,
            vertical: false,
            operands_from_last: false,
        }
    }

    /// The level of the nest whose repetitions run in lanes, in an `Affine`'s `outer`.
    pub(super) fn lane_level(&self) -> usize {
        self.js.len().saturating_sub(1)
    }
}

/// A value of one repetition (`f64`) or of a vector of lanes (`<w x double>`), and how it
/// moves between registers and the buffers.
pub(super) trait LaneIo<'ctx>: super::ScalarOrVector<'ctx> {
    /// Whether a value is a vector of lanes (else one repetition's scalar).
    const IS_VECTOR: bool;

    /// The type of a value of `lanes`.
    fn ty(e: &Emitter<'ctx, '_>, lanes: Vector) -> Self::Ty;

    /// `buf[a(t, j)]` for the vector's repetitions `j`.
    fn load(
        e: &Emitter<'ctx, '_>,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
    ) -> Emit<Self>;

    /// `x` in every lane.
    fn shared(e: &Emitter<'ctx, '_>, x: FloatValue<'ctx>, lanes: Vector) -> Emit<Self>;

    /// `buf[a(t, j)] = v[lane]` for the vector's repetitions `j`.
    fn store(
        e: &Emitter<'ctx, '_>,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
        v: Self,
    ) -> Emit<()>;

    /// Adds `map`'s local gradients (`locals[vector][operand]`) into its two operands in
    /// registers where they are neighbours one lane apart
    /// ([`Emitter::accumulate_neighbours`]); whether it did (never one repetition alone).
    fn accumulate_neighbours(
        _: &Emitter<'ctx, '_>,
        _: Frame<'ctx>,
        _: &MapLoop,
        _: IntValue<'ctx>,
        _: &Reps<'ctx>,
        _: &[Vec<Self>],
    ) -> Emit<bool> {
        Ok(false)
    }

    /// `map`'s two operands for `lanes`, where they lie one lane apart
    /// ([`Emitter::load_neighbours`]; never one repetition alone).
    fn load_neighbours(
        _: &Emitter<'ctx, '_>,
        _: Frame<'ctx>,
        _: &MapLoop,
        _: IntValue<'ctx>,
        _: &Reps<'ctx>,
        _: Vector,
    ) -> Emit<Option<Vec<Self>>> {
        Ok(None)
    }

    /// `grads[a(t, j)] += d[lane]` for the vector's repetitions `j`, `a` the operand that
    /// `additions` add into (stored, `0 + d`, where the plan says they are its slots' first);
    /// in `step`, a fused param's gradient stored and applied instead.
    fn accumulate(
        e: &Emitter<'ctx, '_>,
        frame: Frame<'ctx>,
        additions: Addition,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
        d: Self,
    ) -> Emit<()>;
}

impl<'ctx> LaneIo<'ctx> for FloatValue<'ctx> {
    const IS_VECTOR: bool = false;

    fn ty(e: &Emitter<'ctx, '_>, _: Vector) -> FloatType<'ctx> {
        e.f64_type()
    }

    fn load(
        e: &Emitter<'ctx, '_>,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        _: Vector,
    ) -> Emit<Self> {
        e.load_at(buf, a, t, &reps.js)
    }

    fn shared(_: &Emitter<'ctx, '_>, x: FloatValue<'ctx>, _: Vector) -> Emit<Self> {
        Ok(x)
    }

    fn store(
        e: &Emitter<'ctx, '_>,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
        v: Self,
    ) -> Emit<()> {
        e.write(Place::new(buf, a, t, reps, lanes), None, || {
            let ptr = e.ptr_at(buf, a, t, &reps.js)?;
            e.builder.build_store(ptr, v)?;
            Ok(())
        })
    }

    fn accumulate(
        e: &Emitter<'ctx, '_>,
        frame: Frame<'ctx>,
        additions: Addition,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
        d: Self,
    ) -> Emit<()> {
        let a = additions.operand();
        if e.add_local_grad(frame, a, lanes, d)? {
            return Ok(());
        }
        e.write(Place::new(frame.grads, a, t, reps, lanes), None, || {
            let ptr = e.ptr_at(frame.grads, a, t, &reps.js)?;
            if e.plan.grads.stores_whole(additions) {
                // Its first addition: what the zeroed buffer would hold after it.
                let whole = e.fresh(&[d])?[0];
                e.builder.build_store(ptr, whole)?;
                return Ok(());
            }
            let before = e
                .builder
                .build_load(e.f64_type(), ptr, "")?
                .into_float_value();
            let after = e.builder.build_float_add(before, d, "")?;
            e.builder.build_store(ptr, after)?;
            Ok(())
        })
    }
}

/// A vector's lanes in a buffer: the first lane's address, `across` slots between lanes.
#[derive(Clone, Copy)]
struct LanesAt<'ctx> {
    first: PointerValue<'ctx>,
    across: i64,
    width: u32,
}

impl<'ctx> LaneIo<'ctx> for VectorValue<'ctx> {
    const IS_VECTOR: bool = true;

    fn accumulate_neighbours(
        e: &Emitter<'ctx, '_>,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        locals: &[Vec<Self>],
    ) -> Emit<bool> {
        e.accumulate_neighbours(frame, map, t, reps, locals)
    }

    fn load_neighbours(
        e: &Emitter<'ctx, '_>,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
    ) -> Emit<Option<Vec<Self>>> {
        e.load_neighbours(frame, map, t, reps, lanes)
    }

    fn ty(e: &Emitter<'ctx, '_>, lanes: Vector) -> VectorType<'ctx> {
        e.f64_type().vec_type(lanes.width)
    }

    fn shared(e: &Emitter<'ctx, '_>, x: FloatValue<'ctx>, lanes: Vector) -> Emit<Self> {
        e.splat(x, lanes.width)
    }

    /// One vector load when the repetitions are adjacent, a broadcast when they share the
    /// slot, a gather otherwise.
    fn load(
        e: &Emitter<'ctx, '_>,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
    ) -> Emit<Self> {
        let ty = Self::ty(e, lanes);
        match e.across(a, reps) {
            1 => {
                let ptr = e.ptr_at(buf, a, t, &e.lane_js(reps, lanes)?)?;
                e.load_vector(ptr, ty)
            }
            0 => {
                let x = e.load_at(buf, a, t, &reps.js)?;
                e.splat(x, lanes.width)
            }
            _ => {
                let place = Place::new(buf, a, t, reps, lanes);
                let block = e.block();
                if let Some(known) = e.known.get(block, &place) {
                    return Ok(known);
                }
                let v = e.gather(e.lanes_at(buf, a, t, reps, lanes)?)?;
                e.known.read(block, place, v);
                Ok(v)
            }
        }
    }

    fn store(
        e: &Emitter<'ctx, '_>,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
        v: Self,
    ) -> Emit<()> {
        let place = Place::new(buf, a, t, reps, lanes);
        if e.across(a, reps) == 1 {
            return e.write(place, None, || {
                let ptr = e.ptr_at(buf, a, t, &e.lane_js(reps, lanes)?)?;
                e.store_vector(ptr, v)
            });
        }
        e.write(place, Some(v), || {
            e.scatter(v, e.lanes_at(buf, a, t, reps, lanes)?)
        })
    }

    /// One vector update when the repetitions' slots are adjacent; otherwise lane by lane
    /// from the last, so a slot the lanes share receives them in the interpreter's order
    /// (repetitions from the last).
    fn accumulate(
        e: &Emitter<'ctx, '_>,
        frame: Frame<'ctx>,
        additions: Addition,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
        d: Self,
    ) -> Emit<()> {
        let a = additions.operand();
        if e.add_local_grad(frame, a, lanes, d)? {
            return Ok(());
        }
        let across = e.across(a, reps);
        if across == 1 && e.fuses_update(frame, a) {
            return e.fused_update(frame, a, t, (reps, lanes), d);
        }
        if across != 0 && e.plan.grads.stores_whole(additions) {
            // Each lane's first addition: what the zeroed buffer would hold after it.
            let whole = e.fresh(&[d])?[0];
            return Self::store(e, frame.grads, a, t, reps, lanes, whole);
        }
        if across != 0 {
            // Each lane its own slot.
            let before = Self::load(e, frame.grads, a, t, reps, lanes)?;
            let after = e.builder.build_float_add(before, d, "")?;
            return Self::store(e, frame.grads, a, t, reps, lanes, after);
        }
        // One slot for every lane: its running sum stays in a register, lanes from the last.
        e.write(Place::new(frame.grads, a, t, reps, lanes), None, || {
            let i32t = e.context.i32_type();
            let ptr = e.ptr_at(frame.grads, a, t, &reps.js)?;
            let mut sum = e
                .builder
                .build_load(e.f64_type(), ptr, "")?
                .into_float_value();
            for lane in (0..lanes.width).rev() {
                let x = e
                    .builder
                    .build_extract_element(d, i32t.const_int(lane as u64, false), "")?
                    .into_float_value();
                sum = e.builder.build_float_add(sum, x, "")?;
            }
            e.builder.build_store(ptr, sum)?;
            Ok(())
        })
    }
}

impl<'ctx> Emitter<'ctx, '_> {
    /// The block being emitted.
    pub(super) fn block(&self) -> BasicBlock<'ctx> {
        self.builder
            .get_insert_block()
            .expect("positioned in a function")
    }

    /// Loop code writes `place`, as `emit` emits: every buffer write of loop code goes
    /// through here, so the lanes known in registers ([`Known`](super::known::Known)) learn
    /// what the slots hold now (`now`, if given; else nothing).
    pub(super) fn write<T>(
        &self,
        place: Place<'ctx>,
        now: Option<VectorValue<'ctx>>,
        emit: impl FnOnce() -> Emit<T>,
    ) -> Emit<T> {
        self.known.will_write(self.block(), place, now);
        let done = emit()?;
        self.known.written(self.block());
        Ok(done)
    }

    /// How many addresses apart the lanes of `reps` find `a`'s slots (1: one vector; 0: one
    /// slot for every lane).
    pub(super) fn across(&self, a: Affine, reps: &Reps<'ctx>) -> i64 {
        self.plan.buffers.affine(a).outer[reps.lane_level()]
    }

    /// `&buf[a.base + a.stride * t + a.outer[0] * js[0] + a.outer[1] * js[1] + ...]`
    /// (`js` outermost first), slots at their addresses ([`crate::plan::Buffers`]).
    pub(super) fn ptr_at(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        js: &[IntValue<'ctx>],
    ) -> Emit<PointerValue<'ctx>> {
        self.address_ptr(buf, self.plan.buffers.affine(a), t, js)
    }

    /// [`Emitter::ptr_at`] of an affine sequence of addresses, not slots: where code walks
    /// addresses (a sample in `train`'s argument, which slots do not map into; the params
    /// with the gaps among them).
    pub(super) fn address_ptr(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        js: &[IntValue<'ctx>],
    ) -> Emit<PointerValue<'ctx>> {
        let i64t = self.context.i64_type();
        let mut index = i64t.const_int(a.base as u64, true);
        let terms =
            std::iter::once((a.stride, t)).chain(a.outer.iter().copied().zip(js.iter().copied()));
        for (coefficient, i) in terms.filter(|&(c, _)| c != 0) {
            let c = i64t.const_int(coefficient as u64, true);
            let term = self.builder.build_int_mul(i, c, "")?;
            index = self.builder.build_int_add(index, term, "slot")?;
        }
        self.element_ptr(buf, index)
    }

    pub(super) fn load_at(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        js: &[IntValue<'ctx>],
    ) -> Emit<FloatValue<'ctx>> {
        let ptr = self.ptr_at(buf, a, t, js)?;
        Ok(self
            .builder
            .build_load(self.f64_type(), ptr, "")?
            .into_float_value())
    }

    /// The vector of `ty` at `ptr` (aligned as its `f64`s are).
    pub(super) fn load_vector(
        &self,
        ptr: PointerValue<'ctx>,
        ty: VectorType<'ctx>,
    ) -> Emit<VectorValue<'ctx>> {
        let v = self.builder.build_load(ty, ptr, "")?;
        if let Some(inst) = v.as_instruction_value() {
            // Loads always take an alignment.
            let _ = inst.set_alignment(8);
        }
        Ok(v.into_vector_value())
    }

    /// Stores `v` at `ptr` (aligned as its `f64`s are).
    pub(super) fn store_vector(&self, ptr: PointerValue<'ctx>, v: VectorValue<'ctx>) -> Emit<()> {
        let _ = self.builder.build_store(ptr, v)?.set_alignment(8);
        Ok(())
    }

    /// The repetitions of a vector's first lane (its offset added at the lanes' level).
    pub(super) fn lane_js(&self, reps: &Reps<'ctx>, lanes: Vector) -> Emit<Vec<IntValue<'ctx>>> {
        let mut js = reps.js.clone();
        if lanes.offset > 0 {
            let k = self
                .context
                .i64_type()
                .const_int(lanes.offset as u64, false);
            let level = reps.lane_level();
            js[level] = self.builder.build_int_add(js[level], k, "j")?;
        }
        Ok(js)
    }

    /// `x` in every lane of a vector of `width`.
    pub(super) fn splat(&self, x: FloatValue<'ctx>, width: u32) -> Emit<VectorValue<'ctx>> {
        self.broadcast(x.into(), self.f64_type().vec_type(width))
    }

    /// `x` in every lane of a vector of type `ty`: LLVM's idiom, one insert into lane 0 and a
    /// shuffle (an insert per lane is as many instructions for every pass to look at).
    pub(super) fn broadcast(
        &self,
        x: BasicValueEnum<'ctx>,
        ty: VectorType<'ctx>,
    ) -> Emit<VectorValue<'ctx>> {
        let i32t = self.context.i32_type();
        let first = self
            .builder
            .build_insert_element(ty.get_undef(), x, i32t.const_zero(), "")?;
        let lane0 = i32t.vec_type(ty.get_size()).const_zero();
        self.builder
            .build_shuffle_vector(first, ty.get_undef(), lane0, "splat")
    }

    /// Where the vector's lanes are: `&buf[a(t, j)]` for its first repetition `j`, and how
    /// many slots apart the lanes' slots lie.
    fn lanes_at(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
    ) -> Emit<LanesAt<'ctx>> {
        Ok(LanesAt {
            first: self.ptr_at(buf, a, t, &self.lane_js(reps, lanes)?)?,
            across: self.across(a, reps),
            width: lanes.width,
        })
    }

    /// Each lane's address.
    fn lane_ptrs(&self, at: LanesAt<'ctx>) -> Emit<Vec<PointerValue<'ctx>>> {
        let i64t = self.context.i64_type();
        (0..at.width as i64)
            .map(|l| self.element_ptr(at.first, i64t.const_int((l * at.across) as u64, true)))
            .collect()
    }

    /// The lanes' addresses as one vector of pointers, for a masked gather or scatter.
    fn lane_ptr_vector(&self, at: LanesAt<'ctx>) -> Emit<VectorValue<'ctx>> {
        let i64t = self.context.i64_type();
        let first = self.builder.build_ptr_to_int(at.first, i64t, "")?;
        let addrs = self.broadcast(first.into(), i64t.vec_type(at.width))?;
        let bytes: Vec<_> = (0..at.width as i64)
            .map(|l| i64t.const_int((l * at.across * 8) as u64, true))
            .collect();
        let addrs = self
            .builder
            .build_int_add(addrs, VectorType::const_vector(&bytes), "")?;
        let ptrs = self.context.ptr_type(Default::default()).vec_type(at.width);
        self.builder.build_int_to_ptr(addrs, ptrs, "lanes")
    }

    /// The lanes `at`: one load each in a module of loop code (LLVM then sees every load,
    /// and forwards earlier stores to them), else `llvm.masked.gather`.
    fn gather(&self, at: LanesAt<'ctx>) -> Emit<VectorValue<'ctx>> {
        let ty = self.f64_type().vec_type(at.width);
        if self.style.scalar_lanes {
            let i32t = self.context.i32_type();
            let mut v = ty.get_undef();
            for (lane, ptr) in self.lane_ptrs(at)?.into_iter().enumerate() {
                let x = self.builder.build_load(self.f64_type(), ptr, "")?;
                let lane = i32t.const_int(lane as u64, false);
                v = self.builder.build_insert_element(v, x, lane, "")?;
            }
            return Ok(v);
        }
        let ptrs = self.lane_ptr_vector(at)?;
        let f = self.intrinsic("llvm.masked.gather", &[ty.into(), ptrs.get_type().into()])?;
        let args = [
            ptrs.into(),
            self.context.i32_type().const_int(8, false).into(),
            self.all_lanes(ty.get_size()).into(),
            ty.get_undef().into(),
        ];
        let call = self.builder.build_call(f, &args, "")?;
        Ok(call
            .try_as_basic_value()
            .basic()
            .map_or_else(|| ty.get_undef(), |v| v.into_vector_value()))
    }

    /// `v`'s lanes stored `at`: one store each in a module of loop code, else
    /// `llvm.masked.scatter` (as [`Emitter::gather`]).
    fn scatter(&self, v: VectorValue<'ctx>, at: LanesAt<'ctx>) -> Emit<()> {
        if self.style.scalar_lanes {
            let i32t = self.context.i32_type();
            for (lane, ptr) in self.lane_ptrs(at)?.into_iter().enumerate() {
                let lane = i32t.const_int(lane as u64, false);
                let x = self.builder.build_extract_element(v, lane, "")?;
                self.builder.build_store(ptr, x)?;
            }
            return Ok(());
        }
        let ty = v.get_type();
        let ptrs = self.lane_ptr_vector(at)?;
        let f = self.intrinsic("llvm.masked.scatter", &[ty.into(), ptrs.get_type().into()])?;
        let args = [
            v.into(),
            ptrs.into(),
            self.context.i32_type().const_int(8, false).into(),
            self.all_lanes(ty.get_size()).into(),
        ];
        self.builder.build_call(f, &args, "")?;
        Ok(())
    }

    /// The declaration of LLVM intrinsic `name` over `types` (masked gather and scatter,
    /// reductions, prefetch).
    pub(super) fn intrinsic(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
    ) -> Emit<FunctionValue<'ctx>> {
        // LLVM 19 has every one we use; a missing one is reported, not a panic.
        inkwell::intrinsics::Intrinsic::find(name)
            .and_then(|i| i.get_declaration(&self.module, types))
            .ok_or(inkwell::builder::BuilderError::UnsetPosition)
    }

    /// A mask with every lane on.
    fn all_lanes(&self, width: u32) -> VectorValue<'ctx> {
        let on = self.context.bool_type().const_int(1, false);
        VectorType::const_vector(&vec![on; width as usize])
    }
}
