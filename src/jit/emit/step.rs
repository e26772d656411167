//! The entry points that train: `update`, `step` (as the plan's [`StepPlan`] says), `train`
//! and `materialize`.

use inkwell::values::{FloatValue, IntValue, PointerValue, VectorValue};

use super::super::abi::{Entry, UpdateFn, ACCUMULATE, MATERIALIZE, STEP, STEP_UPDATE, TRAIN};
use super::known::Place;
use super::lane_io::{Reps, Vector};
use super::{Buf, Emit, Emitter, Frame, Part, Pass, Samples};
use crate::op::Arith;
use crate::passes::schedule::Affine;
use crate::plan::{StepPlan, TrainPlan};
use crate::tape::Slot;

impl<'ctx> Emitter<'ctx, '_> {
    /// `step` and `materialize` (`train`, which calls `step`'s functions, is a lazy entry's
    /// module of its own). `step_backward` are `step`'s own backward parts, if the plan has a
    /// step.
    pub(super) fn step_entries(
        &self,
        forward: &[Part<'ctx>],
        backward: &[Part<'ctx>],
        step_backward: &[Part<'ctx>],
        update: Part<'ctx>,
    ) -> Emit<()> {
        let Some(plan) = &self.plan.step else {
            let mut parts = vec![self.zero_param_grads("zero_params")?];
            parts.extend_from_slice(forward);
            parts.extend_from_slice(backward);
            parts.push(update);
            self.driver(&STEP, &parts)?;
            return self.materialize(None);
        };
        let step_update = self.update_function(&STEP_UPDATE, Some(&plan.fused))?;
        let mut parts = forward.to_vec();
        parts.extend_from_slice(step_backward);
        parts.push(step_update);
        self.driver(&STEP, &parts)?;
        self.materialize(Some(plan))
    }

    /// `train(vals, grads, lr, inputs, n, losses, guard, trained)`: `step` on each of the
    /// `n >= 1` samples of `inputs` (`num_inputs` each), the losses into `losses`. Sample 0
    /// runs forward; then each sample but the last runs `train_bwd0` in place of `step`'s
    /// backward function 0 (its merged dot also computes the next sample's first-layer sums
    /// from that sample's inputs), the rest of the update, and `train_fwd0` (the next forward
    /// without that dot); the last sample runs `step`'s backward. Each sample is checked
    /// right before its forward reads it (so it comes into cache once, not once for a check
    /// first): at the first one holding a non-finite number `train` stops, its index in
    /// `*trained`, the buffers mid-way; else `*trained = n`.
    pub(super) fn train(
        &self,
        plan: &TrainPlan,
        forward: &[Part<'ctx>],
        step_backward: &[Part<'ctx>],
        update: Part<'ctx>,
    ) -> Emit<()> {
        let ptr = self.context.ptr_type(Default::default());
        let i64t = self.context.i64_type();
        let train_forward0 = self.forward_parts("train_fwd", Pass::TrainForward)?[0];
        let mut train_forward = forward.to_vec();
        train_forward[0] = train_forward0;
        let merged = self.begin_function(
            "train_bwd0",
            &[
                self.f64_type().into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
                ptr.into(),
            ],
            false,
        );
        {
            let (vals, grads) = self.buffers(merged);
            let param = |i| merged.get_nth_param(i).unwrap();
            let frame = Frame {
                vals,
                grads,
                scratch: super::local::Scratch::Backward(None),
                pass: Pass::TrainBackward {
                    plain_updates: false,
                    lr: param(2).into_float_value(),
                    samples: Samples {
                        next: param(3).into_pointer_value(),
                        this: param(4).into_pointer_value(),
                        guard: param(5).into_pointer_value(),
                        ahead: param(6).into_pointer_value(),
                    },
                },
            };
            self.backward_body(frame, &self.plan.functions[0])?;
        }

        let f = self.begin_entry(&TRAIN, true);
        let (vals, grads) = self.buffers(f);
        let lr = f.get_nth_param(2).unwrap().into_float_value();
        let inputs = f.get_nth_param(3).unwrap().into_pointer_value();
        let n = f.get_nth_param(4).unwrap().into_int_value();
        let losses = f.get_nth_param(5).unwrap().into_pointer_value();
        let guard = f.get_nth_param(6).unwrap().into_pointer_value();
        let trained = f.get_nth_param(7).unwrap().into_pointer_value();
        let first = self.context.append_basic_block(f, "first");
        let body = self.context.append_basic_block(f, "sample");
        let check_next = self.context.append_basic_block(f, "check_next");
        let merged_block = self.context.append_basic_block(f, "merged");
        let last = self.context.append_basic_block(f, "last");
        let exit = self.context.append_basic_block(f, "exit");
        let stop = self.context.append_basic_block(f, "stop");
        let finite = self.finite_sample(inputs)?;
        let checked_first = self.block();
        self.builder.build_conditional_branch(finite, first, stop)?;

        self.builder.position_at_end(first);
        self.copy_sample(vals, inputs)?;
        self.calls(forward, vals, grads, Some(lr))?;
        let entry = self.block();
        self.builder.build_unconditional_branch(body)?;

        self.builder.position_at_end(body);
        let s = self.builder.build_phi(i64t, "s")?;
        let s_value = s.as_basic_value().into_int_value();
        self.store_loss(vals, losses, s_value)?;
        let (next, more) = self.next_sample(s_value, n)?;
        self.builder
            .build_conditional_branch(more, check_next, last)?;

        self.builder.position_at_end(check_next);
        let next_inputs = self.sample_ptr(inputs, next, "next_inputs")?;
        let finite = self.finite_sample(next_inputs)?;
        let checked_next = self.block();
        self.builder
            .build_conditional_branch(finite, merged_block, stop)?;

        self.builder.position_at_end(merged_block);
        // The sample after the next (or the next, at the end), which the merged loop asks
        // into the cache a line per step while it runs: the next sample's check waited for
        // each line of it.
        let (after_next, more) = self.next_sample(next, n)?;
        let after_next = self
            .builder
            .build_select(more, after_next, next, "after_next")?
            .into_int_value();
        let after_next_inputs = self.sample_ptr(inputs, after_next, "after_next_inputs")?;
        let sample_inputs = self.sample_ptr(inputs, s_value, "sample_inputs")?;
        // `step`'s backward parts are init, the functions from the last, rest: function 0
        // is the last but one.
        let merged_at = step_backward.len() - 2;
        for (k, part) in step_backward.iter().enumerate() {
            if k == merged_at {
                let args = [
                    vals.into(),
                    grads.into(),
                    lr.into(),
                    next_inputs.into(),
                    sample_inputs.into(),
                    guard.into(),
                    after_next_inputs.into(),
                ];
                self.builder.build_call(merged, &args, "")?;
            } else {
                self.calls(&[*part], vals, grads, Some(lr))?;
            }
        }
        self.calls(&[update], vals, grads, Some(lr))?;
        // The next forward reads every input but the merged dot's.
        self.copy_other_inputs(plan, vals, next_inputs)?;
        self.calls(&train_forward, vals, grads, Some(lr))?;
        let latch = self.builder.get_insert_block().expect("positioned");
        self.builder.build_unconditional_branch(body)?;
        s.add_incoming(&[(&i64t.const_zero(), entry), (&next, latch)]);

        self.builder.position_at_end(last);
        // `step`'s backward reads this sample's inputs from `vals`, and after `train` they
        // hold the last sample's, as after `step`.
        let last_inputs = self.sample_ptr(inputs, s_value, "last_inputs")?;
        self.copy_sample(vals, last_inputs)?;
        self.calls(step_backward, vals, grads, Some(lr))?;
        self.calls(&[update], vals, grads, Some(lr))?;
        self.builder.build_unconditional_branch(exit)?;
        self.builder.position_at_end(exit);
        self.builder.build_store(trained, n)?;
        self.builder.build_return(None)?;

        self.builder.position_at_end(stop);
        let at = self.builder.build_phi(i64t, "non_finite")?;
        at.add_incoming(&[(&i64t.const_zero(), checked_first), (&next, checked_next)]);
        self.builder.build_store(trained, at.as_basic_value())?;
        self.builder.build_return(None)?;
        Ok(())
    }

    /// Whether every input of the sample at `sample` is finite: `x - x` is 0 for a finite
    /// `x` and NaN otherwise, summed in [`Tactics::finite_sums`](crate::plan::tactics::Tactics::finite_sums) vectors of eight (independent chains
    /// of additions; no order of the sums can hide a NaN), the last vectors and the rest one
    /// by one.
    fn finite_sample(&self, sample: PointerValue<'ctx>) -> Emit<IntValue<'ctx>> {
        const LANES: u32 = 8;
        let width = self.tape.num_inputs() as u32;
        let i64t = self.context.i64_type();
        let vector = self.f64_type().vec_type(LANES);
        let zeros = vector.const_zero();
        let finite_sums = self.plan.tactics.finite_sums;
        let block = LANES * finite_sums;
        let blocks = width / block;
        let zero_if_finite = |at: IntValue<'ctx>| -> Emit<VectorValue<'ctx>> {
            let x = self.load_vector(self.element_ptr(sample, at)?, vector)?;
            self.builder.build_float_sub(x, x, "x_minus_x")
        };
        let mut sums = vec![zeros; finite_sums as usize];
        if blocks > 0 {
            sums = self.emit_loop(blocks, false, &sums, |this, k, sums| {
                let first = this.builder.build_int_mul(
                    k,
                    i64t.const_int(block as u64, false),
                    "block_at",
                )?;
                let mut next = Vec::with_capacity(sums.len());
                for (v, &sum) in sums.iter().enumerate() {
                    let offset = i64t.const_int((v as u32 * LANES) as u64, false);
                    let at = this.builder.build_int_add(first, offset, "finite_at")?;
                    let add = zero_if_finite(at)?;
                    next.push(this.builder.build_float_add(sum, add, "finite_acc")?);
                }
                Ok(next)
            })?;
        }
        for (v, at) in (blocks * block..width - width % LANES)
            .step_by(LANES as usize)
            .enumerate()
        {
            let add = zero_if_finite(i64t.const_int(at as u64, false))?;
            sums[v] = self
                .builder
                .build_float_add(sums[v], add, "finite_acc_last")?;
        }
        let mut all = sums[0];
        for &sum in &sums[1..] {
            all = self.builder.build_float_add(all, sum, "finite_all")?;
        }
        let mut rest = self.f64_type().const_zero();
        for i in width - width % LANES..width {
            let ptr = self.element_ptr(sample, i64t.const_int(i as u64, false))?;
            let x = self
                .builder
                .build_load(self.f64_type(), ptr, "x")?
                .into_float_value();
            let zero_if_finite = self.builder.build_float_sub(x, x, "x_minus_x")?;
            rest = self
                .builder
                .build_float_add(rest, zero_if_finite, "finite_rest")?;
        }
        // The sums are 0 or NaN lane by lane: finite exactly where they are 0.
        let all_lanes = self.all_finite(&[all])?;
        let rest_zero = self.builder.build_float_compare(
            inkwell::FloatPredicate::OEQ,
            rest,
            self.f64_type().const_zero(),
            "rest_zero",
        )?;
        self.builder.build_and(all_lanes, rest_zero, "finite")
    }

    /// `accumulate(vals, grads, inputs, n, losses, guard)`: params' gradients zeroed, then
    /// each of the `n >= 1` samples of `inputs` copied into `vals` and run forward (its loss
    /// into `losses`) and backward. Where `train`'s dot skips zero inputs, forward and
    /// backward function 0 are `acc_fwd0` and `acc_bwd0`, which skip them too
    /// ([`Emitter::sparse_dot_forward`], [`Emitter::sparse_dot_backward`]; the zeroed
    /// gradients here are what makes the backward's skipping exact).
    pub(super) fn accumulate(&self, forward: &[Part<'ctx>], backward: &[Part<'ctx>]) -> Emit<()> {
        let i64t = self.context.i64_type();
        // `backward`'s parts are init, the functions from the last, rest.
        let (forward_at, backward_at) = (0, backward.len() - 2);
        let skipping = match self.zero_skip() {
            Some(_) => Some((
                self.accumulate_function("acc", false, false)?,
                self.accumulate_function("acc", true, false)?,
            )),
            None => None,
        };
        // Its own name: module 0 defines `zero_params` too, and the linker sees both.
        let zero = self.zero_param_grads("acc_zero_params")?;
        let f = self.begin_entry(&ACCUMULATE, true);
        let (vals, grads) = self.buffers(f);
        let param = |i| f.get_nth_param(i).unwrap();
        let inputs = param(2).into_pointer_value();
        let n = param(3).into_int_value();
        let losses = param(4).into_pointer_value();
        let guard = param(5).into_pointer_value();
        self.calls(&[zero], vals, grads, None)?;
        let entry = self.block();
        let body = self.context.append_basic_block(f, "sample");
        let exit = self.context.append_basic_block(f, "exit");
        self.builder.build_unconditional_branch(body)?;

        self.builder.position_at_end(body);
        let s = self.builder.build_phi(i64t, "s")?;
        let s_value = s.as_basic_value().into_int_value();
        let sample = self.sample_ptr(inputs, s_value, "sample")?;
        self.copy_sample(vals, sample)?;
        let (fwd0, bwd0) = (skipping.map(|s| s.0), skipping.map(|s| s.1));
        self.run_parts(forward, forward_at, fwd0, vals, grads, guard)?;
        self.store_loss(vals, losses, s_value)?;
        self.run_parts(backward, backward_at, bwd0, vals, grads, guard)?;
        let (next, more) = self.next_sample(s_value, n)?;
        let latch = self.block();
        self.builder.build_conditional_branch(more, body, exit)?;
        s.add_incoming(&[(&i64t.const_zero(), entry), (&next, latch)]);

        self.builder.position_at_end(exit);
        self.builder.build_return(None)?;
        Ok(())
    }

    /// Calls each of `parts` in turn, part `at` replaced by `instead` (a function of `vals`,
    /// `grads` and `guard`) if given.
    pub(super) fn run_parts(
        &self,
        parts: &[Part<'ctx>],
        at: usize,
        instead: Option<Part<'ctx>>,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        guard: PointerValue<'ctx>,
    ) -> Emit<()> {
        for (k, part) in parts.iter().enumerate() {
            match instead.filter(|_| k == at) {
                Some(f) => {
                    let args = [vals.into(), grads.into(), guard.into()];
                    self.builder.build_call(f.f, &args, "")?;
                }
                None => self.calls(&[*part], vals, grads, None)?,
            }
        }
        Ok(())
    }

    /// `{name}_fwd0(vals, grads, guard)` (or `_bwd0` if `backward`): `accumulate`'s forward
    /// (or backward) function 0, which skips the zero inputs of `train`'s dot; `acc_rest`'s,
    /// which leaves that dot to the other stages, if `rest`.
    pub(super) fn accumulate_function(
        &self,
        name: &str,
        backward: bool,
        rest: bool,
    ) -> Emit<Part<'ctx>> {
        let name = format!("{name}_{}0", if backward { "bwd" } else { "fwd" });
        let ptr = self.context.ptr_type(Default::default());
        let f = self.begin_function(&name, &[ptr.into()], false);
        let (vals, grads) = self.buffers(f);
        let guard = f.get_nth_param(2).unwrap().into_pointer_value();
        // (`backward_body` makes a backward function's scratch.)
        let scratch = match backward {
            true => super::local::Scratch::Backward(None),
            false => self.value_scratch(0)?,
        };
        let frame = Frame {
            vals,
            grads,
            scratch,
            pass: match rest {
                true => Pass::AccumulateRest,
                false => Pass::Accumulate { guard },
            },
        };
        let items = &self.plan.functions[0];
        if backward {
            self.backward_body(frame, items)?;
        } else {
            self.forward_body(frame, vals, items)?;
        }
        Ok(Part {
            f,
            second: Buf::Grads,
            lr: false,
        })
    }

    /// `&inputs[sample * num_inputs]`, the first input of a sample of `train`'s argument
    /// (the native `train` takes `n` whole samples, and callers pass a sample below `n`).
    fn sample_ptr(
        &self,
        inputs: PointerValue<'ctx>,
        sample: IntValue<'ctx>,
        name: &str,
    ) -> Emit<PointerValue<'ctx>> {
        let width = self.tape.num_inputs() as u64;
        let i64t = self.context.i64_type();
        let offset = self
            .builder
            .build_int_mul(sample, i64t.const_int(width, false), name)?;
        self.element_ptr(inputs, offset)
    }

    /// Asks the cache for line `min(k, last)` of the sample at `sample` (a prefetch never
    /// faults and changes no result). `train`'s merged loops ask for the sample after the
    /// next one line per step: issued all at once, before the step, the prefetches of a
    /// sample's 100 lines (from memory) filled the core's miss buffers and stalled it (train()
    /// on MNIST, two JITs taking turns: 2.62-2.78 -> 2.51-2.55 us per sample). Into L2, not L1:
    /// there they would push out the weights the step is using (into L2 -7 to -10%, into L1
    /// -2%, when the prefetch was introduced).
    pub(super) fn prefetch_sample_line(
        &self,
        sample: PointerValue<'ctx>,
        k: IntValue<'ctx>,
    ) -> Emit<()> {
        const LINE_NUMBERS: u64 = 8;
        let lines = (self.tape.num_inputs() as u64).div_ceil(LINE_NUMBERS);
        if lines == 0 {
            return Ok(());
        }
        let i64t = self.context.i64_type();
        let last = i64t.const_int(lines - 1, false);
        let before_last =
            self.builder
                .build_int_compare(inkwell::IntPredicate::ULT, k, last, "")?;
        let line = self.builder.build_select(before_last, k, last, "line")?;
        let at = self.builder.build_int_mul(
            line.into_int_value(),
            i64t.const_int(LINE_NUMBERS, false),
            "",
        )?;
        // Locality 1 (x86: prefetcht2; AMD fills L2 for it).
        self.prefetch(self.element_ptr(sample, at)?, 1)
    }

    /// Asks the cache for the line at `ptr` (to read, as data; `locality` 0-3, 3 keeping it
    /// closest). A prefetch never faults and changes no result.
    pub(super) fn prefetch(&self, ptr: PointerValue<'ctx>, locality: u64) -> Emit<()> {
        let i32t = self.context.i32_type();
        let prefetch = self.intrinsic("llvm.prefetch", &[ptr.get_type().into()])?;
        let how = [0, locality, 1].map(|x| i32t.const_int(x, false).into());
        self.builder
            .build_call(prefetch, &[ptr.into(), how[0], how[1], how[2]], "")?;
        Ok(())
    }

    /// Copies the inputs of a sample (at `sample`) that `train`'s merged dot does not read
    /// into their slots.
    pub(super) fn copy_other_inputs(
        &self,
        plan: &TrainPlan,
        vals: PointerValue<'ctx>,
        sample: PointerValue<'ctx>,
    ) -> Emit<()> {
        let i64t = self.context.i64_type();
        let p = self.tape.num_params() as u64;
        for run in &plan.other_inputs {
            let to = self.slot_ptr(vals, Slot(run.start))?;
            let at = i64t.const_int((run.start as u64) - p, false);
            // The run lies within the inputs, so within the sample.
            let from = self.element_ptr(sample, at)?;
            let len = i64t.const_int(8 * run.len() as u64, false);
            self.builder.build_memcpy(to, 8, from, 8, len)?;
        }
        Ok(())
    }

    /// Copies a sample (at `sample`, `num_inputs` numbers) into the input slots.
    fn copy_sample(&self, vals: PointerValue<'ctx>, sample: PointerValue<'ctx>) -> Emit<()> {
        let bytes = 8 * self.tape.num_inputs() as u64;
        let bytes = self.context.i64_type().const_int(bytes, false);
        let inputs = self.slot_ptr(vals, Slot(self.tape.num_params() as u32))?;
        self.builder.build_memcpy(inputs, 8, sample, 8, bytes)?;
        Ok(())
    }

    /// `losses[s] = vals[loss]` (the entry points that take samples have a loss; `losses`
    /// has `n` entries and `s < n`).
    pub(super) fn store_loss(
        &self,
        vals: PointerValue<'ctx>,
        losses: PointerValue<'ctx>,
        s: IntValue<'ctx>,
    ) -> Emit<()> {
        let loss = self
            .tape
            .loss()
            .expect("entry points that take samples have a loss");
        let value = self.load_slot(vals, loss, "loss")?;
        self.builder
            .build_store(self.element_ptr(losses, s)?, value)?;
        Ok(())
    }

    /// `s + 1`, and whether it is below `n`.
    fn next_sample(
        &self,
        s: IntValue<'ctx>,
        n: IntValue<'ctx>,
    ) -> Emit<(IntValue<'ctx>, IntValue<'ctx>)> {
        let one = self.context.i64_type().const_int(1, false);
        let next = self.builder.build_int_add(s, one, "next")?;
        let more = self
            .builder
            .build_int_compare(inkwell::IntPredicate::ULT, next, n, "more")?;
        Ok((next, more))
    }

    /// `materialize(vals, grads)`: stores the gradients `step` deferred, from the values and
    /// sum gradients it left in the buffers.
    fn materialize(&self, plan: Option<&StepPlan>) -> Emit<()> {
        let f = self.begin_entry(&MATERIALIZE, true);
        let (vals, grads) = self.buffers(f);
        let frame = Frame {
            vals,
            grads,
            scratch: super::local::Scratch::Backward(None),
            pass: Pass::Other,
        };
        for d in plan.iter().flat_map(|p| &p.deferred) {
            let group = self.plan.nest(&d.nest).lanes.backward().unwrap_or(1);
            self.deferred_grads(frame, &d.nest, d.dot(), d.operand, group)?;
        }
        self.builder.build_return(None)?;
        Ok(())
    }

    /// `name(vals, grads, lr)`: `vals[p] -= lr * grads[p]` for every param but those `skip`
    /// marks, as loops LLVM may vectorize (each param is independent, so vectorizing keeps
    /// every result exact). The loops run over addresses, the gaps between lined rows
    /// ([`crate::plan::Buffers::compact_bridged`]) too: their 0s stay 0 (`0 - lr * 0` is +0
    /// for a finite `lr`), and the runs stay whole.
    pub(super) fn update_function(
        &self,
        entry: &Entry<UpdateFn>,
        skip: Option<&[bool]>,
    ) -> Emit<Part<'ctx>> {
        let f = self.begin_entry(entry, true);
        let (vals, grads) = self.buffers(f);
        let lr = f.get_nth_param(2).unwrap().into_float_value();
        lr.set_name("lr");
        let params = self.tape.num_params();
        let which = |s: usize| !skip.is_some_and(|k| k[s]);
        let mut updated = self.plan.buffers.compact_bridged(self.tape, params, which);
        updated.truncate(self.plan.buffers.params_len(self.tape));
        let mut a = 0;
        while a < updated.len() {
            if !updated[a] {
                a += 1;
                continue;
            }
            let start = a;
            while a < updated.len() && updated[a] {
                a += 1;
            }
            let run = Affine {
                base: start as i64,
                stride: 1,
                outer: [0; crate::passes::schedule::MAX_NEST_DEPTH],
            };
            self.emit_loop::<FloatValue>((a - start) as u32, false, &[], |this, i, _| {
                let (g_at, p_at) = (
                    this.address_ptr(grads, run, i, &[])?,
                    this.address_ptr(vals, run, i, &[])?,
                );
                let g = this
                    .builder
                    .build_load(this.f64_type(), g_at, "g")?
                    .into_float_value();
                let p = this
                    .builder
                    .build_load(this.f64_type(), p_at, "p")?
                    .into_float_value();
                let p_new = this.sgd(p, g, lr)?;
                this.builder.build_store(p_at, p_new)?;
                Ok(Vec::new())
            })?;
        }
        self.builder.build_return(None)?;
        Ok(Part {
            f,
            second: Buf::Grads,
            lr: true,
        })
    }

    /// `p - lr * g`, the interpreter's update of one param.
    fn sgd(
        &self,
        p: FloatValue<'ctx>,
        g: FloatValue<'ctx>,
        lr: FloatValue<'ctx>,
    ) -> Emit<FloatValue<'ctx>> {
        let step = self.builder.build_float_mul(lr, g, "step")?;
        self.builder.build_float_sub(p, step, "p_new")
    }

    /// `name(vals, grads)`: what `zero_grad` does.
    fn zero_param_grads(&self, name: &str) -> Emit<Part<'ctx>> {
        let f = self.begin_function(name, &[], false);
        let (_, grads) = self.buffers(f);
        self.zero_grads_where(grads, self.tape.num_params(), |_| true)?;
        self.builder.build_return(None)?;
        Ok(Part {
            f,
            second: Buf::Grads,
            lr: false,
        })
    }

    /// Whether `grads[a(t, j)] += d` is, in this frame, a param's whole gradient to store and
    /// apply (`step`'s fused update).
    pub(super) fn fuses_update(&self, frame: Frame<'ctx>, a: Affine) -> bool {
        let step = self.plan.step.as_ref();
        frame.steps() && step.is_some_and(|p| p.fuses(a.at(0).index()))
    }

    /// A fused param's gradient and update, for one vector of lanes (adjacent slots): `g = 0 +
    /// d` (its zeroed buffer plus its one contribution), stored unless deferred, and
    /// `p -= lr * g`. Both addresses are computed once: this runs once per weight per step.
    pub(super) fn fused_update(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        (reps, lanes): (&Reps<'ctx>, Vector),
        d: VectorValue<'ctx>,
    ) -> Emit<()> {
        let Some(lr) = frame.lr() else {
            unreachable!("fuses_update holds in step's backward only, which has lr")
        };
        let (g_place, p_place) = (
            Place::new(frame.grads, a, t, reps, lanes),
            Place::new(frame.vals, a, t, reps, lanes),
        );
        self.write(g_place, None, || {
            self.write(p_place, None, || {
                self.fused_update_at(frame, a, t, (reps, lanes), d, lr)
            })
        })
    }

    /// [`Emitter::fused_update`]'s loads and stores.
    fn fused_update_at(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        (reps, lanes): (&Reps<'ctx>, Vector),
        d: VectorValue<'ctx>,
        lr: FloatValue<'ctx>,
    ) -> Emit<()> {
        let js = self.lane_js(reps, lanes)?;
        let (g_ptr, p_ptr) = (
            self.ptr_at(frame.grads, a, t, &js)?,
            self.ptr_at(frame.vals, a, t, &js)?,
        );
        let deferred = self
            .plan
            .step
            .as_ref()
            .is_some_and(|s| s.defers(a.at(0).index()));
        let g = if !deferred {
            let g = self.fresh(&[d])?[0];
            self.store_vector(g_ptr, g)?;
            g
        } else if frame.plain_updates() {
            d
        } else {
            self.fresh(&[d])?[0]
        };
        let p = self.load_vector(p_ptr, g.get_type())?;
        let lr_lanes = self.splat(lr, lanes.width)?;
        let mut ar = self.arith::<VectorValue>(lanes);
        let step = ar.mul(lr_lanes, g);
        let p_new = ar.sub(p, step);
        ar.finish()?;
        self.store_vector(p_ptr, p_new)
    }
}
