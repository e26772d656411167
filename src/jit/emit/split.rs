//! A minibatch's sample in stages, `train`'s dot cut by its rows ([`crate::plan::split`]),
//! for [`crate::minibatch`] to run the rows on different threads:
//!
//! - `acc_head(vals, grads, sample, guard, first, end, from_biases, ahead)`: the dot's sums
//!   continued over its steps `first..end` of `sample`, from the biases if `from_biases` is
//!   not 0, else from the sums in `vals` (another stage's); the same inputs of `ahead`, the
//!   sample the next call reads, asked into the cache meanwhile (they come from memory);
//! - `acc_rest(vals, grads, sample, loss)`: the sample's inputs but the dot's copied
//!   in and run forward and backward from the dot's sums in `vals` (its loss into `loss`),
//!   everything of the dot left out but its sums' gradients, which are added into the
//!   biases' and left in `grads`;
//! - `acc_tail(vals, grads, samples, m, first, end, sums_grads, outs, chunk)`: the weights'
//!   gradients of steps `first..end` of a whole minibatch (`m` samples), row by row, each
//!   chunk's summed in registers from 0 and stored once into its own buffer.
//!
//! Each skips zero inputs as `accumulate` does (`emit/sparse.rs`), within its rows; head and
//! tail read the inputs from the sample, as `train` does, not from the buffer.

use inkwell::types::VectorType;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};

use super::lanes::{LaneIo, Reps};
use super::sparse::Rows;
use super::{Emit, Emitter, Frame, Part, Pass, ACC_HEAD, ACC_REST, ACC_TAIL};
use crate::passes::loops::{Affine, DotLoop, Nest};
use crate::plan::split::split_nest;
use crate::plan::ZeroSkip;

impl<'ctx> Emitter<'ctx, '_> {
    /// The three stages, where the plan splits `train`'s dot; `forward` and `backward` are
    /// `accumulate`'s parts.
    pub(super) fn split_entries(
        &self,
        forward: &[Part<'ctx>],
        backward: &[Part<'ctx>],
    ) -> Emit<()> {
        let (Some(_), Some(step), Some(skip)) =
            (&self.plan.split, &self.plan.step, self.zero_skip())
        else {
            return Ok(());
        };
        let (nest, dot) = split_nest(&self.plan.functions, step).expect("the plan found it");
        self.acc_head(nest, dot, skip)?;
        self.acc_rest(forward, backward)?;
        self.acc_tail(nest, dot, skip)
    }

    fn acc_head(&self, nest: &Nest, dot: &DotLoop, skip: &ZeroSkip) -> Emit<()> {
        let (ptr, i64t) = (
            self.context.ptr_type(Default::default()),
            self.context.i64_type(),
        );
        let types = [
            ptr.into(),
            ptr.into(),
            i64t.into(),
            i64t.into(),
            i64t.into(),
            ptr.into(),
        ];
        let f = self.begin_function(ACC_HEAD, &types, true);
        let (vals, grads) = self.buffers(f);
        let param = |i| f.get_nth_param(i).unwrap();
        let guard = param(3).into_pointer_value();
        let sample = param(2).into_pointer_value();
        let rows = self.rows(dot, param(4), param(5))?;
        let from_biases = self.builder.build_int_compare(
            IntPredicate::NE,
            param(6).into_int_value(),
            i64t.const_zero(),
            "from_biases",
        )?;
        let frame = Frame {
            vals,
            grads,
            scratch: self.value_scratch(0)?,
            pass: Pass::Stage {
                sample,
                ahead: Some(param(7).into_pointer_value()),
            },
        };
        let group = nest.lanes.forward().expect("a split nest runs in lanes");
        self.in_groups(nest, group, false, |this, reps| {
            let biases = this.load_first::<VectorValue>(vals, dot.sum.first, reps)?;
            let sums = this.load_first::<VectorValue>(vals, dot.sum.slot, reps)?;
            let starts = biases
                .iter()
                .zip(&sums)
                .map(|(&b, &s)| {
                    let start = this.builder.build_select(from_biases, b, s, "start")?;
                    Ok(start.into_vector_value())
                })
                .collect::<Emit<Vec<_>>>()?;
            let sums = this.dot_rows_forward(frame, dot, reps, (skip, guard), rows, &starts)?;
            this.store_first(vals, dot.sum.slot, reps, &sums)
        })?;
        self.builder.build_return(None)?;
        Ok(())
    }

    fn acc_rest(&self, forward: &[Part<'ctx>], backward: &[Part<'ctx>]) -> Emit<()> {
        let ptr = self.context.ptr_type(Default::default());
        let zero = self.context.i64_type().const_zero();
        let rest = |backward| self.accumulate_function(ACC_REST, backward, true);
        let (forward0, backward0) = (rest(false)?, rest(true)?);
        let f = self.begin_function(ACC_REST, &[ptr.into(), ptr.into()], true);
        let (vals, grads) = self.buffers(f);
        let param = |i| f.get_nth_param(i).unwrap().into_pointer_value();
        let (sample, loss) = (param(2), param(3));
        // (No guard word: the only skipping in function 0 is the dot's, left out.)
        let guard = ptr.const_null();
        let train = self.plan.step.as_ref().and_then(|s| s.train.as_ref());
        self.copy_other_inputs(train.expect("a split dot is train's"), vals, sample)?;
        self.run_parts(forward, 0, Some(forward0), vals, grads, guard)?;
        self.store_loss(vals, loss, zero)?;
        self.run_parts(
            backward,
            backward.len() - 2,
            Some(backward0),
            vals,
            grads,
            guard,
        )?;
        self.builder.build_return(None)?;
        Ok(())
    }

    /// `acc_tail(vals, grads, samples, m, first, end, sums_grads, outs, chunk)`: row by row
    /// over `first..end`, each chunk's (`chunk` samples of the `m <= 64` side by side at
    /// `samples`) weight gradients from 0, in registers, stored once into that chunk's
    /// buffer (`outs[c]`): no buffer to zero, no gradient read back per sample. A sample's
    /// term is skipped where its input is 0 and its sums' gradients (`sums_grads`, a
    /// sample's after another) are finite: then it is a signed 0 added to a sum from +0,
    /// which changes nothing. Which samples a row takes is a mask of `m` bits per row,
    /// made first; a weight's terms come sample by sample in order, as `accumulate` adds
    /// them.
    fn acc_tail(&self, nest: &Nest, dot: &DotLoop, skip: &ZeroSkip) -> Emit<()> {
        let (ptr, i64t) = (
            self.context.ptr_type(Default::default()),
            self.context.i64_type(),
        );
        let types = [
            ptr.into(),
            i64t.into(),
            i64t.into(),
            i64t.into(),
            ptr.into(),
            ptr.into(),
            i64t.into(),
        ];
        let f = self.begin_function(ACC_TAIL, &types, true);
        let (vals, grads) = self.buffers(f);
        let param = |i| f.get_nth_param(i).unwrap();
        let samples = param(2).into_pointer_value();
        let m = param(3).into_int_value();
        let rows = self.rows(dot, param(4), param(5))?;
        let sums_grads = param(6).into_pointer_value();
        let outs = param(7).into_pointer_value();
        let chunk = param(8).into_int_value();
        let count = u64::from(nest.count);
        let masks = self.sample_masks(dot, skip, (samples, m), rows, (sums_grads, count))?;
        let map = &dot.products;
        let weight = map.args[1 - skip.input];
        let sums = self.plan.buffers.affine(dot.sum.slot);
        // A sample's sums' gradients: `sums`' addresses from the sample's first.
        let sums = Affine { base: 0, ..sums };
        let width = self.tape.num_inputs() as u64;
        let one = i64t.const_int(1, false);
        let low = self.builder.build_left_shift(one, chunk, "")?;
        let low = self.builder.build_int_sub(low, one, "low")?;
        let chunks = self.builder.build_int_add(m, chunk, "")?;
        let chunks = self.builder.build_int_sub(chunks, one, "")?;
        let chunks = self
            .builder
            .build_int_unsigned_div(chunks, chunk, "chunks")?;
        let group = nest.lanes.backward().expect("a split nest runs in lanes");
        self.in_groups(nest, group, true, |this, reps| {
            this.counted_loop(rows.count, &[], |this, k, _| {
                let t = this.builder.build_int_add(rows.first, k, "t")?;
                let mask = this
                    .builder
                    .build_load(i64t, this.mask_ptr(masks, t)?, "mask")?;
                let mask = mask.into_int_value();
                this.counted_loop(chunks, &[], |this, c, _| {
                    let from = this.builder.build_int_mul(c, chunk, "from")?;
                    let bits = this.builder.build_right_shift(mask, from, false, "")?;
                    let bits = this.builder.build_and(bits, low, "bits")?;
                    let zeros = reps
                        .vectors
                        .iter()
                        .map(|&lanes| VectorValue::ty(this, lanes).const_zero())
                        .collect::<Vec<_>>();
                    let sums_of_chunk = this.for_each_bit(bits, &zeros, |this, b, accs| {
                        let s = this.builder.build_int_add(from, b, "s")?;
                        let sample = this.element_at(samples, s, width)?;
                        let gs = this.element_at(sums_grads, s, count)?;
                        let gs = reps
                            .vectors
                            .iter()
                            .map(|&lanes| {
                                let js = this.lane_js(reps, lanes)?;
                                let at = this.address_ptr(gs, sums, i64t.const_zero(), &js)?;
                                this.load_vector(at, VectorValue::ty(this, lanes))
                            })
                            .collect::<Emit<Vec<_>>>()?;
                        let frame = Frame {
                            vals,
                            grads,
                            scratch: super::local::Scratch::Backward(None),
                            pass: Pass::Stage {
                                sample,
                                ahead: None,
                            },
                        };
                        let g_products = this.fresh(&gs)?;
                        let locals = this.products_locals(frame, map, t, reps, &g_products)?;
                        accs.iter()
                            .zip(&locals)
                            .map(|(&acc, local)| {
                                let term = local[1 - skip.input];
                                this.builder.build_float_add(acc, term, "acc")
                            })
                            .collect()
                    })?;
                    let out = this.chunk_buffer(outs, c)?;
                    for (&lanes, &sum) in reps.vectors.iter().zip(&sums_of_chunk) {
                        VectorValue::store(this, out, weight, t, reps, lanes, sum)?;
                    }
                    Ok(Vec::new())
                })?;
                Ok(Vec::new())
            })?;
            Ok(())
        })?;
        self.builder.build_return(None)?;
        Ok(())
    }

    /// Per row `t` of `rows`, a mask of the `m` samples (at `samples`, side by side) whose
    /// term the weights' gradients take (`masks[t]`, bit `s` for sample `s`): those whose
    /// input `t` is not 0, and every row of a sample whose sums' gradients (at `sums_grads`)
    /// are not all finite (there `0 * g` is NaN). Rows a chunk of 8 inputs at a time (a
    /// line), then one at a time.
    fn sample_masks(
        &self,
        dot: &DotLoop,
        skip: &ZeroSkip,
        (samples, m): (PointerValue<'ctx>, IntValue<'ctx>),
        rows: Rows<'ctx>,
        (sums_grads, count): (PointerValue<'ctx>, u64),
    ) -> Emit<PointerValue<'ctx>> {
        const CHUNK: u32 = 8;
        let i64t = self.context.i64_type();
        let masks = self.entry_alloca(i64t.array_type(rows.len).into(), "masks")?;
        self.counted_loop(rows.count, &[], |this, k, _| {
            let t = this.builder.build_int_add(rows.first, k, "t")?;
            this.builder
                .build_store(this.mask_ptr(masks, t)?, i64t.const_zero())?;
            Ok(Vec::new())
        })?;
        let input = self.sample_affine(dot.products.args[skip.input]);
        let width = self.tape.num_inputs() as u64;
        let chunk = i64t.const_int(CHUNK.into(), false);
        let vectorized = self.builder.build_int_unsigned_div(rows.count, chunk, "")?;
        let done = self.builder.build_int_mul(vectorized, chunk, "")?;
        let rest = self.builder.build_int_sub(rows.count, done, "rest")?;
        self.counted_loop(m, &[], |this, s, _| {
            let sample = this.element_at(samples, s, width)?;
            let gs = this.element_at(sums_grads, s, count)?;
            let gs = this.load_vector(gs, this.f64_type.vec_type(count as u32))?;
            let finite = this.all_finite(&[gs])?;
            let bit = this
                .builder
                .build_left_shift(i64t.const_int(1, false), s, "bit")?;
            let every = this
                .builder
                .build_select(finite, i64t.const_zero(), bit, "every")?;
            // Rows `first..first + width` of this sample marked.
            let mark = |this: &Self, first: IntValue<'ctx>, width: u32| -> Emit<()> {
                let ty = this.f64_type.vec_type(width);
                let x = this.load_vector(this.address_ptr(sample, input, first, &[])?, ty)?;
                let test = this.builder.build_float_compare(
                    FloatPredicate::UNE,
                    x,
                    ty.const_zero(),
                    "",
                )?;
                let ints = i64t.vec_type(width);
                let bits = this.broadcast(bit.into(), ints)?;
                let every = this.broadcast(every, ints)?;
                let marks = this.builder.build_select(test, bits, every, "")?;
                let at = this.mask_ptr(masks, first)?;
                let before = this.load_ints(at, ints)?;
                let after = this
                    .builder
                    .build_or(before, marks.into_vector_value(), "")?;
                let _ = this.builder.build_store(at, after)?.set_alignment(8);
                Ok(())
            };
            this.counted_loop(vectorized, &[], |this, v, _| {
                let offset = this.builder.build_int_mul(v, chunk, "")?;
                mark(
                    this,
                    this.builder.build_int_add(rows.first, offset, "t")?,
                    CHUNK,
                )?;
                Ok(Vec::new())
            })?;
            let first = this.builder.build_int_add(rows.first, done, "")?;
            this.counted_loop(rest, &[], |this, u, _| {
                mark(this, this.builder.build_int_add(first, u, "t")?, 1)?;
                Ok(Vec::new())
            })?;
            Ok(Vec::new())
        })?;
        Ok(masks)
    }

    /// `nest`'s lane groups of `group` repetitions, each running `body`, as loop code.
    fn in_groups(
        &self,
        nest: &Nest,
        group: u32,
        descending: bool,
        mut body: impl FnMut(&Self, &Reps<'ctx>) -> Emit<()>,
    ) -> Emit<()> {
        self.loop_code(|| {
            self.for_each_group(nest.count, group, descending, &Reps::top(), &mut body)
        })
    }

    /// `&xs[s * width]`, for `xs` (of `f64`) long enough.
    fn element_at(
        &self,
        xs: PointerValue<'ctx>,
        s: IntValue<'ctx>,
        width: u64,
    ) -> Emit<PointerValue<'ctx>> {
        let i64t = self.context.i64_type();
        let at = self
            .builder
            .build_int_mul(s, i64t.const_int(width, false), "at")?;
        // SAFETY: (of the GEP, not of Rust code) the callers index samples `s < m` of
        // arrays of `m` whole samples (`NativeReplica`'s `tail` checks their lengths).
        Ok(unsafe {
            self.builder
                .build_in_bounds_gep(self.f64_type, xs, &[at], "")?
        })
    }

    /// `outs[c]`: the pointer to chunk `c`'s gradients.
    fn chunk_buffer(
        &self,
        outs: PointerValue<'ctx>,
        c: IntValue<'ctx>,
    ) -> Emit<PointerValue<'ctx>> {
        let ptr = self.context.ptr_type(Default::default());
        // SAFETY: (of the GEP) `c` is below the number of chunks, `outs`' length.
        let at = unsafe { self.builder.build_in_bounds_gep(ptr, outs, &[c], "")? };
        Ok(self
            .builder
            .build_load(ptr, at, "out")?
            .into_pointer_value())
    }

    /// `&masks[t]` for the row masks of [`Emitter::sample_masks`].
    fn mask_ptr(&self, masks: PointerValue<'ctx>, t: IntValue<'ctx>) -> Emit<PointerValue<'ctx>> {
        let i64t = self.context.i64_type();
        // SAFETY: (of the GEP) `t` is a row of the dot, below the array's length (its rows).
        Ok(unsafe {
            self.builder
                .build_in_bounds_gep(i64t, masks, &[t], "mask")?
        })
    }

    /// A vector of `ty` at `at`, aligned as its `i64`s are.
    fn load_ints(&self, at: PointerValue<'ctx>, ty: VectorType<'ctx>) -> Emit<VectorValue<'ctx>> {
        let v = self.builder.build_load(ty, at, "")?;
        if let Some(inst) = v.as_instruction_value() {
            let _ = inst.set_alignment(8);
        }
        Ok(v.into_vector_value())
    }

    /// A loop over the set bits `b` of `bits` (from the lowest) carrying `carried`:
    /// `body(b, current)` returns the next values; the values after the last bit.
    fn for_each_bit(
        &self,
        bits: IntValue<'ctx>,
        carried: &[VectorValue<'ctx>],
        mut body: impl FnMut(
            &Self,
            IntValue<'ctx>,
            &[VectorValue<'ctx>],
        ) -> Emit<Vec<VectorValue<'ctx>>>,
    ) -> Emit<Vec<VectorValue<'ctx>>> {
        let i64t = self.context.i64_type();
        let f = self.current_function();
        let entry = self.block();
        let (looped, done) = (
            self.context.append_basic_block(f, "bits"),
            self.context.append_basic_block(f, "bits_done"),
        );
        let zero = i64t.const_zero();
        let none = self
            .builder
            .build_int_compare(IntPredicate::EQ, bits, zero, "none")?;
        self.builder.build_conditional_branch(none, done, looped)?;

        self.builder.position_at_end(looped);
        let left = self.builder.build_phi(i64t, "left")?;
        let phis = carried
            .iter()
            .map(|c| self.builder.build_phi(c.get_type(), "carried"))
            .collect::<Emit<Vec<_>>>()?;
        let current: Vec<_> = phis
            .iter()
            .map(|p| p.as_basic_value().into_vector_value())
            .collect();
        let left_value = left.as_basic_value().into_int_value();
        let cttz = self.intrinsic("llvm.cttz", &[i64t.into()])?;
        let poison_at_zero = self.context.bool_type().const_int(1, false);
        let b = self
            .builder
            .build_call(cttz, &[left_value.into(), poison_at_zero.into()], "b")?
            .try_as_basic_value()
            .basic()
            .ok_or(inkwell::builder::BuilderError::UnsetPosition)?
            .into_int_value();
        let next = body(self, b, &current)?;
        let less = self
            .builder
            .build_int_sub(left_value, i64t.const_int(1, false), "")?;
        let rest = self.builder.build_and(left_value, less, "rest")?;
        let more = self
            .builder
            .build_int_compare(IntPredicate::NE, rest, zero, "more")?;
        let latch = self.block();
        self.builder.build_conditional_branch(more, looped, done)?;
        left.add_incoming(&[(&bits, entry), (&rest, latch)]);
        for ((phi, init), next) in phis.iter().zip(carried).zip(&next) {
            phi.add_incoming(&[(init, entry), (next, latch)]);
        }

        self.builder.position_at_end(done);
        carried
            .iter()
            .zip(&next)
            .map(|(init, next)| {
                let phi = self.builder.build_phi(init.get_type(), "after")?;
                phi.add_incoming(&[(init, entry), (next, latch)]);
                Ok(phi.as_basic_value().into_vector_value())
            })
            .collect()
    }

    /// Steps `first..end` of `dot` as [`Rows`] (the caller passes `first <= end <= len`).
    fn rows(
        &self,
        dot: &DotLoop,
        first: BasicValueEnum<'ctx>,
        end: BasicValueEnum<'ctx>,
    ) -> Emit<Rows<'ctx>> {
        let first = first.into_int_value();
        let count = self
            .builder
            .build_int_sub(end.into_int_value(), first, "count")?;
        Ok(Rows {
            first,
            count,
            len: dot.products.len,
        })
    }
}
