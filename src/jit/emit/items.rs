//! Loop items ([`crate::passes::loops`]) as LLVM loops over memory, in the interpreter's
//! order: forward by increasing `t` (and repetition), backward by decreasing `t` (and
//! repetition) with a nest's body reversed; a sum's operands left to right.
//!
//! Each item kind is lowered once, generic over [`LaneIo`]: as scalars for one repetition at
//! a time, as vectors for a nest's lane groups. LLVM may vectorize a scalar loop only where
//! that cannot change a result: no fast-math flags reach it unless the user asked.

use inkwell::values::{FastMathFlags, FloatValue, IntValue, PointerValue, VectorValue};

use super::lane_io::{LaneIo, Reps, Vector};
use super::IrArith;
use super::{Emit, Emitter, Frame};
use crate::op::Arith;

use crate::passes::lane_order::{backward_operands, vertical_arg};
use crate::passes::schedule::{Affine, DotLoop, Item, MapLoop, Nest, SumLoop};
use crate::plan::memory::Addition;
use crate::plan::shared::SHARED_CHUNK;
use crate::plan::SharedGrad;

impl<'ctx, 't> Emitter<'ctx, 't> {
    /// Forward of a loop item outside any nest.
    pub(super) fn item_forward(&self, frame: Frame<'ctx>, item: &Item) -> Emit<()> {
        self.loop_code(|| self.body_forward::<FloatValue>(frame, item, &Reps::top()))
    }

    /// Backward of a loop item outside any nest.
    pub(super) fn item_backward(&self, frame: Frame<'ctx>, item: &Item) -> Emit<()> {
        self.loop_code(|| self.body_backward::<FloatValue>(frame, item, &Reps::top()))
    }

    /// Emits loop code: the only code that consults [`Emitter::known`], and whose every
    /// buffer write tells it. What it knew before (or learns inside) may be stale after
    /// (or before) any other code, so it starts and ends empty.
    pub(super) fn loop_code(&self, emit: impl FnOnce() -> Emit<()>) -> Emit<()> {
        self.known.forget(self.builder.get_insert_block());
        let done = emit();
        self.known.forget(self.builder.get_insert_block());
        done
    }

    /// A nest's forward: lane groups, each body item for the whole group, where the plan
    /// allows; otherwise `for j in 0..count { body }`; the body's items in the order the
    /// plan chose ([`crate::plan::NestPlan::forward_items`]).
    fn nest_forward(&self, frame: Frame<'ctx>, nest: &Nest, outer: &Reps<'ctx>) -> Emit<()> {
        let plan = self.plan.nest(nest);
        if let Some(group) = plan.lanes.forward() {
            return self.for_each_group(nest.count, group, false, outer, |this, reps| {
                plan.forward_items(nest)
                    .try_for_each(|item| this.body_forward::<VectorValue>(frame, item, reps))
            });
        }
        self.emit_repetitions(nest.count, false, |this, j| {
            let reps = outer.scalar_in(j, nest.count);
            plan.forward_items(nest)
                .try_for_each(|item| this.body_forward::<FloatValue>(frame, item, &reps))
        })
    }

    /// A nest's backward: lane groups from the last, body items from the last, where the
    /// plan allows; otherwise `for j in (0..count).rev() { body reversed }`.
    fn nest_backward(&self, frame: Frame<'ctx>, nest: &Nest, outer: &Reps<'ctx>) -> Emit<()> {
        let plan = self.plan.nest(nest);
        if let Some(group) = plan.lanes.backward() {
            return self.for_each_group(nest.count, group, true, outer, |this, reps| {
                let reps = &Reps {
                    vertical: plan.lanes.vertical(),
                    ..reps.clone()
                };
                this.zero_local_grads::<VectorValue>(frame, &nest.body, reps)?;
                (nest.body.iter().enumerate().rev()).try_for_each(|(k, item)| {
                    let reps = &Reps {
                        operands_from_last: plan.adds_from_last(k),
                        ..reps.clone()
                    };
                    this.body_backward::<VectorValue>(frame, item, reps)
                })
            });
        }
        let body = plan.repetition_body(nest);
        self.emit_repetitions(nest.count, true, |this, j| {
            let reps = outer.scalar_in(j, nest.count);
            this.zero_local_grads::<FloatValue>(frame, &body, &reps)?;
            body.iter()
                .rev()
                .try_for_each(|item| this.body_backward::<FloatValue>(frame, item, &reps))
        })?;
        for &shared in &plan.shared_grads {
            self.shared_grad_backward(frame, nest, shared, outer)?;
        }
        Ok(())
    }

    /// A [`SharedGrad`] after its nest's repetitions, in chunks of [`SHARED_CHUNK`]
    /// repetitions from the last (a partial chunk of the last ones first): per chunk and lane
    /// group of the inner nest, the products' gradients of the chunk's repetitions held in
    /// registers, then per step one running sum per vector of the operand's gradients,
    /// loaded, the repetitions' contributions added from the last, stored.
    fn shared_grad_backward(
        &self,
        frame: Frame<'ctx>,
        nest: &Nest,
        shared: SharedGrad,
        outer: &Reps<'ctx>,
    ) -> Emit<()> {
        // The chunks are the nest's repetitions grouped as lanes would be, from the last.
        let chunk = SHARED_CHUNK.min(nest.count);
        self.for_each_group(nest.count, chunk, true, outer, |this, repetitions| {
            let first = *repetitions.js.last().expect("a group has its nest's level");
            let size = repetitions.vectors.iter().map(|v| v.width).sum();
            this.shared_grad_chunk(frame, nest, shared, outer, (first, size))
        })
    }

    /// [`Emitter::shared_grad_backward`]'s chunk of `size` repetitions from `first`.
    fn shared_grad_chunk(
        &self,
        frame: Frame<'ctx>,
        nest: &Nest,
        shared: SharedGrad,
        outer: &Reps<'ctx>,
        (first, size): (IntValue<'ctx>, u32),
    ) -> Emit<()> {
        let Some((inner, dot)) = shared.dot_in(nest) else {
            unreachable!("the plan names a dot of a nest of lanes")
        };
        let Some(group) = self.plan.nest(inner).lanes.backward() else {
            unreachable!("the plan shares gradients of nests of lanes")
        };
        let (map, k) = (&dot.products, shared.operand);
        let i64t = self.context.i64_type();
        let at_first = outer.scalar_in(first, nest.count);
        self.for_each_group(inner.count, group, true, &at_first, |this, lanes| {
            // The lane group in repetition first + i of the nest.
            let level = lanes.js.len() - 2;
            let repetitions = (0..size)
                .map(|i| {
                    let mut reps = lanes.clone();
                    let i = i64t.const_int(i as u64, false);
                    reps.js[level] = this.builder.build_int_add(first, i, "j")?;
                    Ok(reps)
                })
                .collect::<Emit<Vec<_>>>()?;
            let g_products = repetitions
                .iter()
                .map(|reps| {
                    let gs = this.load_first::<VectorValue>(frame.grads, dot.sum.slot, reps)?;
                    this.fresh(&gs)
                })
                .collect::<Emit<Vec<_>>>()?;
            let a = map.args[k];
            this.emit_loop::<VectorValue>(map.len, true, &[], |this, t, _| {
                let mut sums = lanes
                    .vectors
                    .iter()
                    .map(|&v| VectorValue::load(this, frame.grads, a, t, lanes, v))
                    .collect::<Emit<Vec<_>>>()?;
                for (reps, gs) in repetitions.iter().zip(&g_products).rev() {
                    let locals = this.products_locals(frame, map, t, reps, gs)?;
                    for (sum, local) in sums.iter_mut().zip(&locals) {
                        *sum = this.builder.build_float_add(*sum, local[k], "")?;
                    }
                }
                for (&v, &sum) in lanes.vectors.iter().zip(&sums) {
                    VectorValue::store(this, frame.grads, a, t, lanes, v, sum)?;
                }
                Ok(Vec::new())
            })?;
            Ok(())
        })
    }

    /// Runs `body` on every group of `size` repetitions (a loop over the full groups, and
    /// the rest), in increasing or decreasing order.
    pub(super) fn for_each_group(
        &self,
        count: u32,
        size: u32,
        descending: bool,
        outer: &Reps<'ctx>,
        mut body: impl FnMut(&Self, &Reps<'ctx>) -> Emit<()>,
    ) -> Emit<()> {
        let i64t = self.context.i64_type();
        let (full, rest) = (count / size, count % size);
        let rest_group = outer.group_in(i64t.const_int((full * size) as u64, false), count, rest);
        if rest > 0 && descending {
            body(self, &rest_group)?;
        }
        if full == 1 {
            body(self, &outer.group_in(i64t.const_zero(), count, size))?;
        } else if full > 1 {
            self.emit_repetitions(full, descending, |this, g| {
                let stride = i64t.const_int(size as u64, false);
                let first = this.builder.build_int_mul(g, stride, "group")?;
                body(this, &outer.group_in(first, count, size))
            })?;
        }
        if rest > 0 && !descending {
            body(self, &rest_group)?;
        }
        Ok(())
    }

    fn body_forward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        item: &Item,
        reps: &Reps<'ctx>,
    ) -> Emit<()> {
        match item {
            Item::Map(map) => self.map_forward::<V>(frame, map, reps),
            Item::Sum(sum) => self.sum_forward::<V>(frame, sum, None, reps),
            Item::Dot(dot) => match self.first_layer_forward::<V>(frame, dot, reps) {
                Some(emitted) => emitted,
                None => self.sum_forward::<V>(frame, &dot.sum, Some(&dot.products), reps),
            },
            Item::Nest(nest) => self.nest_forward(frame, nest, reps),
            Item::Straight(_) | Item::SumPart { .. } => Ok(()),
        }
    }

    fn body_backward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        item: &Item,
        reps: &Reps<'ctx>,
    ) -> Emit<()> {
        match item {
            Item::Map(map) => self.map_backward::<V>(frame, map, reps),
            Item::Sum(sum) => self.sum_backward::<V>(frame, sum, reps),
            Item::Dot(dot) => self.dot_backward::<V>(frame, dot, reps),
            Item::Nest(nest) => self.nest_backward(frame, nest, reps),
            Item::Straight(_) | Item::SumPart { .. } => Ok(()),
        }
    }

    /// `vals[out(t)] = op(vals[args(t)]...)` for `t` in `0..len`.
    fn map_forward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        reps: &Reps<'ctx>,
    ) -> Emit<()> {
        self.emit_loop::<V>(map.len, false, &[], |this, t, _| {
            for &lanes in &reps.vectors {
                let x = this.load_args::<V>(frame, map, t, reps, lanes)?;
                let mut ar = this.arith::<V>(lanes);
                let y = map.op.forward(&mut ar, &x);
                ar.finish()?;
                if !this.store_local_value(frame, map.out, lanes, y)? {
                    V::store(this, frame.vals, map.out, t, reps, lanes, y)?;
                }
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// A sum per lane, left to right; with `products`, a dot product whose last terms are
    /// the products of the map (computed here, never stored), the terms before them loaded.
    fn sum_forward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        sum: &SumLoop,
        products: Option<&MapLoop>,
        reps: &Reps<'ctx>,
    ) -> Emit<()> {
        let firsts = self.load_first::<V>(frame.vals, sum.first, reps)?;
        let computed = products.map_or(0, |m| m.len);
        let loaded = match sum.tail_len - computed {
            0 => firsts,
            head => self.emit_loop(head, false, &firsts, |this, t, accs| {
                this.sum_step(frame, sum, None, t, reps, accs)
            })?,
        };
        let totals = match products {
            Some(_) => self.emit_loop(computed, false, &loaded, |this, t, accs| {
                this.sum_step(frame, sum, products, t, reps, accs)
            })?,
            None => loaded,
        };
        self.store_first(frame.vals, sum.slot, reps, &totals)
    }

    /// Step `t` of [`Emitter::sum_forward`]: its term (the tail's, or with `products` their
    /// `t`-th) added to each lane's sum so far.
    pub(super) fn sum_step<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        sum: &SumLoop,
        products: Option<&MapLoop>,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        accs: &[V],
    ) -> Emit<Vec<V>> {
        reps.vectors
            .iter()
            .zip(accs)
            .map(|(&lanes, &acc)| {
                let term = match products {
                    Some(map) => {
                        let x = self.load_args::<V>(frame, map, t, reps, lanes)?;
                        let mut ar = self.arith::<V>(lanes);
                        let product = map.op.forward(&mut ar, &x);
                        ar.finish()?;
                        product
                    }
                    None => V::load(self, frame.vals, sum.tail, t, reps, lanes)?,
                };
                self.add_to_sum(acc, term)
            })
            .collect()
    }

    /// For `t` from `len - 1` down to 0, each operand's gradient `+=` its local gradient, in
    /// operand order (from the last where the plan says, `backward_operands`). Nothing if the
    /// map needs no gradient.
    fn map_backward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        reps: &Reps<'ctx>,
    ) -> Emit<()> {
        if !map.needs_grad {
            return Ok(());
        }
        if let Some(shared) = vertical_arg(map, reps.lane_level()).filter(|_| reps.vertical) {
            return self.vertical_backward(frame, map, reps, shared, None, |this, t| {
                this.map_locals(frame, map, t, reps)
            });
        }
        self.emit_loop::<V>(map.len, true, &[], |this, t, _| {
            let locals = this.map_locals::<V>(frame, map, t, reps)?;
            this.accumulate_args(frame, map, t, reps, &locals)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// The local gradients of `map` at step `t`, per vector of `reps`, in operand order.
    fn map_locals<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
    ) -> Emit<Vec<Vec<V>>> {
        let mut locals = Vec::with_capacity(reps.vectors.len());
        for &lanes in &reps.vectors {
            let g = match self.local_grad(frame, map.out, lanes)? {
                Some(g) => g,
                None => V::load(self, frame.grads, map.out, t, reps, lanes)?,
            };
            let out = match self.local_value(frame, map.out, lanes)? {
                Some(out) => out,
                None => V::load(self, frame.vals, map.out, t, reps, lanes)?,
            };
            let x = self.load_args::<V>(frame, map, t, reps, lanes)?;
            let mut ar = self.arith::<V>(lanes);
            let mut local = Vec::new();
            map.op.local_grads(&mut ar, &x, out, g, &mut local);
            ar.finish()?;
            locals.push(local);
        }
        Ok(locals)
    }

    /// The sum's gradient into `first`, then into the tail left to right.
    fn sum_backward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        sum: &SumLoop,
        reps: &Reps<'ctx>,
    ) -> Emit<()> {
        if !sum.needs_grad {
            return Ok(());
        }
        let gs = self.sum_grads::<V>(frame, sum, reps)?;
        self.tail_backward(frame, sum, sum.tail_len, reps, &gs)
    }

    /// The sum's gradients `gs` into its first `terms` tail terms, left to right (a dot's
    /// terms before its products, or a sum's whole tail).
    fn tail_backward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        sum: &SumLoop,
        terms: u32,
        reps: &Reps<'ctx>,
        gs: &[V],
    ) -> Emit<()> {
        if !sum.grad_tail || terms == 0 {
            return Ok(());
        }
        self.emit_loop::<V>(terms, false, &[], |this, t, _| {
            for (&lanes, &g) in reps.vectors.iter().zip(gs).rev() {
                V::accumulate(this, frame, Addition::sum_tail(sum), t, reps, lanes, g)?;
            }
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// The sum's gradient into `first`, then the products' backward from the last: each
    /// product's gradient is `0 + g` (what its zeroed buffer would hold: it turns a -0 into
    /// +0, as the interpreter's buffer does).
    fn dot_backward<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        dot: &DotLoop,
        reps: &Reps<'ctx>,
    ) -> Emit<()> {
        let (sum, map) = (&dot.sum, &dot.products);
        if !sum.needs_grad {
            return Ok(());
        }
        if let Some(emitted) = self.first_layer_backward::<V>(frame, dot, reps) {
            return emitted;
        }
        if let Some(shared) = vertical_arg(map, reps.lane_level()).filter(|_| reps.vertical) {
            let gs = self.sum_grads::<VectorValue>(frame, sum, reps)?;
            self.tail_backward(frame, sum, dot.head(), reps, &gs)?;
            let g_products = self.fresh(&gs)?;
            let gs = Some(g_products.as_slice());
            return self.vertical_backward(frame, map, reps, shared, gs, |this, t| {
                this.products_locals(frame, map, t, reps, &g_products)
            });
        }
        let gs = self.sum_grads::<V>(frame, sum, reps)?;
        self.tail_backward(frame, sum, dot.head(), reps, &gs)?;
        let g_products = self.fresh(&gs)?;
        self.emit_loop::<V>(map.len, true, &[], |this, t, _| {
            let locals = this.products_locals::<V>(frame, map, t, reps, &g_products)?;
            this.accumulate_args(frame, map, t, reps, &locals)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// Stores the gradients of operand `i` of a dot's products that `step` deferred:
    /// `0 + local_i` with the products' gradient `0 + g_sum`, as the lane backward computes
    /// them. The operand itself may have been updated since; a product's local gradient for
    /// one operand reads only the other (the plan defers nothing else).
    pub(super) fn deferred_grads(
        &self,
        frame: Frame<'ctx>,
        nest: &Nest,
        dot: &DotLoop,
        i: usize,
        group: u32,
    ) -> Emit<()> {
        let (sum, map) = (&dot.sum, &dot.products);
        let top = Reps::top();
        self.loop_code(|| {
            self.for_each_group(nest.count, group, false, &top, |this, reps| {
                let gs = this.load_first::<VectorValue>(frame.grads, sum.slot, reps)?;
                let g_products = this.fresh(&gs)?;
                this.emit_loop::<VectorValue>(map.len, false, &[], |this, t, _| {
                    for (&lanes, &g) in reps.vectors.iter().zip(&g_products) {
                        let x = this.load_args::<VectorValue>(frame, map, t, reps, lanes)?;
                        let local = this.product_grads(map, lanes, &x, g)?;
                        let g_operand = this.fresh(&local[i..=i])?[0];
                        VectorValue::store(
                            this,
                            frame.grads,
                            map.args[i],
                            t,
                            reps,
                            lanes,
                            g_operand,
                        )?;
                    }
                    Ok(Vec::new())
                })?;
                Ok(())
            })
        })
    }

    /// Loads a sum's gradient for every vector and adds it into `first`.
    pub(super) fn sum_grads<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        sum: &SumLoop,
        reps: &Reps<'ctx>,
    ) -> Emit<Vec<V>> {
        let zero = self.context.i64_type().const_zero();
        let gs = self.load_first::<V>(frame.grads, sum.slot, reps)?;
        if sum.grad_first {
            for (&lanes, &g) in reps.vectors.iter().zip(&gs).rev() {
                V::accumulate(self, frame, Addition::sum_first(sum), zero, reps, lanes, g)?;
            }
        }
        Ok(gs)
    }

    /// `0 + g` per vector: what a gradient buffer zeroed by backward holds after receiving
    /// `g` once.
    pub(super) fn fresh<V: LaneIo<'ctx>>(&self, gs: &[V]) -> Emit<Vec<V>> {
        gs.iter()
            .map(|&g| {
                let ty = V::ty_of(g);
                let mut ar = IrArith::<V>::new(&self.builder, &self.module, ty, &self.math)
                    .with_fast_math(self.loop_fast_math());
                let fresh = ar.constant(0.0);
                let sum = ar.add(fresh, g);
                ar.finish()?;
                Ok(sum)
            })
            .collect()
    }

    /// The local gradients of a dot's products at step `t` (whose gradients per vector are
    /// `g_products`), per vector, in operand order.
    pub(super) fn products_locals<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        g_products: &[V],
    ) -> Emit<Vec<Vec<V>>> {
        reps.vectors
            .iter()
            .zip(g_products)
            .map(|(&lanes, &g)| {
                let x = self.load_args::<V>(frame, map, t, reps, lanes)?;
                self.product_grads(map, lanes, &x, g)
            })
            .collect()
    }

    /// The local gradients of one vector of products with operands `x`, given their
    /// gradient `g`, in operand order.
    pub(super) fn product_grads<V: LaneIo<'ctx>>(
        &self,
        map: &MapLoop,
        lanes: Vector,
        x: &[V],
        g: V,
    ) -> Emit<Vec<V>> {
        let mut ar = self.arith::<V>(lanes);
        let product = map.op.forward(&mut ar, x);
        let mut local = Vec::new();
        map.op.local_grads(&mut ar, x, product, g, &mut local);
        ar.finish()?;
        Ok(local)
    }

    /// Adds each operand's local gradients (`locals[vector][operand]`), operand by operand
    /// (in `backward_operands`' order), vectors from the last: the order the plan checked
    /// lanes for.
    pub(super) fn accumulate_args<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        locals: &[Vec<V>],
    ) -> Emit<()> {
        if V::accumulate_neighbours(self, frame, map, t, reps, locals)? {
            return Ok(());
        }
        self.accumulate_args_but(frame, map, t, reps, locals, None)
    }

    /// [`Emitter::accumulate_args`] for every operand but `except`.
    pub(super) fn accumulate_args_but<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        locals: &[Vec<V>],
        except: Option<usize>,
    ) -> Emit<()> {
        for (i, _) in backward_operands(map, reps.operands_from_last) {
            if except == Some(i) {
                continue;
            }
            let additions = Addition::map_arg(map, i);
            for (&lanes, local) in reps.vectors.iter().zip(locals).rev() {
                V::accumulate(self, frame, additions, t, reps, lanes, local[i])?;
            }
        }
        Ok(())
    }

    /// `buf[a(0, j)]` for every vector of `reps`: one value per vector (a sum's first
    /// operand, gradient or total).
    pub(super) fn load_first<V: LaneIo<'ctx>>(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        reps: &Reps<'ctx>,
    ) -> Emit<Vec<V>> {
        let zero = self.context.i64_type().const_zero();
        reps.vectors
            .iter()
            .map(|&lanes| V::load(self, buf, a, zero, reps, lanes))
            .collect()
    }

    /// `buf[a(0, j)] = vs[vector]` for every vector of `reps`.
    pub(super) fn store_first<V: LaneIo<'ctx>>(
        &self,
        buf: PointerValue<'ctx>,
        a: Affine,
        reps: &Reps<'ctx>,
        vs: &[V],
    ) -> Emit<()> {
        let zero = self.context.i64_type().const_zero();
        for (&lanes, &v) in reps.vectors.iter().zip(vs) {
            V::store(self, buf, a, zero, reps, lanes, v)?;
        }
        Ok(())
    }

    /// The operands of iteration `t` of a map (a constant as itself, `crate::plan::constants`;
    /// local values from the scratch; two one lane apart, the lower from the upper,
    /// `Emitter::load_neighbours`).
    fn load_args<V: LaneIo<'ctx>>(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
    ) -> Emit<Vec<V>> {
        if let Some(args) = V::load_neighbours(self, frame, map, t, reps, lanes)? {
            return Ok(args);
        }
        let args = map.args.iter().enumerate();
        args.map(|(i, &a)| {
            if let Some(c) = self.plan.constants.operand(map, i) {
                return V::shared(self, self.f64_type().const_float(c), lanes);
            }
            if let Some(x) = self.first_layer_operand(frame, map, i, t, lanes) {
                return x;
            }
            match self.local_value(frame, a, lanes)? {
                Some(x) => Ok(x),
                None => V::load(self, frame.vals, a, t, reps, lanes),
            }
        })
        .collect()
    }

    /// Arithmetic on values of `lanes`, with the loops' fast-math flags, formulas inline.
    pub(super) fn arith<V: LaneIo<'ctx>>(&self, lanes: Vector) -> IrArith<'_, 'ctx, V> {
        IrArith::new(&self.builder, &self.module, V::ty(self, lanes), &self.math)
            .with_fast_math(self.loop_fast_math())
            .with_formulas_inline()
    }

    /// `acc + x`, reassociable under [`crate::JitBuilder::fast_math`].
    pub(super) fn add_to_sum<V: LaneIo<'ctx>>(&self, acc: V, x: V) -> Emit<V> {
        let next = self.builder.build_float_add(acc, x, "acc")?;
        if let (Some(flags), Some(inst)) = (self.loop_fast_math(), next.as_instruction_value()) {
            // An fadd always takes fast-math flags.
            let _ = inst.set_fast_math_flags(flags);
        }
        Ok(next)
    }

    /// Under [`crate::JitBuilder::fast_math`], what recovered loops' arithmetic may do:
    /// reassociate, ignore the sign of zero, contract a multiply and an add into one FMA.
    pub(super) fn loop_fast_math(&self) -> Option<FastMathFlags> {
        self.plan.fast_math.then_some(
            FastMathFlags::AllowReassoc
                | FastMathFlags::NoSignedZeros
                | FastMathFlags::AllowContract,
        )
    }
}
