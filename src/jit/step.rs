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

use super::lower::{Buf, Emit, Lowerer, Part, MATERIALIZE, STEP};
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
        parts.extend_from_slice(forward);
        parts.extend(self.lower_backward(groups, "step_bwd")?);
        let rest = self.fused_update.clone();
        parts.push(self.lower_update("step_update", &rest)?);
        self.step_mode = false;
        self.lr = None;
        self.lower_driver(STEP, &parts, true)?;
        self.lower_materialize(schedule, &deferred)
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
