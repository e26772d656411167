//! `train`'s merged dot, skipping the steps whose inputs are exactly 0 in both samples: the
//! plan's [`ZeroSkip`] says why that is exact and which cases the code checks, here.
//!
//! ```text
//! if guard, all gradients finite, lr not negative and not waiting:
//!     steps = the t whose input is not 0 in this sample or the next
//!     if steps are few enough (or always):
//!         for t in steps: the merged step    (update, next sample's products; `w - lr * g`
//!                                             where no weight is -0, else `w - lr * (0 + g)`)
//!         if a sum is -0: the sums again, every step, from the updated weights
//!         goto done
//! for every t: the merged step         (waiting: one sample less; too many steps: wait 8)
//! done: guard = every sum is finite, and how long to wait
//! ```
//!
//! The guard word's [`GUARD_FINITE`] bit is the guard; [`GUARD_NO_NEGATIVE_ZERO`] says no
//! weight is -0 (set by `train`'s caller, kept by `train`, which makes no -0 weight); the
//! bits above them count the samples still to run dense before looking at the inputs again.
//!
//! The last line keeps the guard true: every weight a loop updates, it then multiplies by
//! the next sample's input (finite, maybe 0), so a weight that is not finite makes its sum
//! NaN or infinite; the weights the loop skips did not change. A sum that overflows clears
//! the guard too, which only costs speed; the dense loop sets it again once every sum is
//! finite.
//!
//! `accumulate` (a minibatch's chunk) skips the same dot's zero inputs in its forward
//! ([`Emitter::sparse_dot_forward`]: under the guard word's bit 0, recomputed by its caller
//! when params change, with the -0 check) and its backward ([`Emitter::sparse_dot_backward`]:
//! where the products' gradients are finite, into gradients it zeroed itself).

use std::num::NonZeroU32;

use inkwell::basic_block::BasicBlock;
use inkwell::types::VectorType;
use inkwell::values::{IntValue, PointerValue, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};

use super::super::lane_io::Reps;
use super::super::{Emit, Emitter, Frame, MergedDot, Pass};
use crate::passes::schedule::{Affine, DotLoop};
use crate::plan::{ZeroSkip, GUARD_FINITE, GUARD_NO_NEGATIVE_ZERO, GUARD_WAIT_SHIFT};

/// How many inputs the list of steps is built from at a time: the lanes of one vector of
/// `i32` step numbers in a 256-bit register (the code's shape, not a tuning).
const CHUNK: u32 = 8;

impl<'ctx> Emitter<'ctx, '_> {
    /// The sums of `train`'s merged dot `m` (from `biases`), skipping zero inputs as `skip`
    /// says (see the module's outline).
    pub(super) fn sparse_merged_dot(
        &self,
        m: &MergedDot<'_, 'ctx, VectorValue<'ctx>>,
        biases: &[VectorValue<'ctx>],
        skip: &ZeroSkip,
    ) -> Emit<Vec<VectorValue<'ctx>>> {
        let i64t = self.context.i64_type();
        let zero = i64t.const_zero();
        let guard = m.samples.guard;
        let word = self.builder.build_load(i64t, guard, "guard")?;
        let word = word.into_int_value();
        let one = i64t.const_int(1, false);
        let bit = |mask: i64, name| -> Emit<IntValue<'ctx>> {
            let mask = i64t.const_int(mask as u64, false);
            let bit = self.builder.build_and(word, mask, "")?;
            self.builder
                .build_int_compare(IntPredicate::NE, bit, zero, name)
        };
        let set = bit(GUARD_FINITE, "finite_weights")?;
        let plain = bit(GUARD_NO_NEGATIVE_ZERO, "plain_updates")?;
        let shift = i64t.const_int(GUARD_WAIT_SHIFT, false);
        let wait = self.builder.build_right_shift(word, shift, false, "wait")?;
        let finite = self.all_finite(&m.g_products)?;
        let lr = m.frame.lr().expect("train's backward has a learning rate");
        let lr_bits = self.builder.build_bit_cast(lr, i64t, "")?.into_int_value();
        let lr_not_negative =
            self.builder
                .build_int_compare(IntPredicate::SGE, lr_bits, zero, "")?;
        let armed = self.builder.build_and(set, finite, "")?;
        let armed = self.builder.build_and(armed, lr_not_negative, "armed")?;
        let waiting = self
            .builder
            .build_int_compare(IntPredicate::NE, wait, zero, "")?;
        let waited = self.builder.build_int_sub(wait, one, "")?;
        let try_list = self.builder.build_not(waiting, "")?;
        let try_list = self.builder.build_and(armed, try_list, "try_list")?;
        // Armed but waiting: one sample less to wait.
        let next_wait = self
            .builder
            .build_select(armed, waited, zero, "")?
            .into_int_value();
        let f = self.current_function();
        let block = |name| self.context.append_basic_block(f, name);
        let (list, sparse, redo, dense, done) = (
            block("list"),
            block("sparse"),
            block("redo"),
            block("dense"),
            block("done"),
        );
        let entry = self.block();
        self.builder
            .build_conditional_branch(try_list, list, dense)?;

        self.builder.position_at_end(list);
        let len = m.dot.products.len;
        let input = self.sample_affine(m.dot.products.args[skip.input]);
        let inputs = [(m.samples.this, input), (m.samples.next, input)];
        let rows = self.every_row(m.dot);
        let (steps, n) = self.nonzero_steps(rows, &inputs, None)?;
        // A sample too dense to skip makes the next `dense_wait` run dense without looking.
        self.branch_on_density(n, rows, skip, sparse, dense)?;
        let list_end = self.block();

        self.builder.position_at_end(sparse);
        // Without a -0 weight, in a loop of their own the updates skip the `0 +`.
        let (plain_loop, fresh_loop, looped) = (
            block("plain_updates"),
            block("fresh_updates"),
            block("skipped"),
        );
        self.builder
            .build_conditional_branch(plain, plain_loop, fresh_loop)?;
        let mut arms = Vec::new();
        for (start, m) in [(plain_loop, &m.with_plain_updates()), (fresh_loop, m)] {
            self.builder.position_at_end(start);
            // (The list walked once per group of vectors, the first pass prefetching.)
            let mut sums = Vec::with_capacity(biases.len());
            let per_pass = self.plan.tactics.merged_vectors_per_pass.max(1);
            for first in (0..biases.len()).step_by(per_pass) {
                let group = first..(first + per_pass).min(biases.len());
                let columns = m.columns(group.clone());
                sums.extend(self.counted_loop(n, &biases[group], |this, k, sums| {
                    if first == 0 {
                        this.prefetch_sample_line(m.samples.ahead, k)?;
                    }
                    let t = this.load_step(steps, k)?;
                    this.merged_step(&columns, t, sums)
                })?);
            }
            arms.push((sums, self.block()));
            self.builder.build_unconditional_branch(looped)?;
        }
        self.builder.position_at_end(looped);
        let arms: Vec<_> = arms.iter().map(|(s, b)| (&s[..], *b)).collect();
        let skipped = self.join(&arms)?;
        let negative_zero = self.any_negative_zero(&skipped)?;
        let sparse_end = self.block();
        self.builder
            .build_conditional_branch(negative_zero, redo, done)?;

        self.builder.position_at_end(redo);
        let redone = self.emit_loop(len, false, biases, |this, t, sums| {
            this.merged_forward_step(m, t, sums)
        })?;
        let redo_end = self.block();
        self.builder.build_unconditional_branch(done)?;

        self.builder.position_at_end(dense);
        let wait_phi = self.builder.build_phi(i64t, "wait")?;
        wait_phi.add_incoming(&[(&next_wait, entry)]);
        if !skip.always {
            wait_phi.add_incoming(&[(
                &i64t.const_int(self.plan.tactics.dense_wait, false),
                list_end,
            )]);
        }
        let every = self.emit_loop(len, false, biases, |this, t, sums| {
            this.prefetch_sample_line(m.samples.ahead, t)?;
            this.merged_step(m, t, sums)
        })?;
        let dense_end = self.block();
        self.builder.build_unconditional_branch(done)?;

        self.builder.position_at_end(done);
        let sums = self.join(&[
            (&skipped, sparse_end),
            (&redone, redo_end),
            (&every, dense_end),
        ])?;
        let wait = self.builder.build_phi(i64t, "wait")?;
        wait.add_incoming(&[
            (&zero, sparse_end),
            (&zero, redo_end),
            (&wait_phi.as_basic_value().into_int_value(), dense_end),
        ]);
        let finite = self.all_finite(&sums)?;
        // 1 or 0: GUARD_FINITE is bit 0.
        let finite = self.builder.build_int_z_extend(finite, i64t, "")?;
        let wait = wait.as_basic_value().into_int_value();
        let wait = self.builder.build_left_shift(wait, shift, "")?;
        // `train` makes no -0 weight: the bit stays as it was.
        let no_negative_zero = i64t.const_int(GUARD_NO_NEGATIVE_ZERO as u64, false);
        let kept = self.builder.build_and(word, no_negative_zero, "")?;
        let word = self.builder.build_or(finite, wait, "")?;
        let word = self.builder.build_or(word, kept, "guard")?;
        self.builder.build_store(guard, word)?;
        Ok(sums)
    }

    /// The steps `t` in `0..len` (ascending, as `i32`s in a stack array) where some input
    /// `buf[a(t)]` of `inputs` (`a` in addresses) is not 0 (NaN counts as not 0), and how many
    /// there are. Inputs at unit stride are tested [`CHUNK`] at a time: where the host packs
    /// chosen lanes in a register (AVX-512 VL), a chunk's kept steps are packed so and stored
    /// at the list's end as one vector ([`Emitter::append_compressed`]); elsewhere a chunk of
    /// zeros is skipped by one branch, and every step of the others stored at the list's end,
    /// the count moving past it only if the step is kept: no branch to mispredict. Never a
    /// compress-store (`llvm.masked.compressstore` is one `vpcompressd` to memory where
    /// AVX-512 has it, which Zen 4 runs so slowly that building the list took half of
    /// `train`'s time; the register form is quick).
    fn nonzero_steps(
        &self,
        rows: Rows<'ctx>,
        inputs: &[(PointerValue<'ctx>, Affine)],
        ahead: Option<PointerValue<'ctx>>,
    ) -> Emit<(PointerValue<'ctx>, IntValue<'ctx>)> {
        let (i32t, i64t) = (self.context.i32_type(), self.context.i64_type());
        let steps = self.entry_alloca(i32t.array_type(rows.len).into(), "steps")?;
        let count = self.entry_alloca(i64t.into(), "count")?;
        self.builder.build_store(count, i64t.const_zero())?;
        let unit_stride = inputs.iter().all(|&(_, a)| a.stride == 1);
        // Steps `first..first + width`, each appended to the list if not 0 in some input.
        let append = |this: &Self, first: IntValue<'ctx>, width: u32| -> Emit<()> {
            let ty = this.f64_type().vec_type(width);
            let mut mask: Option<VectorValue<'ctx>> = None;
            for &(buf, input) in inputs {
                let x = this.load_vector(this.address_ptr(buf, input, first, &[])?, ty)?;
                let test = this.builder.build_float_compare(
                    FloatPredicate::UNE,
                    x,
                    ty.const_zero(),
                    "",
                )?;
                mask = Some(match mask {
                    Some(m) => this.builder.build_or(m, test, "")?,
                    None => test,
                });
            }
            let mask = mask.expect("at least one input");
            let first = this.builder.build_int_truncate(first, i32t, "")?;
            if width == CHUNK && this.plan.tactics.compress_steps {
                return this.append_compressed(steps, count, first, mask);
            }
            let mut n = this.builder.build_load(i64t, count, "n")?.into_int_value();
            // The mask as the bits of one integer, each lane's a shift and a mask away (an
            // element of a mask vector costs a mask-register shift and a move each).
            let int = NonZeroU32::new(width)
                .and_then(|w| this.context.custom_width_int_type(w).ok())
                .ok_or(inkwell::builder::BuilderError::UnsetPosition)?;
            let bits = this.builder.build_bit_cast(mask, int, "")?.into_int_value();
            let bits = this.builder.build_int_z_extend(bits, i64t, "bits")?;
            let one = i64t.const_int(1, false);
            // A chunk of zeros in every input (an image's border) appends nothing: one branch.
            let appended = if width > 1 {
                let f = this.current_function();
                let (append, appended) = (
                    this.context.append_basic_block(f, "append"),
                    this.context.append_basic_block(f, "appended"),
                );
                let zero = i64t.const_zero();
                let any = this
                    .builder
                    .build_int_compare(IntPredicate::NE, bits, zero, "any")?;
                this.builder
                    .build_conditional_branch(any, append, appended)?;
                this.builder.position_at_end(append);
                Some(appended)
            } else {
                None
            };
            for lane in 0..width {
                let t =
                    this.builder
                        .build_int_add(first, i32t.const_int(lane.into(), false), "t")?;
                this.builder.build_store(step_ptr(this, steps, n)?, t)?;
                let shift = i64t.const_int(lane.into(), false);
                let kept = this.builder.build_right_shift(bits, shift, false, "")?;
                let kept = this.builder.build_and(kept, one, "kept")?;
                n = this.builder.build_int_add(n, kept, "n")?;
            }
            this.builder.build_store(count, n)?;
            if let Some(appended) = appended {
                this.builder.build_unconditional_branch(appended)?;
                this.builder.position_at_end(appended);
            }
            Ok(())
        };
        self.in_lines(rows, unit_stride, |this, first, width| {
            if let (Some(ahead), CHUNK) = (ahead, width) {
                this.prefetch(this.address_ptr(ahead, inputs[0].1, first, &[])?, 3)?;
            }
            // (Past the whole lines, one input at a time: a vector of one lane, whatever
            // the stride.)
            append(this, first, width)
        })?;
        let n = self.builder.build_load(i64t, count, "n")?.into_int_value();
        Ok((steps, n))
    }

    /// `body(first, width)` over the steps `rows`: [`CHUNK`] at a time (a line of inputs at
    /// unit stride) where `lines`, then one at a time.
    pub(super) fn in_lines(
        &self,
        rows: Rows<'ctx>,
        lines: bool,
        mut body: impl FnMut(&Self, IntValue<'ctx>, u32) -> Emit<()>,
    ) -> Emit<()> {
        let i64t = self.context.i64_type();
        let chunk = i64t.const_int(CHUNK.into(), false);
        let whole = match lines {
            true => self
                .builder
                .build_int_unsigned_div(rows.count, chunk, "lines")?,
            false => i64t.const_zero(),
        };
        self.counted_loop(whole, &[], |this, c, _| {
            let offset = this.builder.build_int_mul(c, chunk, "")?;
            body(
                this,
                this.builder.build_int_add(rows.first, offset, "first")?,
                CHUNK,
            )?;
            Ok(Vec::new())
        })?;
        let done = self.builder.build_int_mul(whole, chunk, "")?;
        let rest = self.builder.build_int_sub(rows.count, done, "rest")?;
        let first = self.builder.build_int_add(rows.first, done, "")?;
        self.counted_loop(rest, &[], |this, u, _| {
            body(this, this.builder.build_int_add(first, u, "t")?, 1)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// Appends the steps `first..first + CHUNK` whose lane of `mask` is set to the list
    /// `steps` of `count` steps: the chosen steps packed together in a register (the
    /// register form of `vpcompressd`, quick where the form that stores is not), the whole
    /// vector stored at the list's end, and the count moved past the chosen ones. (The list
    /// holds at most `first` steps before, so the store stays inside it.)
    fn append_compressed(
        &self,
        steps: PointerValue<'ctx>,
        count: PointerValue<'ctx>,
        first: IntValue<'ctx>,
        mask: VectorValue<'ctx>,
    ) -> Emit<()> {
        let (i32t, i64t) = (self.context.i32_type(), self.context.i64_type());
        let ty = i32t.vec_type(CHUNK);
        let lanes: Vec<_> = (0..CHUNK)
            .map(|k| i32t.const_int(k.into(), false))
            .collect();
        let first = self.broadcast(first.into(), ty)?;
        let ts = self
            .builder
            .build_int_add(first, VectorType::const_vector(&lanes), "ts")?;
        let compress = self.intrinsic("llvm.x86.avx512.mask.compress", &[ty.into()])?;
        let packed = self
            .builder
            .build_call(
                compress,
                &[ts.into(), ty.const_zero().into(), mask.into()],
                "",
            )?
            .try_as_basic_value()
            .basic()
            .ok_or(inkwell::builder::BuilderError::UnsetPosition)?;
        let n = self.builder.build_load(i64t, count, "n")?.into_int_value();
        let at = step_ptr(self, steps, n)?;
        let _ = self.builder.build_store(at, packed)?.set_alignment(4);
        let int = NonZeroU32::new(CHUNK)
            .and_then(|w| self.context.custom_width_int_type(w).ok())
            .ok_or(inkwell::builder::BuilderError::UnsetPosition)?;
        let bits = self.builder.build_bit_cast(mask, int, "")?.into_int_value();
        let popcount = self.intrinsic("llvm.ctpop", &[int.into()])?;
        let kept = self
            .builder
            .build_call(popcount, &[bits.into()], "")?
            .try_as_basic_value()
            .basic()
            .ok_or(inkwell::builder::BuilderError::UnsetPosition)?
            .into_int_value();
        let kept = self.builder.build_int_z_extend(kept, i64t, "kept")?;
        let n = self.builder.build_int_add(n, kept, "n")?;
        self.builder.build_store(count, n)?;
        Ok(())
    }

    /// `accumulate`'s forward of `train`'s dot `dot` (see [`crate::plan::ZeroSkip`]): the
    /// sums from the biases over the steps whose input is not 0 ([`Emitter::dot_rows_forward`]
    /// over every row).
    pub(super) fn sparse_dot_forward(
        &self,
        frame: Frame<'ctx>,
        dot: &DotLoop,
        reps: &Reps<'ctx>,
        skipping: (&ZeroSkip, PointerValue<'ctx>),
    ) -> Emit<()> {
        let biases = self.load_first::<VectorValue>(frame.vals, dot.sum.first, reps)?;
        let rows = self.every_row(dot);
        let sums = self.dot_rows_forward(frame, dot, reps, skipping, rows, &biases)?;
        self.store_first(frame.vals, dot.sum.slot, reps, &sums)
    }

    /// The sums of `train`'s dot `dot` from `starts` over the steps `rows`, skipping those
    /// whose input is 0 while the guard word says every weight is finite (so each skipped
    /// product is a signed 0). A sum that comes out -0 is computed again over every step of
    /// `rows` from its start (a skipped +0 would have made it +0; if it is not -0, no skipped
    /// term changed it: see [`crate::plan::ZeroSkip`]), as is every sum where the guard is
    /// clear or too few inputs are 0.
    pub(super) fn dot_rows_forward(
        &self,
        frame: Frame<'ctx>,
        dot: &DotLoop,
        reps: &Reps<'ctx>,
        (skip, guard): (&ZeroSkip, PointerValue<'ctx>),
        rows: Rows<'ctx>,
        starts: &[VectorValue<'ctx>],
    ) -> Emit<Vec<VectorValue<'ctx>>> {
        let i64t = self.context.i64_type();
        let step = |this: &Self, t, sums: &[VectorValue<'ctx>]| {
            this.sum_step(frame, &dot.sum, Some(&dot.products), t, reps, sums)
        };
        let word = self
            .builder
            .build_load(i64t, guard, "guard")?
            .into_int_value();
        let finite = i64t.const_int(GUARD_FINITE as u64, false);
        let set = self.builder.build_and(word, finite, "")?;
        let set =
            self.builder
                .build_int_compare(IntPredicate::NE, set, i64t.const_zero(), "finite")?;
        let [list, sparse, dense, done] = self.skipping_blocks();
        self.builder.build_conditional_branch(set, list, dense)?;

        self.builder.position_at_end(list);
        let input = self.dot_input(frame, dot.products.args[skip.input]);
        let ahead = match frame.pass {
            Pass::Stage { ahead, .. } => ahead,
            _ => None,
        };
        let (steps, n) = self.nonzero_steps(rows, &[input], ahead)?;
        self.branch_on_density(n, rows, skip, sparse, dense)?;

        self.builder.position_at_end(sparse);
        let skipped = self.counted_loop(n, starts, |this, k, sums| {
            let t = this.load_step(steps, k)?;
            step(this, t, sums)
        })?;
        let negative_zero = self.any_negative_zero(&skipped)?;
        let sparse_end = self.block();
        self.builder
            .build_conditional_branch(negative_zero, dense, done)?;

        self.builder.position_at_end(dense);
        let every = self.counted_loop(rows.count, starts, |this, k, sums| {
            step(this, this.builder.build_int_add(rows.first, k, "t")?, sums)
        })?;
        let dense_end = self.block();
        self.builder.build_unconditional_branch(done)?;

        self.builder.position_at_end(done);
        self.join(&[(&skipped, sparse_end), (&every, dense_end)])
    }

    /// `accumulate`'s backward of `train`'s dot `dot`: the sums' gradients (added into the
    /// biases' where the sum starts from a param), then the weights' over the steps whose
    /// input is not 0, where every product's gradient is finite (so each skipped addition is
    /// of a signed 0, to a gradient that `accumulate` started from +0 and that sums of +0 and
    /// numbers never make -0: it changes nothing). Each weight takes one term, so the order
    /// of the steps is free.
    pub(super) fn sparse_dot_backward(
        &self,
        frame: Frame<'ctx>,
        dot: &DotLoop,
        reps: &Reps<'ctx>,
        skip: &ZeroSkip,
    ) -> Emit<()> {
        let (map, rows) = (&dot.products, self.every_row(dot));
        let gs = self.sum_grads::<VectorValue>(frame, &dot.sum, reps)?;
        let g_products = self.fresh(&gs)?;
        let step = |this: &Self, t| -> Emit<Vec<VectorValue<'ctx>>> {
            let locals = this.products_locals(frame, map, t, reps, &g_products)?;
            this.accumulate_args(frame, map, t, reps, &locals)?;
            Ok(Vec::new())
        };
        let finite = self.all_finite(&g_products)?;
        let [list, sparse, dense, done] = self.skipping_blocks();
        self.builder.build_conditional_branch(finite, list, dense)?;

        self.builder.position_at_end(list);
        let input = self.dot_input(frame, map.args[skip.input]);
        let (steps, n) = self.nonzero_steps(rows, &[input], None)?;
        self.branch_on_density(n, rows, skip, sparse, dense)?;

        self.builder.position_at_end(sparse);
        self.counted_loop(n, &[], |this, k, _| step(this, this.load_step(steps, k)?))?;
        self.builder.build_unconditional_branch(done)?;

        self.builder.position_at_end(dense);
        self.counted_loop(rows.count, &[], |this, k, _| {
            step(this, this.builder.build_int_add(rows.first, k, "t")?)
        })?;
        self.builder.build_unconditional_branch(done)?;
        self.builder.position_at_end(done);
        Ok(())
    }

    /// Where the code reads the dot's inputs `a`: the values buffer, or a stage's sample.
    fn dot_input(&self, frame: Frame<'ctx>, a: Affine) -> (PointerValue<'ctx>, Affine) {
        match frame.pass {
            Pass::Stage { sample, .. } => (sample, self.sample_affine(a)),
            _ => (frame.vals, self.plan.buffers.affine(a)),
        }
    }

    /// Every step of `dot`, as [`Rows`].
    fn every_row(&self, dot: &DotLoop) -> Rows<'ctx> {
        let i64t = self.context.i64_type();
        let len = dot.products.len;
        Rows {
            first: i64t.const_zero(),
            count: i64t.const_int(len.into(), false),
            len,
        }
    }

    /// The blocks of `accumulate`'s skipping loops: building the list of steps, the loop
    /// over it, the loop over every step, and after both.
    fn skipping_blocks(&self) -> [BasicBlock<'ctx>; 4] {
        let f = self.current_function();
        ["list", "sparse", "dense", "done"].map(|name| self.context.append_basic_block(f, name))
    }

    /// To `sparse` if the `n` steps of `rows` left are few enough to pay for skipping (at
    /// most 3 in 4, or any number if `skip` says always), else to `dense`.
    fn branch_on_density(
        &self,
        n: IntValue<'ctx>,
        rows: Rows<'ctx>,
        skip: &ZeroSkip,
        sparse: BasicBlock<'ctx>,
        dense: BasicBlock<'ctx>,
    ) -> Emit<()> {
        if skip.always {
            self.builder.build_unconditional_branch(sparse)?;
            return Ok(());
        }
        let i64t = self.context.i64_type();
        let three = self
            .builder
            .build_int_mul(rows.count, i64t.const_int(3, false), "")?;
        let most = self
            .builder
            .build_int_unsigned_div(three, i64t.const_int(4, false), "most")?;
        let few = self
            .builder
            .build_int_compare(IntPredicate::ULE, n, most, "few")?;
        self.builder.build_conditional_branch(few, sparse, dense)?;
        Ok(())
    }

    /// Step `k` of the list [`Emitter::nonzero_steps`] made, as an `i64`.
    fn load_step(&self, steps: PointerValue<'ctx>, k: IntValue<'ctx>) -> Emit<IntValue<'ctx>> {
        let at = step_ptr(self, steps, k)?;
        let t = self.builder.build_load(self.context.i32_type(), at, "t")?;
        self.builder
            .build_int_z_extend(t.into_int_value(), self.context.i64_type(), "t")
    }
}

/// Steps `first..first + count` of a dot of `len` steps (a range inside `0..len`): all of
/// them, or the rows one stage of a minibatch owns (`crate::minibatch`).
#[derive(Clone, Copy)]
pub(super) struct Rows<'ctx> {
    pub first: IntValue<'ctx>,
    pub count: IntValue<'ctx>,
    pub len: u32,
}

/// `&steps[k]` for the `i32` array `steps`.
fn step_ptr<'ctx>(
    e: &Emitter<'ctx, '_>,
    steps: PointerValue<'ctx>,
    k: IntValue<'ctx>,
) -> Emit<PointerValue<'ctx>> {
    let i32t = e.context.i32_type();
    // SAFETY: (of the GEP, not of Rust code) every caller indexes below the array's length:
    // `k` is below the number of steps found, at most the dot's length, or (appending step
    // `t` of rows from `first`) the number found before `t`, at most `t - first` (appending
    // the chunk from `t` as one vector: at most `t - first`, and `t - first + CHUNK` at most
    // the length).
    unsafe { e.builder.build_in_bounds_gep(i32t, steps, &[k], "at") }
}
