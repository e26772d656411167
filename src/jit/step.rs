//! `update` and `step`: the SGD update, and one whole training step as one native call.
//!
//! `step` does what `zero_grad`, `forward`, `backward`, `update` do in turn, with the same
//! results, but knows what the four calls cannot: that every param's gradient starts at 0.
//! Its backward therefore starts params' gradients from the constant 0 instead of memory
//! (no `zero_grad` pass over them), and a param whose gradient one lane loop computes in
//! whole (its only use) is stored and updated right there (`p -= lr * g`), while its value is
//! still in cache: a layer's weights cross memory twice per step instead of four times.
//! Where no lane loop computes a param's whole gradient (loop recovery off, or an irregular
//! graph), `step` calls the four passes instead: a second backward would only add compile
//! time.

use inkwell::values::{FloatValue, IntValue, PointerValue, VectorValue};

use super::lower::{Buf, Emit, Lowerer, Part, MATERIALIZE, STEP, TRAIN};
use crate::op::Op;
use crate::passes::loops::{Affine, DotLoop, Item, Nest, Schedule};
use crate::tape::{Slot, Tape};

impl<'ctx> Lowerer<'ctx, '_> {
    /// Emits `step` from the other passes' parts, or with a backward of its own.
    pub(super) fn lower_step(
        &mut self,
        schedule: &Schedule,
        groups: &[Vec<Item>],
        forward: &[Part<'ctx>],
        backward: &[Part<'ctx>],
        update: Part<'ctx>,
    ) -> Emit<()> {
        let mut parts = Vec::new();
        let fused = fused_updates(self.tape, schedule);
        // A second backward pays only where it saves a pass over a layer's weights.
        if !fused.contains(&true) || self.tape.loss().is_none() {
            parts.push(self.lower_zero_param_grads()?);
            parts.extend_from_slice(forward);
            parts.extend_from_slice(backward);
            parts.push(update);
            self.lower_driver(STEP, &parts, true)?;
            return self.lower_materialize(schedule, &[]);
        }
        self.fused_update = fused;
        let deferred = deferred_blocks(self.tape, schedule, &self.fused_update);
        for &(k, b, i) in &deferred {
            let (nest, dot) = nest_dot(schedule, k, b);
            for j in 0..nest.count {
                for t in 0..dot.products.len {
                    self.deferred[dot.products.args[i].at_nested(t, j).index()] = true;
                }
            }
        }
        self.step_mode = true;
        self.grad_stored = self.fused_update.clone();
        let plan = train_plan(self.tape, schedule, &deferred);
        self.train_plan = plan.as_ref().map(|p| p.dot);
        let step_backward = self.lower_backward(groups, "step_bwd")?;
        self.train_plan = None;
        let rest = self.fused_update.clone();
        let step_update = self.lower_update("step_update", &rest)?;
        parts.extend_from_slice(forward);
        parts.extend_from_slice(&step_backward);
        parts.push(step_update);
        self.lower_driver(STEP, &parts, true)?;
        if let (Some(train_group), Some(plan)) = (self.train_group.take(), plan) {
            // `train`'s passes differ from `step`'s in the first group only, which holds
            // the first nest alone (`function_groups`): backward parts are init, the groups
            // from the last, rest.
            let mut train_backward = step_backward.clone();
            let first = train_backward.len() - 2;
            train_backward[first] = train_group;
            let merged = train_group;
            self.train_dot = Some(plan.dot);
            let mut train_forward = forward.to_vec();
            train_forward[0] = self.lower_forward(&groups[..1], "train_fwd")?[0];
            self.train_dot = None;
            let passes = TrainPasses {
                merged,
                other_inputs: plan.other_inputs,
                forward,
                step_backward: &step_backward,
                train_backward: &train_backward,
                update: step_update,
                train_forward: &train_forward,
            };
            self.lower_train(&passes)?;
        }
        self.step_mode = false;
        self.lr = None;
        self.lower_materialize(schedule, &deferred)
    }

    /// Whether `dot` is the one `train` merges with the next sample's forward.
    pub(super) fn merges(&self, dot: &DotLoop) -> bool {
        self.train_dot == Some(dot.sum.slot)
    }

    /// `train(vals, grads, lr, inputs, n, losses)`: `step` on each of the `n >= 1` samples
    /// of `inputs` (`num_inputs` each), the losses into `losses`. Sample 0 runs forward; then
    /// each sample but the last runs `train_bwd` (its backward, whose merged group also
    /// computes the next sample's first-layer sums from that sample's inputs), the rest of
    /// the update, and `train_fwd` (the next forward without that dot); the last sample runs
    /// `step`'s backward.
    fn lower_train(&mut self, passes: &TrainPasses<'_, 'ctx>) -> Emit<()> {
        let ptr = self.context.ptr_type(Default::default());
        let i64t = self.context.i64_type();
        let params = [
            ptr.into(),
            ptr.into(),
            self.f64_type.into(),
            ptr.into(),
            i64t.into(),
            ptr.into(),
        ];
        let f = self.begin_function_typed(TRAIN, &params);
        let (vals, grads) = self.buffers(f);
        let lr = f.get_nth_param(2).unwrap().into_float_value();
        let inputs = f.get_nth_param(3).unwrap().into_pointer_value();
        let n = f.get_nth_param(4).unwrap().into_int_value();
        let losses = f.get_nth_param(5).unwrap().into_pointer_value();
        let loss = self.tape.loss().expect("train_dot requires a loss");
        let (p, width) = (self.tape.num_params() as u64, self.tape.num_inputs() as u64);
        let bytes = i64t.const_int(8 * width, false);
        let input_slots = |this: &Self, buf| this.slot_ptr(buf, Slot(p as u32));

        self.builder
            .build_memcpy(input_slots(self, vals)?, 8, inputs, 8, bytes)?;
        self.emit_calls(passes.forward, vals, grads, Some(lr))?;
        let entry = self.builder.get_insert_block().expect("positioned");
        let body = self.context.append_basic_block(f, "sample");
        let merged = self.context.append_basic_block(f, "merged");
        let last = self.context.append_basic_block(f, "last");
        let exit = self.context.append_basic_block(f, "exit");
        self.builder.build_unconditional_branch(body)?;

        self.builder.position_at_end(body);
        let s = self.builder.build_phi(i64t, "s")?;
        let s_value = s.as_basic_value().into_int_value();
        let value = self.load_slot(vals, loss, "loss")?;
        // SAFETY: (of the GEP) s < n, the length of `losses`.
        let loss_ptr = unsafe {
            self.builder
                .build_in_bounds_gep(self.f64_type, losses, &[s_value], "")?
        };
        self.builder.build_store(loss_ptr, value)?;
        let next = self
            .builder
            .build_int_add(s_value, i64t.const_int(1, false), "next")?;
        let more = self
            .builder
            .build_int_compare(inkwell::IntPredicate::ULT, next, n, "more")?;
        self.builder.build_conditional_branch(more, merged, last)?;

        self.builder.position_at_end(merged);
        let next_inputs = self.sample_ptr(inputs, next, "next_inputs")?;
        let sample_inputs = self.sample_ptr(inputs, s_value, "sample_inputs")?;
        for part in passes.train_backward {
            if part.f == passes.merged.f {
                let args = [
                    vals.into(),
                    grads.into(),
                    lr.into(),
                    next_inputs.into(),
                    sample_inputs.into(),
                ];
                self.builder.build_call(part.f, &args, "")?;
            } else {
                self.emit_calls(&[*part], vals, grads, Some(lr))?;
            }
        }
        self.emit_calls(&[passes.update], vals, grads, Some(lr))?;
        // The next forward reads every input but the merged dot's.
        for run in &passes.other_inputs {
            let to = self.slot_ptr(vals, Slot(run.start))?;
            let at = i64t.const_int((run.start as u64) - p, false);
            // SAFETY: (of the GEP) run lies within the inputs, so within the next sample's.
            let from = unsafe {
                self.builder
                    .build_in_bounds_gep(self.f64_type, next_inputs, &[at], "")?
            };
            let len = i64t.const_int(8 * run.len() as u64, false);
            self.builder.build_memcpy(to, 8, from, 8, len)?;
        }
        self.emit_calls(passes.train_forward, vals, grads, Some(lr))?;
        let latch = self.builder.get_insert_block().expect("positioned");
        self.builder.build_unconditional_branch(body)?;
        s.add_incoming(&[(&i64t.const_zero(), entry), (&next, latch)]);

        self.builder.position_at_end(last);
        // `step`'s backward reads this sample's inputs from `vals`, and after `train` they
        // hold the last sample's, as after `step`.
        let last_inputs = self.sample_ptr(inputs, s_value, "last_inputs")?;
        self.builder
            .build_memcpy(input_slots(self, vals)?, 8, last_inputs, 8, bytes)?;
        self.emit_calls(passes.step_backward, vals, grads, Some(lr))?;
        self.emit_calls(&[passes.update], vals, grads, Some(lr))?;
        self.builder.build_unconditional_branch(exit)?;
        self.builder.position_at_end(exit);
        self.builder.build_return(None)?;
        self.trains = true;
        Ok(())
    }

    /// `&inputs[sample * num_inputs]`, the first input of a sample of `train`'s argument.
    fn sample_ptr(
        &self,
        inputs: PointerValue<'ctx>,
        sample: IntValue<'ctx>,
        name: &str,
    ) -> Emit<PointerValue<'ctx>> {
        let width = self.tape.num_inputs() as u64;
        let offset = self.builder.build_int_mul(
            sample,
            self.context.i64_type().const_int(width, false),
            "",
        )?;
        // SAFETY: (of the GEP) `train` takes `n` whole samples, and every caller passes a
        // sample below `n`.
        unsafe {
            self.builder
                .build_in_bounds_gep(self.f64_type, inputs, &[offset], name)
        }
    }

    /// `materialize(vals, grads)`: stores the gradients `step` deferred, from the values and
    /// sum gradients it left in the buffers.
    fn lower_materialize(
        &mut self,
        schedule: &Schedule,
        deferred: &[(usize, usize, usize)],
    ) -> Emit<()> {
        let f = self.begin_function(MATERIALIZE, false, true);
        let (vals, grads) = self.buffers(f);
        for &(k, b, i) in deferred {
            let (nest, dot) = nest_dot(schedule, k, b);
            self.emit_deferred_grads_lanes(vals, grads, nest, dot, i)?;
        }
        self.builder.build_return(None)?;
        self.defers = !deferred.is_empty();
        Ok(())
    }

    /// `name(vals, grads, lr)`: `vals[p] -= lr * grads[p]` for every param but those `skip`
    /// marks, as loops LLVM may vectorize (each param is independent, so vectorizing keeps
    /// every result exact).
    pub(super) fn lower_update(&mut self, name: &str, skip: &[bool]) -> Emit<Part<'ctx>> {
        let f = self.begin_function(name, true, true);
        let (vals, grads) = self.buffers(f);
        let lr = f.get_nth_param(2).unwrap().into_float_value();
        lr.set_name("lr");
        let p = self.tape.num_params();
        let mut s = 0;
        while s < p {
            if skip.get(s).copied().unwrap_or(false) {
                s += 1;
                continue;
            }
            let start = s;
            while s < p && !skip.get(s).copied().unwrap_or(false) {
                s += 1;
            }
            let run = Affine {
                base: start as i64,
                stride: 1,
                outer: 0,
            };
            let zero = self.context.i64_type().const_zero();
            self.emit_loop((s - start) as u32, false, &[], |this, i, _| {
                let g = this.load_at(grads, run, i, zero)?;
                let p = this.load_at(vals, run, i, zero)?;
                let p_new = this.emit_sgd(p, g, lr)?;
                this.store_at(vals, run, i, zero, p_new)?;
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
    fn emit_sgd(
        &self,
        p: FloatValue<'ctx>,
        g: FloatValue<'ctx>,
        lr: FloatValue<'ctx>,
    ) -> Emit<FloatValue<'ctx>> {
        let step = self.builder.build_float_mul(lr, g, "step")?;
        self.builder.build_float_sub(p, step, "p_new")
    }

    /// `zero_params(vals, grads)`: what `zero_grad` does.
    fn lower_zero_param_grads(&mut self) -> Emit<Part<'ctx>> {
        let f = self.begin_function("zero_params", false, false);
        let (_, grads) = self.buffers(f);
        let mut params = vec![false; self.tape.len()];
        params[..self.tape.num_params()].fill(true);
        self.zero_grads_where(grads, &params)?;
        self.builder.build_return(None)?;
        Ok(Part {
            f,
            second: Buf::Grads,
            lr: false,
        })
    }

    /// Whether `grads[a(t, j)] += d` is, in `step`, a param's whole gradient to store and
    /// apply.
    pub(super) fn fuses_update(&self, a: Affine) -> bool {
        self.step_mode && self.fused_update[a.at(0).index()]
    }

    /// A fused param's gradient and update, for the lanes `j..` of `a(t, j)`: `g = 0 + d`
    /// (its zeroed buffer plus its one contribution), `p -= lr * g`.
    pub(super) fn emit_fused_update_lanes(
        &self,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        ptr_index: (Affine, IntValue<'ctx>, IntValue<'ctx>),
        d: VectorValue<'ctx>,
    ) -> Emit<()> {
        let (a, t, j) = ptr_index;
        let ty = d.get_type();
        let lr = self.lr.expect("step's backward functions take lr");
        let g = self.fresh_lanes(&[d])?[0];
        let g_ptr = self.ptr_at(grads, a, t, j)?;
        let p_ptr = self.ptr_at(vals, a, t, j)?;
        if !self.deferred[a.at(0).index()] {
            self.builder.build_store(g_ptr, g)?.set_alignment(8).ok();
        }
        let p = self.builder.build_load(ty, p_ptr, "p")?.into_vector_value();
        if let Some(inst) = p.as_instruction() {
            inst.set_alignment(8).ok();
        }
        let lr_lanes = splat(self, lr, ty.get_size())?;
        let step = self.builder.build_float_mul(lr_lanes, g, "step")?;
        let p_new = self.builder.build_float_sub(p, step, "p_new")?;
        if let Some(flags) = self.loop_fast_math() {
            for inst in [step.as_instruction(), p_new.as_instruction()]
                .into_iter()
                .flatten()
            {
                let _ = inst.set_fast_math_flags(flags);
            }
        }
        self.builder
            .build_store(p_ptr, p_new)?
            .set_alignment(8)
            .ok();
        Ok(())
    }
}

fn splat<'ctx>(
    this: &Lowerer<'ctx, '_>,
    x: FloatValue<'ctx>,
    width: u32,
) -> Emit<VectorValue<'ctx>> {
    let i32t = this.context.i32_type();
    let mut v = this.f64_type.vec_type(width).get_undef();
    for lane in 0..width {
        v = this
            .builder
            .build_insert_element(v, x, i32t.const_int(lane as u64, false), "")?;
    }
    Ok(v)
}

/// The params `step` updates where their gradient is computed: those a lane loop of the
/// schedule adds into with one vector per group (unit stride across repetitions), that no
/// other node reads in backward and that are not the loss.
pub(super) fn fused_updates(tape: &Tape, schedule: &Schedule) -> Vec<bool> {
    let mut contributions = vec![0u32; tape.len()];
    for s in tape.slots() {
        if tape.op(s).is_leaf() || !tape.needs_grad(s) {
            continue;
        }
        for &a in tape.args(s) {
            contributions[a.index()] += tape.needs_grad(a) as u32;
        }
    }
    let p = tape.num_params();
    let sole = |s: Slot| s.index() < p && contributions[s.index()] == 1 && Some(s) != tape.loss();
    let mut fused = vec![false; tape.len()];
    for item in &schedule.items {
        let Item::Nest(nest) = item else { continue };
        if !nest.lanes {
            continue;
        }
        for (a, len, takes) in nest.body.iter().flat_map(grad_operands) {
            let slots =
                || (0..nest.count).flat_map(move |j| (0..len).map(move |t| a.at_nested(t, j)));
            if takes && a.outer == 1 && slots().all(sole) {
                for s in slots() {
                    fused[s.index()] = true;
                }
            }
        }
    }
    fused
}

/// The fused param operands of dot products whose gradient `step` can leave unstored, as
/// (schedule item, body item, operand): `0 + other * g_sum` is all it takes to compute it
/// later, and nothing `step` does after its backward changes the other operand (it is no
/// param) or the sum's gradient (kept). [`crate::Program`]'s methods materialize it before
/// anyone can tell the difference.
fn deferred_blocks(tape: &Tape, schedule: &Schedule, fused: &[bool]) -> Vec<(usize, usize, usize)> {
    let mut blocks = Vec::new();
    let p = tape.num_params() as u32;
    for (k, item) in schedule.items.iter().enumerate() {
        let Item::Nest(nest) = item else { continue };
        for (b, body) in nest.body.iter().enumerate() {
            let Item::Dot(dot) = body else { continue };
            let m = &dot.products;
            if m.op != Op::Mul || !nest.lanes {
                continue;
            }
            for i in 0..2 {
                let (a, other) = (m.args[i], m.args[1 - i]);
                let other_no_param = other.span(m.len, nest.count).start >= p;
                if fused[a.at(0).index()] && other_no_param {
                    blocks.push((k, b, i));
                }
            }
        }
    }
    blocks
}

/// The passes `train` calls.
struct TrainPasses<'a, 'ctx> {
    /// The backward group whose dot is merged: it also takes the next sample's inputs and
    /// this one's.
    merged: Part<'ctx>,
    /// The input slots the merged dot does not read, as runs.
    other_inputs: Vec<std::ops::Range<u32>>,
    forward: &'a [Part<'ctx>],
    step_backward: &'a [Part<'ctx>],
    train_backward: &'a [Part<'ctx>],
    update: Part<'ctx>,
    train_forward: &'a [Part<'ctx>],
}

/// What `train` merges, if it can.
struct TrainPlan {
    /// The dot (by its sum's slots) whose weight update is merged with the next sample's
    /// forward.
    dot: Affine,
    /// The input slots that dot does not read, as runs: what the next forward needs copied
    /// into `vals`.
    other_inputs: Vec<std::ops::Range<u32>>,
}

/// `train`'s plan: merge the first thing the tape computes if it is a nest's first body
/// item, a dot whose weight gradients `step` defers and whose other operand is inputs
/// without gradient (so the next sample's values are at hand, and nothing else adds
/// gradients in that loop).
fn train_plan(
    tape: &Tape,
    schedule: &Schedule,
    deferred: &[(usize, usize, usize)],
) -> Option<TrainPlan> {
    let &(k, b, i) = deferred.first()?;
    let (nest, dot) = nest_dot(schedule, k, b);
    let other = dot.products.args[1 - i];
    let inputs = tape.input_base() as u32..(tape.input_base() + tape.num_inputs()) as u32;
    let span = other.span(dot.products.len, nest.count);
    let first_computed = k == 0 && b == 0;
    let other_is_input = other.outer == 0
        && !dot.products.grad_args[1 - i]
        && inputs.start <= span.start
        && span.end <= inputs.end;
    let loss_computed = tape.loss().is_some_and(|l| !tape.op(l).is_leaf());
    if !(first_computed && other_is_input && loss_computed) {
        return None;
    }
    // The dot's inputs, if they form one run; else every input is copied.
    let read = if other.stride == 1 && span.len() == dot.products.len as usize {
        span
    } else {
        inputs.start..inputs.start
    };
    let other_inputs = [inputs.start..read.start, read.end..inputs.end]
        .into_iter()
        .filter(|r| !r.is_empty())
        .collect();
    Some(TrainPlan {
        dot: dot.sum.slot,
        other_inputs,
    })
}

/// Body item `b` of the nest that is schedule item `k`, a dot.
fn nest_dot(schedule: &Schedule, k: usize, b: usize) -> (&Nest, &DotLoop) {
    match &schedule.items[k] {
        Item::Nest(nest) => match &nest.body[b] {
            Item::Dot(dot) => (nest, dot),
            _ => unreachable!("deferred_blocks names dots"),
        },
        _ => unreachable!("deferred_blocks names nests"),
    }
}

/// The operands a body item adds gradients into, with their length and whether they take
/// one.
fn grad_operands(item: &Item) -> Vec<(Affine, u32, bool)> {
    match item {
        Item::Map(m) => m
            .args
            .iter()
            .zip(&m.grad_args)
            .map(|(&a, &g)| (a, m.len, g && m.needs_grad))
            .collect(),
        Item::Sum(s) => vec![
            (s.first, 1, s.grad_first && s.needs_grad),
            (s.tail, s.tail_len, s.grad_tail && s.needs_grad),
        ],
        Item::Dot(d) => {
            let mut ops = grad_operands(&Item::Map(d.products.clone()));
            ops.push((d.sum.first, 1, d.sum.grad_first && d.sum.needs_grad));
            ops
        }
        Item::Straight(_) | Item::Nest(_) => Vec::new(),
    }
}
