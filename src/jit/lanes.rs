//! Lowering of a [`Nest`] whose repetitions run side by side, one per vector lane.
//!
//! A layer's neurons are independent: neuron `j` computes exactly what it would alone, so
//! `WIDTH` neurons can share one vector instruction, lane `j` doing neuron `j`'s operation.
//! Every lane performs the interpreter's operations in the interpreter's order; only
//! *different* neurons' operations are interleaved, which the pass has proved harmless
//! ([`Nest::independent`] for forward, [`Nest::lanes`] for backward). After the param layout
//! pass, a layer's weights for one input are adjacent, so lanes load them with one vector load.
//!
//! Repetitions run in groups of [`lane_group`] (up to 64), a group as vectors of up to [`WIDTH`] lanes,
//! so a dot product keeps eight independent vector accumulators in flight.

use inkwell::types::VectorType;
use inkwell::values::{BasicValue, IntValue, PointerValue, VectorValue};

use super::ir_arith::IrArith;
use super::lower::{Emit, Lowerer};
use crate::op::Arith;
use crate::passes::lanes::lane_group;
use crate::passes::loops::{Affine, DotLoop, Item, MapLoop, Nest, SumLoop};

/// Lanes per vector: eight doubles, one AVX-512 register (LLVM splits it where vectors are
/// narrower).
const WIDTH: u32 = 8;

/// The lanes of one vector of a group: repetitions `first + offset ..` `first + offset +
/// width`.
#[derive(Clone, Copy)]
struct Vector {
    offset: u32,
    width: u32,
}

/// A group of repetitions starting at `first`, as vectors.
struct Group<'ctx> {
    first: IntValue<'ctx>,
    vectors: Vec<Vector>,
}

impl<'ctx> Group<'ctx> {
    fn new(first: IntValue<'ctx>, count: u32) -> Self {
        let vectors = (0..count.div_ceil(WIDTH))
            .map(|v| Vector {
                offset: v * WIDTH,
                width: WIDTH.min(count - v * WIDTH),
            })
            .collect();
        Group { first, vectors }
    }
}

impl<'ctx> Lowerer<'ctx, '_> {
    /// Forward of an independent nest: group by group, each body item for the whole group.
    pub(super) fn emit_nest_forward_lanes(
        &self,
        vals: PointerValue<'ctx>,
        nest: &Nest,
    ) -> Emit<()> {
        self.for_each_group(nest.count, false, |this, group| {
            for item in &nest.body {
                match item {
                    Item::Map(map) => this.emit_map_forward_lanes(vals, map, group)?,
                    Item::Sum(sum) => this.emit_sum_forward_lanes(vals, sum, None, group)?,
                    // `train` computed this dot while updating its weights.
                    Item::Dot(dot) if self.merges(dot) => {}
                    Item::Dot(dot) => {
                        this.emit_sum_forward_lanes(vals, &dot.sum, Some(&dot.products), group)?
                    }
                    Item::Straight(_) | Item::Nest(_) => {}
                }
            }
            Ok(())
        })
    }

    /// Backward of a nest with [`Nest::lanes`]: groups from the last, body items from the
    /// last, each for the whole group.
    pub(super) fn emit_nest_backward_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        nest: &Nest,
    ) -> Emit<()> {
        self.for_each_group(nest.count, true, |this, group| {
            for item in nest.body.iter().rev() {
                match item {
                    Item::Map(map) => this.emit_map_backward_lanes(vals, grads, map, group)?,
                    Item::Sum(sum) => this.emit_sum_backward_lanes(vals, grads, sum, group)?,
                    Item::Dot(dot) => this.emit_dot_backward_lanes(vals, grads, dot, group)?,
                    Item::Straight(_) | Item::Nest(_) => {}
                }
            }
            Ok(())
        })
    }

    /// Runs `body` on every group of [`lane_group`] repetitions (a loop over the full
    /// groups, and the rest), in increasing or decreasing order.
    fn for_each_group(
        &self,
        count: u32,
        descending: bool,
        mut body: impl FnMut(&Self, &Group<'ctx>) -> Emit<()>,
    ) -> Emit<()> {
        let i64t = self.context.i64_type();
        let size = lane_group(count);
        let (full, rest) = (count / size, count % size);
        let rest_group = Group::new(i64t.const_int((full * size) as u64, false), rest);
        if rest > 0 && descending {
            body(self, &rest_group)?;
        }
        if full == 1 {
            body(self, &Group::new(i64t.const_zero(), size))?;
        } else if full > 1 {
            self.emit_loop(full, descending, &[], |this, g, _| {
                let stride = i64t.const_int(size as u64, false);
                let first = this.builder.build_int_mul(g, stride, "group")?;
                body(this, &Group::new(first, size))?;
                Ok(Vec::new())
            })?;
        }
        if rest > 0 && !descending {
            body(self, &rest_group)?;
        }
        Ok(())
    }

    fn emit_map_forward_lanes(
        &self,
        vals: PointerValue<'ctx>,
        map: &MapLoop,
        group: &Group<'ctx>,
    ) -> Emit<()> {
        self.emit_loop(map.len, false, &[], |this, t, _| {
            for &lanes in &group.vectors {
                let x = this.load_args_lanes(vals, map, t, group, lanes)?;
                let mut ar = this.vector_arith(lanes);
                let y = map.op.forward(&mut ar, &x);
                ar.finish()?;
                this.store_lanes(vals, map.out, t, group, lanes, y)?;
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// A sum per lane, left to right; with `products`, a dot product whose terms are the
    /// products of the map (computed here, never stored).
    fn emit_sum_forward_lanes(
        &self,
        vals: PointerValue<'ctx>,
        sum: &SumLoop,
        products: Option<&MapLoop>,
        group: &Group<'ctx>,
    ) -> Emit<()> {
        let zero = self.context.i64_type().const_zero();
        let firsts = group
            .vectors
            .iter()
            .map(|&lanes| self.load_lanes(vals, sum.first, zero, group, lanes))
            .collect::<Emit<Vec<_>>>()?;
        let totals = self.emit_loop_carrying(sum.tail_len, false, &firsts, |this, t, accs| {
            group
                .vectors
                .iter()
                .zip(accs)
                .map(|(&lanes, &acc)| {
                    let term = match products {
                        Some(map) => {
                            let x = this.load_args_lanes(vals, map, t, group, lanes)?;
                            let mut ar = this.vector_arith(lanes);
                            let product = map.op.forward(&mut ar, &x);
                            ar.finish()?;
                            product
                        }
                        None => this.load_lanes(vals, sum.tail, t, group, lanes)?,
                    };
                    this.add_to_sum(acc, term)
                })
                .collect()
        })?;
        for (&lanes, &total) in group.vectors.iter().zip(&totals) {
            self.store_lanes(vals, sum.slot, zero, group, lanes, total)?;
        }
        Ok(())
    }

    fn emit_map_backward_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        map: &MapLoop,
        group: &Group<'ctx>,
    ) -> Emit<()> {
        if !map.needs_grad {
            return Ok(());
        }
        self.emit_loop(map.len, true, &[], |this, t, _| {
            let mut locals = Vec::with_capacity(group.vectors.len());
            for &lanes in &group.vectors {
                let g = this.load_lanes(grads, map.out, t, group, lanes)?;
                let out = this.load_lanes(vals, map.out, t, group, lanes)?;
                let x = this.load_args_lanes(vals, map, t, group, lanes)?;
                let mut ar = this.vector_arith(lanes);
                let mut local = Vec::new();
                map.op.local_grads(&mut ar, &x, out, g, &mut local);
                ar.finish()?;
                locals.push(local);
            }
            this.accumulate_args_lanes(vals, grads, map, t, group, &locals)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// The sum's gradient into `first`, then into the tail left to right.
    fn emit_sum_backward_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        sum: &SumLoop,
        group: &Group<'ctx>,
    ) -> Emit<()> {
        if !sum.needs_grad {
            return Ok(());
        }
        let gs = self.sum_grads_lanes(vals, grads, sum, group)?;
        if sum.grad_tail {
            self.emit_loop(sum.tail_len, false, &[], |this, t, _| {
                for (&lanes, &g) in group.vectors.iter().zip(&gs).rev() {
                    this.accumulate_lanes((vals, grads), sum.tail, t, group, lanes, g)?;
                }
                Ok(Vec::new())
            })?;
        }
        Ok(())
    }

    /// The sum's gradient into `first`, then the products' backward from the last: each
    /// product's gradient is `0 + g` (what its zeroed buffer would hold).
    fn emit_dot_backward_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        dot: &DotLoop,
        group: &Group<'ctx>,
    ) -> Emit<()> {
        let (sum, map) = (&dot.sum, &dot.products);
        if !sum.needs_grad {
            return Ok(());
        }
        if self.merges(dot) {
            return self.emit_dot_backward_merged_lanes(vals, grads, dot, group);
        }
        let gs = self.sum_grads_lanes(vals, grads, sum, group)?;
        let g_products = self.fresh_lanes(&gs)?;
        self.emit_loop(map.len, true, &[], |this, t, _| {
            let locals = group
                .vectors
                .iter()
                .zip(&g_products)
                .map(|(&lanes, &g)| {
                    let x = this.load_args_lanes(vals, map, t, group, lanes)?;
                    this.product_grads_lanes(map, lanes, &x, g)
                })
                .collect::<Emit<Vec<_>>>()?;
            this.accumulate_args_lanes(vals, grads, map, t, group, &locals)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// `train`'s dot: this sample's backward, which updates the weights, and the next
    /// sample's forward, which reads them, in one pass over the weights. The bias (`first`)
    /// is updated first, as in the backward alone; then for `t` from the first (the order of
    /// additions into distinct weights is free, and the next sample's sums must run left to
    /// right) each weight is updated and its product with the next sample's input (read
    /// straight from `train`'s inputs) added to that sample's sums.
    fn emit_dot_backward_merged_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        dot: &DotLoop,
        group: &Group<'ctx>,
    ) -> Emit<()> {
        let (sum, map) = (&dot.sum, &dot.products);
        let next = self
            .next_inputs
            .expect("train's backward takes the next inputs");
        let this_sample = self.sample_inputs.expect("and this sample's");
        // The products' operands: params from `vals`, a sample's inputs from `train`'s
        // argument (`train` does not copy the merged dot's inputs into `vals`).
        let load_x = |this: &Self, inputs, t, lanes| {
            map.args
                .iter()
                .zip(&map.grad_args)
                .map(|(&a, &param)| {
                    if param {
                        return this.load_lanes(vals, a, t, group, lanes);
                    }
                    let input = Affine {
                        base: a.base - this.tape.input_base() as i64,
                        ..a
                    };
                    this.load_lanes(inputs, input, t, group, lanes)
                })
                .collect::<Emit<Vec<_>>>()
        };
        let zero = self.context.i64_type().const_zero();
        let gs = self.sum_grads_lanes(vals, grads, sum, group)?;
        let g_products = self.fresh_lanes(&gs)?;
        let biases = group
            .vectors
            .iter()
            .map(|&lanes| self.load_lanes(vals, sum.first, zero, group, lanes))
            .collect::<Emit<Vec<_>>>()?;
        let sums = self.emit_loop_carrying(map.len, false, &biases, |this, t, accs| {
            let mut locals = Vec::with_capacity(group.vectors.len());
            for (&lanes, &g) in group.vectors.iter().zip(&g_products) {
                let x = load_x(this, this_sample, t, lanes)?;
                locals.push(this.product_grads_lanes(map, lanes, &x, g)?);
            }
            this.accumulate_args_lanes(vals, grads, map, t, group, &locals)?;
            group
                .vectors
                .iter()
                .zip(accs)
                .map(|(&lanes, &acc)| {
                    // The updated params, the next sample's inputs.
                    let x = load_x(this, next, t, lanes)?;
                    let mut ar = this.vector_arith(lanes);
                    let product = map.op.forward(&mut ar, &x);
                    ar.finish()?;
                    this.add_to_sum(acc, product)
                })
                .collect()
        })?;
        for (&lanes, &total) in group.vectors.iter().zip(&sums) {
            self.store_lanes(vals, sum.slot, zero, group, lanes, total)?;
        }
        Ok(())
    }

    /// `0 + g` per vector: what a gradient buffer zeroed by backward holds after receiving
    /// `g` once (it turns a -0 into +0, as the interpreter's buffer does).
    pub(super) fn fresh_lanes(&self, gs: &[VectorValue<'ctx>]) -> Emit<Vec<VectorValue<'ctx>>> {
        gs.iter()
            .map(|&g| {
                let mut ar = IrArith::<VectorValue>::new(&self.builder, g.get_type(), &self.libm)
                    .with_fast_math(self.loop_fast_math());
                let fresh = ar.constant(0.0);
                let sum = ar.add(fresh, g);
                ar.finish()?;
                Ok(sum)
            })
            .collect()
    }

    /// The local gradients of one vector of products with operands `x`, given their
    /// gradient `g`, in operand order.
    fn product_grads_lanes(
        &self,
        map: &MapLoop,
        lanes: Vector,
        x: &[VectorValue<'ctx>],
        g: VectorValue<'ctx>,
    ) -> Emit<Vec<VectorValue<'ctx>>> {
        let mut ar = self.vector_arith(lanes);
        let product = map.op.forward(&mut ar, x);
        let mut local = Vec::new();
        map.op.local_grads(&mut ar, x, product, g, &mut local);
        ar.finish()?;
        Ok(local)
    }

    /// Stores the gradients of operand `i` of a dot's products that `step` deferred:
    /// `0 + local_i` with the products' gradient `0 + g_sum`, as the lane backward computes
    /// them. The operand itself may have been updated since; a product's local gradient for
    /// one operand reads only the other (`step.rs` defers nothing else).
    pub(super) fn emit_deferred_grads_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        nest: &Nest,
        dot: &DotLoop,
        i: usize,
    ) -> Emit<()> {
        let (sum, map) = (&dot.sum, &dot.products);
        let zero = self.context.i64_type().const_zero();
        self.for_each_group(nest.count, false, |this, group| {
            let gs = group
                .vectors
                .iter()
                .map(|&lanes| this.load_lanes(grads, sum.slot, zero, group, lanes))
                .collect::<Emit<Vec<_>>>()?;
            let g_products = this.fresh_lanes(&gs)?;
            this.emit_loop(map.len, false, &[], |this, t, _| {
                for (&lanes, &g) in group.vectors.iter().zip(&g_products) {
                    let x = this.load_args_lanes(vals, map, t, group, lanes)?;
                    let local = this.product_grads_lanes(map, lanes, &x, g)?;
                    let g_operand = this.fresh_lanes(&local[i..=i])?[0];
                    this.store_lanes(grads, map.args[i], t, group, lanes, g_operand)?;
                }
                Ok(Vec::new())
            })?;
            Ok(())
        })
    }

    /// Loads a sum's gradient for every vector of the group and adds it into `first`.
    fn sum_grads_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        sum: &SumLoop,
        group: &Group<'ctx>,
    ) -> Emit<Vec<VectorValue<'ctx>>> {
        let zero = self.context.i64_type().const_zero();
        let gs = group
            .vectors
            .iter()
            .map(|&lanes| self.load_lanes(grads, sum.slot, zero, group, lanes))
            .collect::<Emit<Vec<_>>>()?;
        if sum.grad_first {
            for (&lanes, &g) in group.vectors.iter().zip(&gs).rev() {
                self.accumulate_lanes((vals, grads), sum.first, zero, group, lanes, g)?;
            }
        }
        Ok(gs)
    }

    /// Adds each operand's local gradients (`locals[vector][operand]`), operand by operand,
    /// vectors from the last: the order [`Nest::lanes`] was checked for.
    fn accumulate_args_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        group: &Group<'ctx>,
        locals: &[Vec<VectorValue<'ctx>>],
    ) -> Emit<()> {
        for (i, (&a, &takes)) in map.args.iter().zip(&map.grad_args).enumerate() {
            if !takes {
                continue;
            }
            for (&lanes, local) in group.vectors.iter().zip(locals).rev() {
                self.accumulate_lanes((vals, grads), a, t, group, lanes, local[i])?;
            }
        }
        Ok(())
    }

    fn vector_type(&self, lanes: Vector) -> VectorType<'ctx> {
        self.f64_type.vec_type(lanes.width)
    }

    fn vector_arith(&self, lanes: Vector) -> IrArith<'_, 'ctx, VectorValue<'ctx>> {
        IrArith::new(&self.builder, self.vector_type(lanes), &self.libm)
            .with_fast_math(self.loop_fast_math())
    }

    fn load_args_lanes(
        &self,
        vals: PointerValue<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        group: &Group<'ctx>,
        lanes: Vector,
    ) -> Emit<Vec<VectorValue<'ctx>>> {
        map.args
            .iter()
            .map(|&a| self.load_lanes(vals, a, t, group, lanes))
            .collect()
    }

    /// Repetition `first + offset + l` of slot `a(t)` in lane `l`.
    fn lane_index(&self, group: &Group<'ctx>, lanes: Vector, lane: u32) -> Emit<IntValue<'ctx>> {
        let i64t = self.context.i64_type();
        let k = i64t.const_int((lanes.offset + lane) as u64, false);
        self.builder.build_int_add(group.first, k, "j")
    }

    /// `buf[a(t, j)]` for the vector's repetitions `j`: one vector load when they are
    /// adjacent, a broadcast when they share the slot, lane by lane otherwise.
    fn load_lanes(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        group: &Group<'ctx>,
        lanes: Vector,
    ) -> Emit<VectorValue<'ctx>> {
        let ty = self.vector_type(lanes);
        if a.outer == 1 {
            let ptr = self.ptr_at(buf, a, t, self.lane_index(group, lanes, 0)?)?;
            let v = self.builder.build_load(ty, ptr, "")?;
            set_alignment(v, 8);
            return Ok(v.into_vector_value());
        }
        if a.outer != 0 {
            let ptrs = self.lane_ptrs(buf, a, t, group, lanes)?;
            return self.gather(ptrs, ty);
        }
        let x = self.load_at(buf, a, t, group.first)?;
        let i32t = self.context.i32_type();
        let mut v = ty.get_undef();
        for lane in 0..lanes.width {
            let index = i32t.const_int(lane as u64, false);
            v = self.builder.build_insert_element(v, x, index, "")?;
        }
        Ok(v)
    }

    /// `buf[a(t, j)] = v[lane]` for the vector's repetitions.
    fn store_lanes(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        group: &Group<'ctx>,
        lanes: Vector,
        v: VectorValue<'ctx>,
    ) -> Emit<()> {
        if a.outer == 1 {
            let ptr = self.ptr_at(buf, a, t, self.lane_index(group, lanes, 0)?)?;
            let store = self.builder.build_store(ptr, v)?;
            let _ = store.set_alignment(8);
            return Ok(());
        }
        let ptrs = self.lane_ptrs(buf, a, t, group, lanes)?;
        self.scatter(v, ptrs)
    }

    /// `grads[a(t, j)] += d[lane]` for the vector's repetitions: one vector update when they
    /// are adjacent; otherwise lane by lane from the last, so a slot the lanes share receives
    /// them in the interpreter's order (repetitions from the last).
    fn accumulate_lanes(
        &self,
        (vals, grads): (PointerValue<'ctx>, PointerValue<'ctx>),
        a: Affine,
        t: IntValue<'ctx>,
        group: &Group<'ctx>,
        lanes: Vector,
        d: VectorValue<'ctx>,
    ) -> Emit<()> {
        if a.outer == 1 && self.fuses_update(a) {
            let j = self.lane_index(group, lanes, 0)?;
            return self.emit_fused_update_lanes(vals, grads, (a, t, j), d);
        }
        if a.outer != 0 {
            // Each lane its own slot.
            let before = self.load_lanes(grads, a, t, group, lanes)?;
            let after = self.builder.build_float_add(before, d, "")?;
            return self.store_lanes(grads, a, t, group, lanes, after);
        }
        // One slot for every lane: its running sum stays in a register, lanes from the last.
        let i32t = self.context.i32_type();
        let mut sum = self.load_at(grads, a, t, group.first)?;
        for lane in (0..lanes.width).rev() {
            let x = self
                .builder
                .build_extract_element(d, i32t.const_int(lane as u64, false), "")?
                .into_float_value();
            sum = self.builder.build_float_add(sum, x, "")?;
        }
        self.store_at(grads, a, t, group.first, sum)
    }
}

impl<'ctx> Lowerer<'ctx, '_> {
    /// `&buf[a(t, j)]` for the vector's repetitions `j`, as a vector of pointers.
    fn lane_ptrs(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        group: &Group<'ctx>,
        lanes: Vector,
    ) -> Emit<VectorValue<'ctx>> {
        let i64t = self.context.i64_type();
        let first = self.ptr_at(buf, a, t, self.lane_index(group, lanes, 0)?)?;
        let first = self.builder.build_ptr_to_int(first, i64t, "")?;
        let mut addrs = i64t.vec_type(lanes.width).get_undef();
        let i32t = self.context.i32_type();
        for lane in 0..lanes.width {
            let index = i32t.const_int(lane as u64, false);
            addrs = self.builder.build_insert_element(addrs, first, index, "")?;
        }
        let bytes: Vec<_> = (0..lanes.width as i64)
            .map(|l| i64t.const_int((l * a.outer * 8) as u64, true))
            .collect();
        let addrs = self
            .builder
            .build_int_add(addrs, VectorType::const_vector(&bytes), "")?;
        let ptrs = self
            .context
            .ptr_type(Default::default())
            .vec_type(lanes.width);
        self.builder.build_int_to_ptr(addrs, ptrs, "lanes")
    }

    /// `llvm.masked.gather` of every lane.
    fn gather(&self, ptrs: VectorValue<'ctx>, ty: VectorType<'ctx>) -> Emit<VectorValue<'ctx>> {
        let f = self.masked_intrinsic("llvm.masked.gather", &[ty.into(), ptrs.get_type().into()]);
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

    /// `llvm.masked.scatter` of every lane.
    fn scatter(&self, v: VectorValue<'ctx>, ptrs: VectorValue<'ctx>) -> Emit<()> {
        let ty = v.get_type();
        let f = self.masked_intrinsic("llvm.masked.scatter", &[ty.into(), ptrs.get_type().into()]);
        let args = [
            v.into(),
            ptrs.into(),
            self.context.i32_type().const_int(8, false).into(),
            self.all_lanes(ty.get_size()).into(),
        ];
        self.builder.build_call(f, &args, "")?;
        Ok(())
    }

    fn masked_intrinsic(
        &self,
        name: &str,
        types: &[inkwell::types::BasicTypeEnum<'ctx>],
    ) -> inkwell::values::FunctionValue<'ctx> {
        inkwell::intrinsics::Intrinsic::find(name)
            .and_then(|i| i.get_declaration(&self.module, types))
            .expect("LLVM has the masked gather and scatter intrinsics")
    }

    /// A mask with every lane on.
    fn all_lanes(&self, width: u32) -> VectorValue<'ctx> {
        let on = self.context.bool_type().const_int(1, false);
        VectorType::const_vector(&vec![on; width as usize])
    }
}

fn set_alignment<'ctx>(v: impl BasicValue<'ctx>, bytes: u32) {
    if let Some(inst) = v.as_instruction_value() {
        // Loads and stores always take an alignment.
        let _ = inst.set_alignment(bytes);
    }
}
