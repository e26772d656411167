//! A minibatch's sample in stages, `train`'s dot cut by its rows ([`crate::plan::first_layer::split`]),
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
//! - `acc_tail(vals, grads, samples, m, first, end, sums_grads, chunk, masks)`: the
//!   minibatch's gradients of the weights of steps `first..end` (`m` samples), row by row:
//!   each chunk's sum from 0 and the chunks' sums in chunk order, in registers, stored once.
//!
//! Each skips zero inputs as `accumulate` does (`emit/sparse.rs`), within its rows; head and
//! tail read the inputs from the sample, as `train` does, not from the buffer.

use inkwell::types::VectorType;
use inkwell::values::{BasicValue, BasicValueEnum, IntValue, PointerValue, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};

use super::super::lane_io::{LaneIo, Reps};
use super::super::{Emit, Emitter, Frame, Part, Pass};
use super::sparse::Rows;
use crate::jit::abi::{ACC_HEAD, ACC_REST, ACC_TAIL};
use crate::passes::schedule::{Affine, DotLoop, Nest};
use crate::plan::first_layer::split::split_nest;
use crate::plan::ZeroSkip;

impl<'ctx> Emitter<'ctx, '_> {
    /// The three stages, where the plan splits `train`'s dot; `forward` and `backward` are
    /// `accumulate`'s parts.
    pub(in crate::jit::emit) fn split_entries(
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
        let i64t = self.context.i64_type();
        let f = self.begin_entry(&ACC_HEAD, true);
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
        let lanes = self.plan.nest(nest).lanes;
        let group = lanes.forward().expect("a split nest runs in lanes");
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
        let rest = |backward| self.accumulate_function(ACC_REST.name, backward, true);
        let (forward0, backward0) = (rest(false)?, rest(true)?);
        let f = self.begin_entry(&ACC_REST, true);
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

    /// `acc_tail(vals, grads, samples, m, first, end, sums_grads, chunk, masks)`: the
    /// minibatch's gradients of the weights of rows `first..end` into `grads`, row by row:
    /// each chunk's (`chunk` samples, a power of 2 up to 64, of the `m` side by side at
    /// `samples`) from 0 in registers, the chunks' sums added in chunk order
    /// (`((c0 + c1) + c2) + ...`, as `crate::minibatch` adds every other param's), stored
    /// once: no buffer to zero or read back per sample. A sample's term is skipped where its
    /// input is 0 and its sums' gradients (`sums_grads`, a sample's after another) are
    /// finite: then it is a signed 0 added to a sum from +0, which changes nothing. Which
    /// samples a row takes is a mask of `m` bits per row (`masks`, the caller's scratch of
    /// `ceil(m / 64)` words per row of the dot), made first; a weight's terms come sample by
    /// sample in order, as `accumulate` adds them. Every row takes one word's samples before
    /// the next word's (their sums' gradients stay in L1 meanwhile), each row's sum carried
    /// over in `grads`: at 256 samples 1.74-1.89 us per sample on one thread against
    /// 1.85-1.99 with every word per row.
    fn acc_tail(&self, nest: &Nest, dot: &DotLoop, skip: &ZeroSkip) -> Emit<()> {
        let i64t = self.context.i64_type();
        let f = self.begin_entry(&ACC_TAIL, true);
        let (vals, grads) = self.buffers(f);
        let param = |i| f.get_nth_param(i).unwrap();
        let samples = param(2).into_pointer_value();
        let m = param(3).into_int_value();
        let rows = self.rows(dot, param(4), param(5))?;
        let sums_grads = param(6).into_pointer_value();
        let chunk = param(7).into_int_value();
        let masks = Masks {
            at: param(8).into_pointer_value(),
            words: self.divide_up(m, i64t.const_int(64, false))?,
            rows: dot.products.len,
        };
        let count = u64::from(nest.count);
        self.sample_masks(dot, skip, (samples, m), rows, (sums_grads, count), masks)?;
        let map = &dot.products;
        let weight = map.args[1 - skip.input];
        let sums = self.plan.buffers.affine(dot.sum.slot);
        // A sample's sums' gradients: `sums`' addresses from the sample's first.
        let sums = Affine { base: 0, ..sums };
        let width = self.tape.num_inputs() as u64;
        let all = i64t.const_all_ones();
        let low = self
            .builder
            .build_int_sub(i64t.const_int(64, false), chunk, "")?;
        let low = self.builder.build_right_shift(all, low, false, "low")?;
        let chunks = self.divide_up(m, chunk)?;
        let sixty_four = i64t.const_int(64, false);
        let per_word = self
            .builder
            .build_int_unsigned_div(sixty_four, chunk, "per_word")?;
        let one = i64t.const_int(1, false);
        let lanes = self.plan.nest(nest).lanes;
        let group = lanes.backward().expect("a split nest runs in lanes");
        // The chunks of mask word `word` (64 samples, whose sums' gradients stay in L1 while
        // every row takes them), row by row, each row's sum continued from the last word's
        // (in `grads`) unless `word` is the first.
        let run_word = |this: &Self, word: IntValue<'ctx>, continued: bool| {
            this.in_groups(nest, group, true, |this, reps| {
                // Chunk `c`'s sum of row `t`'s terms, from 0.
                let chunk_sum = |this: &Self, t: IntValue<'ctx>, c: IntValue<'ctx>| {
                    let from = this.builder.build_int_mul(c, chunk, "from")?;
                    let word = this.builder.build_right_shift(
                        from,
                        i64t.const_int(6, false),
                        false,
                        "",
                    )?;
                    let shift = this
                        .builder
                        .build_and(from, i64t.const_int(63, false), "")?;
                    let mask = this
                        .builder
                        .build_load(i64t, masks.ptr(this, t, word)?, "mask")?;
                    let bits =
                        this.builder
                            .build_right_shift(mask.into_int_value(), shift, false, "")?;
                    let bits = this.builder.build_and(bits, low, "bits")?;
                    let zeros = reps
                        .vectors
                        .iter()
                        .map(|&lanes| VectorValue::ty(this, lanes).const_zero())
                        .collect::<Vec<_>>();
                    this.for_each_bit(bits, &zeros, |this, b, accs| {
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
                            scratch: super::super::local::Scratch::Backward(None),
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
                    })
                };
                this.counted_loop(rows.count, &[], |this, k, _| {
                    let t = this.builder.build_int_add(rows.first, k, "t")?;
                    let c0 = this.builder.build_int_mul(word, per_word, "c0")?;
                    let mut first = chunk_sum(this, t, c0)?;
                    if continued {
                        first = reps
                            .vectors
                            .iter()
                            .zip(&first)
                            .map(|(&lanes, &sum)| {
                                let before =
                                    VectorValue::load(this, grads, weight, t, reps, lanes)?;
                                this.builder.build_float_add(before, sum, "sum")
                            })
                            .collect::<Emit<Vec<_>>>()?;
                    }
                    let end = this.builder.build_int_add(c0, per_word, "")?;
                    let within =
                        this.builder
                            .build_int_compare(IntPredicate::ULT, end, chunks, "")?;
                    let end = this
                        .builder
                        .build_select(within, end, chunks, "end")?
                        .into_int_value();
                    let more = this.builder.build_int_sub(end, c0, "")?;
                    let more = this.builder.build_int_sub(more, one, "more")?;
                    let sum = this.counted_loop(more, &first, |this, c, sum| {
                        let c = this.builder.build_int_add(c0, c, "")?;
                        let c = this.builder.build_int_add(c, one, "c")?;
                        let next = chunk_sum(this, t, c)?;
                        sum.iter()
                            .zip(&next)
                            .map(|(&a, &b)| this.builder.build_float_add(a, b, "sum"))
                            .collect()
                    })?;
                    for (&lanes, &g) in reps.vectors.iter().zip(&sum) {
                        VectorValue::store(this, grads, weight, t, reps, lanes, g)?;
                    }
                    Ok(Vec::new())
                })?;
                Ok(())
            })
        };
        run_word(self, i64t.const_zero(), false)?;
        let words = self.builder.build_int_sub(masks.words, one, "")?;
        self.counted_loop(words, &[], |this, w, _| {
            run_word(this, this.builder.build_int_add(w, one, "word")?, true)?;
            Ok(Vec::new())
        })?;
        self.builder.build_return(None)?;
        Ok(())
    }

    /// Into `masks`, per row `t` of `rows`, the `m` samples (at `samples`, side by side)
    /// whose term the weights' gradients take (bit `s % 64` of word `s / 64` for sample
    /// `s`): those whose input `t` is not 0, and every row of a sample whose sums' gradients
    /// (at `sums_grads`) are not all finite (there `0 * g` is NaN). Rows a chunk of 8 inputs
    /// at a time ([`Emitter::in_lines`]).
    fn sample_masks(
        &self,
        dot: &DotLoop,
        skip: &ZeroSkip,
        (samples, m): (PointerValue<'ctx>, IntValue<'ctx>),
        rows: Rows<'ctx>,
        (sums_grads, count): (PointerValue<'ctx>, u64),
        masks: Masks<'ctx>,
    ) -> Emit<()> {
        let i64t = self.context.i64_type();
        self.counted_loop(rows.count, &[], |this, k, _| {
            let t = this.builder.build_int_add(rows.first, k, "t")?;
            this.counted_loop(masks.words, &[], |this, word, _| {
                this.builder
                    .build_store(masks.ptr(this, t, word)?, i64t.const_zero())?;
                Ok(Vec::new())
            })?;
            Ok(Vec::new())
        })?;
        let input = self.sample_affine(dot.products.args[skip.input]);
        let width = self.tape.num_inputs() as u64;
        self.counted_loop(m, &[], |this, s, _| {
            let sample = this.element_at(samples, s, width)?;
            let gs = this.element_at(sums_grads, s, count)?;
            let gs = this.load_vector(gs, this.f64_type().vec_type(count as u32))?;
            let finite = this.all_finite(&[gs])?;
            let word =
                this.builder
                    .build_right_shift(s, i64t.const_int(6, false), false, "word")?;
            let at_bit = this.builder.build_and(s, i64t.const_int(63, false), "")?;
            let one = i64t.const_int(1, false);
            let bit = this.builder.build_left_shift(one, at_bit, "bit")?;
            let every = this
                .builder
                .build_select(finite, i64t.const_zero(), bit, "every")?;
            // Rows `first..first + width` of this sample marked, a line of inputs at a time.
            this.in_lines(rows, true, |this, first, width| {
                let ty = this.f64_type().vec_type(width);
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
                let at = masks.ptr(this, first, word)?;
                let before = this.load_ints(at, ints)?;
                let after = this
                    .builder
                    .build_or(before, marks.into_vector_value(), "")?;
                let _ = this.builder.build_store(at, after)?.set_alignment(8);
                Ok(())
            })?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// `ceil(n / by)` for `by` at least 1.
    fn divide_up(&self, n: IntValue<'ctx>, by: IntValue<'ctx>) -> Emit<IntValue<'ctx>> {
        let one = self.context.i64_type().const_int(1, false);
        let up = self.builder.build_int_add(n, by, "")?;
        let up = self.builder.build_int_sub(up, one, "")?;
        self.builder.build_int_unsigned_div(up, by, "")
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
                .build_in_bounds_gep(self.f64_type(), xs, &[at], "")?
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
        self.join(&[(carried, entry), (&next, latch)])
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

/// [`Emitter::sample_masks`]' masks: per word (64 samples) a row of words, one per step of the
/// dot (`rows`), the caller's scratch.
#[derive(Clone, Copy)]
struct Masks<'ctx> {
    at: PointerValue<'ctx>,
    words: IntValue<'ctx>,
    rows: u32,
}

impl<'ctx> Masks<'ctx> {
    /// `&masks[word * rows + t]`.
    fn ptr(
        self,
        e: &Emitter<'ctx, '_>,
        t: IntValue<'ctx>,
        word: IntValue<'ctx>,
    ) -> Emit<PointerValue<'ctx>> {
        let i64t = e.context.i64_type();
        let rows = i64t.const_int(self.rows.into(), false);
        let row = e.builder.build_int_mul(word, rows, "")?;
        let at = e.builder.build_int_add(row, t, "")?;
        // SAFETY: (of the GEP) `t` is a step of the dot and `word` below `words`: inside the
        // caller's scratch of `words * rows` (`NativeReplica`'s `tail` checks its length).
        Ok(unsafe {
            e.builder
                .build_in_bounds_gep(i64t, self.at, &[at], "mask")?
        })
    }
}
