//! Lowering of recovered loops ([`crate::passes::loops`]): each loop becomes one function
//! with one LLVM loop over memory, in the interpreter's order (forward by increasing `t`,
//! backward by decreasing `t`; a sum's operands left to right). LLVM may vectorize such a
//! loop only where that cannot change a result: no fast-math flags reach it.

use inkwell::values::{FastMathFlags, FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;

use super::ir_arith::Lanes;
use super::lower::{Emit, Lowerer};
use crate::op::Arith;
use crate::passes::loops::{Affine, DotLoop, Item, MapLoop, Nest, SumLoop};

impl<'ctx> Lowerer<'ctx, '_> {
    /// Forward of a loop item outside any nest.
    pub(super) fn emit_item_forward(&self, vals: PointerValue<'ctx>, item: &Item) -> Emit<()> {
        match item {
            Item::Nest(nest) => self.emit_nest_forward(vals, nest),
            _ => self.emit_body_item_forward(vals, item, self.context.i64_type().const_zero()),
        }
    }

    /// Backward of a loop item outside any nest.
    pub(super) fn emit_item_backward(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        item: &Item,
    ) -> Emit<()> {
        let j = self.context.i64_type().const_zero();
        match item {
            Item::Map(run) => self.emit_map_backward(vals, grads, run, j),
            Item::Sum(sum) => self.emit_sum_backward(grads, sum, j),
            Item::Dot(dot) => self.emit_dot_backward(vals, grads, dot, j),
            Item::Nest(nest) => self.emit_nest_backward(vals, grads, nest),
            Item::Straight(_) => Ok(()),
        }
    }

    /// A nest's forward: independent repetitions side by side in vector lanes (`lanes.rs`),
    /// otherwise `for j in 0..count { body }`.
    fn emit_nest_forward(&self, vals: PointerValue<'ctx>, nest: &Nest) -> Emit<()> {
        if nest.independent {
            return self.emit_nest_forward_lanes(vals, nest);
        }
        self.emit_loop(nest.count, false, &[], |this, j, _| {
            for item in &nest.body {
                this.emit_body_item_forward(vals, item, j)?;
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    fn emit_body_item_forward(
        &self,
        vals: PointerValue<'ctx>,
        item: &Item,
        j: IntValue<'ctx>,
    ) -> Emit<()> {
        match item {
            Item::Map(run) => self.emit_map_forward(vals, run, j),
            Item::Sum(sum) => self.emit_sum_forward(vals, sum, j),
            Item::Dot(dot) => self.emit_dot_forward(vals, dot, j),
            Item::Straight(_) | Item::Nest(_) => Ok(()),
        }
    }

    /// A nest's backward: in vector lanes where [`Nest::lanes`] allows, otherwise
    /// `for j in (0..count).rev() { body reversed }`.
    fn emit_nest_backward(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        nest: &Nest,
    ) -> Emit<()> {
        if nest.lanes {
            return self.emit_nest_backward_lanes(vals, grads, nest);
        }
        self.emit_loop(nest.count, true, &[], |this, j, _| {
            for item in nest.body.iter().rev() {
                match item {
                    Item::Map(run) => this.emit_map_backward(vals, grads, run, j)?,
                    Item::Sum(sum) => this.emit_sum_backward(grads, sum, j)?,
                    Item::Dot(dot) => this.emit_dot_backward(vals, grads, dot, j)?,
                    Item::Straight(_) | Item::Nest(_) => {}
                }
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// `vals[out(t)] = op(vals[args(t)]...)` for `t` in `0..len`.
    fn emit_map_forward(
        &self,
        vals: PointerValue<'ctx>,
        run: &MapLoop,
        j: IntValue<'ctx>,
    ) -> Emit<()> {
        self.emit_loop(run.len, false, &[], |this, t, _| {
            let x = this.load_args(vals, run, t, j)?;
            let mut ar = this.ir_arith();
            let v = run.op.forward(&mut ar, &x);
            ar.finish()?;
            this.store_at(vals, run.out, t, j, v)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// For `t` from `len - 1` down to 0, each operand's gradient `+=` its local gradient, in
    /// operand order. Nothing if the run needs no gradient.
    fn emit_map_backward(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        run: &MapLoop,
        j: IntValue<'ctx>,
    ) -> Emit<()> {
        if !run.needs_grad {
            return Ok(());
        }
        let mut local = Vec::new();
        self.emit_loop(run.len, true, &[], |this, t, _| {
            let g = this.load_at(grads, run.out, t, j)?;
            let out = this.load_at(vals, run.out, t, j)?;
            let x = this.load_args(vals, run, t, j)?;
            let mut ar = this.ir_arith();
            run.op.local_grads(&mut ar, &x, out, g, &mut local);
            ar.finish()?;
            for ((&a, &d), &takes) in run.args.iter().zip(&local).zip(&run.grad_args) {
                if takes {
                    this.accumulate_at(grads, a, t, j, d)?;
                }
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// `vals[slot] = vals[first] + vals[tail(0)] + ...`, left to right.
    fn emit_sum_forward(
        &self,
        vals: PointerValue<'ctx>,
        sum: &SumLoop,
        j: IntValue<'ctx>,
    ) -> Emit<()> {
        let zero = self.context.i64_type().const_zero();
        let first = self.load_at(vals, sum.first, zero, j)?;
        let total = self.emit_loop(sum.tail_len, false, &[first], |this, t, acc| {
            let x = this.load_at(vals, sum.tail, t, j)?;
            Ok(vec![this.add_to_sum(acc[0], x)?])
        })?;
        let total = total[0];
        self.store_at(vals, sum.slot, zero, j, total)
    }

    /// Every operand's gradient `+=` the sum's, left to right. Nothing if the sum needs no
    /// gradient.
    fn emit_sum_backward(
        &self,
        grads: PointerValue<'ctx>,
        sum: &SumLoop,
        j: IntValue<'ctx>,
    ) -> Emit<()> {
        if !sum.needs_grad {
            return Ok(());
        }
        let g = self.sum_grad_at(grads, sum, j)?;
        if sum.grad_tail {
            self.emit_loop(sum.tail_len, false, &[], |this, t, _| {
                this.accumulate_at(grads, sum.tail, t, j, g)?;
                Ok(Vec::new())
            })?;
        }
        Ok(())
    }

    /// A sum's gradient, after adding it into `first` (the first of its operands).
    fn sum_grad_at(
        &self,
        grads: PointerValue<'ctx>,
        sum: &SumLoop,
        j: IntValue<'ctx>,
    ) -> Emit<FloatValue<'ctx>> {
        let zero = self.context.i64_type().const_zero();
        let g = self.load_at(grads, sum.slot, zero, j)?;
        if sum.grad_first {
            self.accumulate_at(grads, sum.first, zero, j, g)?;
        }
        Ok(g)
    }

    /// `vals[slot] = vals[first] + a(0) * b(0) + ...`, left to right, the products in
    /// registers only.
    fn emit_dot_forward(
        &self,
        vals: PointerValue<'ctx>,
        dot: &DotLoop,
        j: IntValue<'ctx>,
    ) -> Emit<()> {
        let (sum, products) = (&dot.sum, &dot.products);
        let zero = self.context.i64_type().const_zero();
        let first = self.load_at(vals, sum.first, zero, j)?;
        let total = self.emit_loop(products.len, false, &[first], |this, t, acc| {
            let x = this.load_args(vals, products, t, j)?;
            let mut ar = this.ir_arith();
            let product = products.op.forward(&mut ar, &x);
            ar.finish()?;
            Ok(vec![this.add_to_sum(acc[0], product)?])
        })?;
        self.store_at(vals, sum.slot, zero, j, total[0])
    }

    /// The sum's backward, then the products' from the last to the first. Each product's
    /// gradient would start at 0 and receive the sum's once: `0 + g` (which turns a -0 into
    /// +0, as the interpreter's buffer does).
    fn emit_dot_backward(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        dot: &DotLoop,
        j: IntValue<'ctx>,
    ) -> Emit<()> {
        let (sum, products) = (&dot.sum, &dot.products);
        if !sum.needs_grad {
            return Ok(());
        }
        let g = self.sum_grad_at(grads, sum, j)?;
        let mut ar = self.ir_arith();
        let fresh = ar.constant(0.0);
        let g_product = ar.add(fresh, g);
        ar.finish()?;
        let mut local = Vec::new();
        self.emit_loop(products.len, true, &[], |this, t, _| {
            let x = this.load_args(vals, products, t, j)?;
            let mut ar = this.ir_arith();
            let product = products.op.forward(&mut ar, &x);
            products
                .op
                .local_grads(&mut ar, &x, product, g_product, &mut local);
            ar.finish()?;
            for ((&a, &d), &takes) in products.args.iter().zip(&local).zip(&products.grad_args) {
                if takes {
                    this.accumulate_at(grads, a, t, j, d)?;
                }
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// The operands of iteration `t` of a map.
    fn load_args(
        &self,
        vals: PointerValue<'ctx>,
        run: &MapLoop,
        t: IntValue<'ctx>,
        j: IntValue<'ctx>,
    ) -> Emit<Vec<FloatValue<'ctx>>> {
        run.args
            .iter()
            .map(|&a| self.load_at(vals, a, t, j))
            .collect()
    }

    /// `acc + x`, reassociable under [`super::JitBuilder::fast_math`].
    pub(super) fn add_to_sum<V: Lanes<'ctx>>(&self, acc: V, x: V) -> Emit<V> {
        let next = self.builder.build_float_add(acc, x, "acc")?;
        if let (Some(flags), Some(inst)) = (self.loop_fast_math(), next.as_instruction_value()) {
            // An fadd always takes fast-math flags.
            let _ = inst.set_fast_math_flags(flags);
        }
        Ok(next)
    }

    /// Under [`super::JitBuilder::fast_math`], what recovered loops' arithmetic may do:
    /// reassociate, ignore the sign of zero, contract a multiply and an add into one FMA.
    pub(super) fn loop_fast_math(&self) -> Option<FastMathFlags> {
        self.fast_math.then_some(
            FastMathFlags::AllowReassoc
                | FastMathFlags::NoSignedZeros
                | FastMathFlags::AllowContract,
        )
    }

    /// `&buf[a.base + a.stride * t + a.outer * j]`
    pub(super) fn ptr_at(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        j: IntValue<'ctx>,
    ) -> Emit<PointerValue<'ctx>> {
        let i64t = self.context.i64_type();
        let along = self
            .builder
            .build_int_mul(t, i64t.const_int(a.stride as u64, true), "")?;
        let across = self
            .builder
            .build_int_mul(j, i64t.const_int(a.outer as u64, true), "")?;
        let offset = self.builder.build_int_add(along, across, "")?;
        let index =
            self.builder
                .build_int_add(offset, i64t.const_int(a.base as u64, true), "slot")?;
        // SAFETY: (of the GEP) the pass only forms affine sequences of existing slots.
        unsafe {
            self.builder
                .build_in_bounds_gep(self.f64_type, buf, &[index], "")
        }
    }

    pub(super) fn load_at(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        j: IntValue<'ctx>,
    ) -> Emit<FloatValue<'ctx>> {
        let ptr = self.ptr_at(buf, a, t, j)?;
        Ok(self
            .builder
            .build_load(self.f64_type, ptr, "")?
            .into_float_value())
    }

    pub(super) fn store_at(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        j: IntValue<'ctx>,
        v: FloatValue<'ctx>,
    ) -> Emit<()> {
        let ptr = self.ptr_at(buf, a, t, j)?;
        self.builder.build_store(ptr, v)?;
        Ok(())
    }

    /// `grads[a(t, j)] += d`
    pub(super) fn accumulate_at(
        &self,
        grads: PointerValue<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        j: IntValue<'ctx>,
        d: FloatValue<'ctx>,
    ) -> Emit<()> {
        let ptr = self.ptr_at(grads, a, t, j)?;
        let before = self
            .builder
            .build_load(self.f64_type, ptr, "")?
            .into_float_value();
        let after = self.builder.build_float_add(before, d, "")?;
        self.builder.build_store(ptr, after)?;
        Ok(())
    }

    /// Emits `for t in 0..len` (or `(0..len).rev()`) around `body` (which may emit loops of
    /// its own); `body` gets `t` and the carried values and returns their next values.
    /// Returns the carried values after the last iteration. `len` must be at least 1.
    pub(super) fn emit_loop(
        &self,
        len: u32,
        descending: bool,
        carried: &[FloatValue<'ctx>],
        body: impl FnMut(&Self, IntValue<'ctx>, &[FloatValue<'ctx>]) -> Emit<Vec<FloatValue<'ctx>>>,
    ) -> Emit<Vec<FloatValue<'ctx>>> {
        self.emit_loop_carrying(len, descending, carried, body)
    }

    /// [`Self::emit_loop`] carrying scalars or vectors.
    pub(super) fn emit_loop_carrying<V: Lanes<'ctx>>(
        &self,
        len: u32,
        descending: bool,
        carried: &[V],
        mut body: impl FnMut(&Self, IntValue<'ctx>, &[V]) -> Emit<Vec<V>>,
    ) -> Emit<Vec<V>> {
        let i64t = self.context.i64_type();
        let entry = self
            .builder
            .get_insert_block()
            .expect("positioned in a function");
        let f = entry.get_parent().expect("the block is in a function");
        let header = self.context.append_basic_block(f, "loop");
        let exit = self.context.append_basic_block(f, "exit");
        self.builder.build_unconditional_branch(header)?;

        self.builder.position_at_end(header);
        let t = self.builder.build_phi(i64t, "t")?;
        let phis = carried
            .iter()
            .map(|c| {
                let ty = c.as_basic_value_enum().get_type();
                self.builder.build_phi(ty, "carried")
            })
            .collect::<Emit<Vec<_>>>()?;
        let t_value = t.as_basic_value().into_int_value();
        let current: Vec<V> = phis
            .iter()
            .map(|p| V::from_basic(p.as_basic_value()))
            .collect();
        let next_carried = body(self, t_value, &current)?;
        let one = i64t.const_int(1, false);
        let (start, next, more) = if descending {
            let next = self.builder.build_int_sub(t_value, one, "t_next")?;
            let more = self.builder.build_int_compare(
                IntPredicate::NE,
                t_value,
                i64t.const_zero(),
                "more",
            )?;
            (i64t.const_int(len as u64 - 1, false), next, more)
        } else {
            let next = self.builder.build_int_add(t_value, one, "t_next")?;
            let more = self.builder.build_int_compare(
                IntPredicate::ULT,
                next,
                i64t.const_int(len as u64, false),
                "more",
            )?;
            (i64t.const_zero(), next, more)
        };
        let latch = self.builder.get_insert_block().expect("positioned");
        self.builder.build_conditional_branch(more, header, exit)?;
        t.add_incoming(&[(&start, entry), (&next, latch)]);
        for ((phi, init), next) in phis.iter().zip(carried).zip(&next_carried) {
            phi.add_incoming(&[(init, entry), (next, latch)]);
        }

        // LCSSA: carried values leave the loop through phis of the exit block.
        self.builder.position_at_end(exit);
        next_carried
            .iter()
            .map(|v| {
                let out = self
                    .builder
                    .build_phi(v.as_basic_value_enum().get_type(), "total")?;
                out.add_incoming(&[(v, latch)]);
                Ok(V::from_basic(out.as_basic_value()))
            })
            .collect()
    }
}
