//! Lowering: a [`Schedule`] -> LLVM IR module with `forward`, `backward` and `update`.
//!
//! The schedule's straight-line ranges and loops are cut into groups of about
//! [`super::JitBuilder::chunk_size`] weight; each group becomes one `noinline` function, so
//! every LLVM pass sees functions of bounded size and compile time stays linear in tape size.
//! Straight-line values live in SSA registers: an operand from elsewhere is loaded once,
//! constants are immediates, and every computed value (and gradient) is stored once, because
//! users may read any slot. Loops (`loops.rs`) work on memory.
//!
//! The arithmetic itself is [`crate::op`]'s formulas, instantiated with [`IrArith`]: the IR
//! performs exactly the interpreter's IEEE operations in the interpreter's order.
//!
//! Native signatures (all buffers have one `f64` per slot):
//! - `forward(ptr vals, ptr grads)`
//! - `backward(ptr vals, ptr grads)`
//! - `update(ptr vals, ptr grads, double lr)`
//! - `step(ptr vals, ptr grads, double lr)`: zero_grad, forward, backward, update (`step.rs`)
//! - `materialize(ptr vals, ptr grads)`: stores the gradients `step` deferred (`step.rs`)
//! - `train(ptr vals, ptr grads, double lr, ptr inputs, i64 n, ptr losses)`: `step` on `n`
//!   samples, where a first layer allows it (`step.rs`)

use std::collections::HashMap;
use std::ops::Range;

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::types::FloatType;
use inkwell::values::{
    BasicMetadataValueEnum, FloatValue, FunctionValue, InstructionOpcode, Operand, PointerValue,
};

use super::ir_arith::IrArith;
use crate::op::{libm, Op};
use crate::passes::loops::{Affine, Item, MapLoop, Schedule};
use crate::tape::{Slot, Tape};

/// Names of the generated entry points.
pub const FORWARD: &str = "forward";
pub const BACKWARD: &str = "backward";
pub const UPDATE: &str = "update";
pub const STEP: &str = "step";
pub const MATERIALIZE: &str = "materialize";
pub const TRAIN: &str = "train";

/// Math functions the IR calls, with the addresses the engine must map them to. Their names
/// are private so that LLVM does not recognize (and rewrite) them as libm calls.
pub fn libm_symbols() -> [(&'static str, usize); 4] {
    [
        ("tapejit_exp", libm::exp as *const () as usize),
        ("tapejit_log", libm::log as *const () as usize),
        ("tapejit_tanh", libm::tanh as *const () as usize),
        ("tapejit_pow", libm::powf as *const () as usize),
    ]
}

/// The host CPU, stamped on every function so codegen uses its features (AVX2, FMA, ...).
pub struct HostCpu {
    pub name: String,
    pub features: String,
}

pub(super) type Emit<T> = Result<T, BuilderError>;

/// Builds the module for one tape.
pub struct Lowerer<'ctx, 't> {
    pub(super) context: &'ctx Context,
    pub(super) module: Module<'ctx>,
    pub(super) builder: Builder<'ctx>,
    pub(super) f64_type: FloatType<'ctx>,
    pub(super) libm: [FunctionValue<'ctx>; 4],
    fn_attributes: Vec<Attribute>,
    pub(super) tape: &'t Tape,
    /// Whether an earlier-emitted backward chunk has stored this slot's gradient.
    pub(super) grad_stored: Vec<bool>,
    /// Whether recovered sums may be reassociated ([`super::JitBuilder::fast_math`]).
    pub(super) fast_math: bool,
    /// Whether the backward being emitted is `step`'s (`step.rs`): params' gradients start
    /// at 0 (`step` zeroes them first) and the params of `fused_update` are updated in it.
    pub(super) step_mode: bool,
    /// Per slot: a param whose gradient `step`'s backward stores once and then applies.
    pub(super) fused_update: Vec<bool>,
    /// The learning rate, inside a function of `step`'s backward.
    pub(super) lr: Option<FloatValue<'ctx>>,
    /// Per slot: whether the buffers hold it ([`Schedule::kept`]); nothing else is stored.
    kept: Vec<bool>,
    /// Per slot: a fused param whose gradient `step` leaves to `materialize`.
    pub(super) deferred: Vec<bool>,
    /// Whether `step` defers any gradient.
    pub(super) defers: bool,
    /// While emitting `train`'s passes: the dot (by its sum's slots) whose weight update
    /// computes the next sample's sums, so its forward is skipped (`step.rs`).
    pub(super) train_dot: Option<Affine>,
    /// Whether the module has `train`.
    pub(super) trains: bool,
    /// The dot `train` will merge, while emitting `step`'s backward (`step.rs`).
    pub(super) train_plan: Option<Affine>,
    /// `train`'s variant of the first backward group, emitted beside `step`'s.
    pub(super) train_group: Option<Part<'ctx>>,
    /// The next sample's inputs, inside `train`'s variant of the first backward group.
    pub(super) next_inputs: Option<PointerValue<'ctx>>,
    /// This sample's inputs, there (`train` does not copy the merged dot's into `vals`).
    pub(super) sample_inputs: Option<PointerValue<'ctx>>,
}

/// A lowered module, whether its `step` defers gradients to `materialize`, and whether it
/// has `train`.
pub struct Lowered<'ctx> {
    pub module: Module<'ctx>,
    pub defers: bool,
    pub trains: bool,
}

/// A function an entry point calls: with `vals` and `second`, and `lr` if it takes one.
#[derive(Clone, Copy)]
pub(super) struct Part<'ctx> {
    pub(super) f: FunctionValue<'ctx>,
    pub(super) second: Buf,
    pub(super) lr: bool,
}

impl<'ctx, 't> Lowerer<'ctx, 't> {
    pub fn new(context: &'ctx Context, tape: &'t Tape, cpu: &HostCpu, fast_math: bool) -> Self {
        let module = context.create_module("tapejit");
        let f64_type = context.f64_type();
        let unary = f64_type.fn_type(&[f64_type.into()], false);
        let binary = f64_type.fn_type(&[f64_type.into(), f64_type.into()], false);
        let [exp, log, tanh, pow] = libm_symbols().map(|(name, _)| {
            let ty = if name == "tapejit_pow" { binary } else { unary };
            let f = module.add_function(name, ty, None);
            // memory(none): pure, so LLVM may CSE, hoist or drop calls, never reorder results.
            for (attr, val) in [("memory", 0), ("nounwind", 0), ("willreturn", 0)] {
                let kind = Attribute::get_named_enum_kind_id(attr);
                f.add_attribute(
                    AttributeLoc::Function,
                    context.create_enum_attribute(kind, val),
                );
            }
            f
        });
        let fn_attributes = vec![
            context.create_string_attribute("target-cpu", &cpu.name),
            context.create_string_attribute("target-features", &cpu.features),
            context.create_enum_attribute(Attribute::get_named_enum_kind_id("nounwind"), 0),
        ];
        Lowerer {
            context,
            module,
            builder: context.create_builder(),
            f64_type,
            libm: [exp, log, tanh, pow],
            fn_attributes,
            tape,
            grad_stored: vec![false; tape.len()],
            fast_math,
            step_mode: false,
            fused_update: vec![false; tape.len()],
            lr: None,
            kept: vec![true; tape.len()],
            deferred: vec![false; tape.len()],
            defers: false,
            train_dot: None,
            trains: false,
            train_plan: None,
            train_group: None,
            next_inputs: None,
            sample_inputs: None,
        }
    }

    /// Emits the whole program and hands the module over.
    pub fn lower(mut self, schedule: &Schedule, chunk_size: usize) -> Emit<Lowered<'ctx>> {
        let groups = function_groups(self.tape, schedule, chunk_size);
        self.kept = schedule.kept(self.tape);
        let forward = self.lower_forward(&groups, "fwd")?;
        self.lower_driver(FORWARD, &forward, false)?;
        let backward = self.lower_backward(&groups, "bwd")?;
        self.lower_driver(BACKWARD, &backward, false)?;
        let update = self.lower_update(UPDATE, &[])?;
        self.lower_step(schedule, &groups, &forward, &backward, update)?;
        Ok(Lowered {
            module: self.module,
            defers: self.defers,
            trains: self.trains,
        })
    }

    /// The backward pass as parts (none without a loss): `{prefix}_init`, the groups from
    /// the last, `{prefix}_rest`.
    pub(super) fn lower_backward(
        &mut self,
        groups: &[Vec<Item>],
        prefix: &str,
    ) -> Emit<Vec<Part<'ctx>>> {
        let mut parts = Vec::new();
        if self.tape.loss().is_none() {
            return Ok(parts);
        }
        let part = |f| Part {
            f,
            second: Buf::Grads,
            lr: false,
        };
        parts.push(part(self.lower_backward_init(prefix, groups)?));
        for (k, group) in groups.iter().enumerate().rev() {
            // `train`'s variant of the first group starts from the same bookkeeping.
            let before = (k == 0 && self.train_plan.is_some()).then(|| self.grad_stored.clone());
            let f = self.lower_backward_group(&format!("{prefix}{k}"), group)?;
            parts.push(Part {
                lr: self.step_mode,
                ..part(f)
            });
            if let Some(before) = before {
                let after = std::mem::replace(&mut self.grad_stored, before);
                self.train_dot = self.train_plan;
                let f = self.lower_backward_group(&format!("train_{prefix}{k}"), group)?;
                self.train_dot = None;
                self.grad_stored = after;
                self.train_group = Some(Part {
                    lr: self.step_mode,
                    ..part(f)
                });
            }
        }
        parts.push(part(self.lower_backward_rest(prefix)?));
        Ok(parts)
    }

    /// A `void name(ptr noalias vals, ptr noalias grads, params...)`, inlinable, with its
    /// entry block selected.
    pub(super) fn begin_function_typed(
        &self,
        name: &str,
        params: &[inkwell::types::BasicMetadataTypeEnum<'ctx>],
    ) -> FunctionValue<'ctx> {
        let ty = self.context.void_type().fn_type(params, false);
        let f = self.module.add_function(name, ty, None);
        for &a in &self.fn_attributes {
            f.add_attribute(AttributeLoc::Function, a);
        }
        let noalias = Attribute::get_named_enum_kind_id("noalias");
        for i in 0..2 {
            f.add_attribute(
                AttributeLoc::Param(i),
                self.context.create_enum_attribute(noalias, 0),
            );
        }
        f.get_nth_param(0).unwrap().set_name("vals");
        f.get_nth_param(1).unwrap().set_name("grads");
        let entry = self.context.append_basic_block(f, "entry");
        self.builder.position_at_end(entry);
        f
    }

    /// A `void name(ptr noalias vals, ptr noalias grads [, double lr])` with its entry block
    /// selected.
    pub(super) fn begin_function(
        &self,
        name: &str,
        with_lr: bool,
        inline: bool,
    ) -> FunctionValue<'ctx> {
        let ptr = self.context.ptr_type(Default::default());
        let mut params = vec![ptr.into(), ptr.into()];
        if with_lr {
            params.push(self.f64_type.into());
        }
        let f = self.begin_function_typed(name, &params);
        if !inline {
            let kind = Attribute::get_named_enum_kind_id("noinline");
            f.add_attribute(
                AttributeLoc::Function,
                self.context.create_enum_attribute(kind, 0),
            );
        }
        f
    }

    pub(super) fn buffers(
        &self,
        f: FunctionValue<'ctx>,
    ) -> (PointerValue<'ctx>, PointerValue<'ctx>) {
        let vals = f.get_nth_param(0).unwrap().into_pointer_value();
        let grads = f.get_nth_param(1).unwrap().into_pointer_value();
        (vals, grads)
    }

    /// `&buf[slot]`
    pub(super) fn slot_ptr(&self, buf: PointerValue<'ctx>, slot: Slot) -> Emit<PointerValue<'ctx>> {
        let index = self.context.i64_type().const_int(slot.0 as u64, false);
        // SAFETY: (of the GEP, not of Rust code) every slot is < tape.len(), the buffer length.
        unsafe {
            self.builder
                .build_in_bounds_gep(self.f64_type, buf, &[index], "")
        }
    }

    pub(super) fn load_slot(
        &self,
        buf: PointerValue<'ctx>,
        slot: Slot,
        name: &str,
    ) -> Emit<FloatValue<'ctx>> {
        let ptr = self.slot_ptr(buf, slot)?;
        Ok(self
            .builder
            .build_load(self.f64_type, ptr, name)?
            .into_float_value())
    }

    pub(super) fn store_slot(
        &self,
        buf: PointerValue<'ctx>,
        slot: Slot,
        v: FloatValue<'ctx>,
    ) -> Emit<()> {
        let ptr = self.slot_ptr(buf, slot)?;
        self.builder.build_store(ptr, v)?;
        Ok(())
    }

    /// The value of `slot` inside the current chunk: cached, an immediate, or loaded once.
    fn value_of(
        &self,
        cache: &mut HashMap<Slot, FloatValue<'ctx>>,
        vals: PointerValue<'ctx>,
        slot: Slot,
    ) -> Emit<FloatValue<'ctx>> {
        if let Some(&v) = cache.get(&slot) {
            return Ok(v);
        }
        let v = match self.tape.op(slot) {
            Op::Const(c) => self.f64_type.const_float(c),
            _ => self.load_slot(vals, slot, &format!("n{}", slot.0))?,
        };
        cache.insert(slot, v);
        Ok(v)
    }

    fn operands(
        &self,
        cache: &mut HashMap<Slot, FloatValue<'ctx>>,
        vals: PointerValue<'ctx>,
        slot: Slot,
    ) -> Emit<Vec<FloatValue<'ctx>>> {
        self.tape
            .args(slot)
            .iter()
            .map(|&a| self.value_of(cache, vals, a))
            .collect()
    }

    pub(super) fn ir_arith(&self) -> IrArith<'_, 'ctx> {
        IrArith::new(&self.builder, self.f64_type, &self.libm)
    }

    /// `fwd{k}`: computes and stores the values of the group's slots, in slot order.
    ///
    /// A group of straight-line code only gets `vals` twice, loading through the first
    /// pointer (slots before the group) and storing through the second (the group's own
    /// slots): the two sets are disjoint, so both pointers may be `noalias`, and code
    /// generation need not order every load after every store (4-6x faster codegen at O2).
    /// A group with loops reads what it stored, so it takes `(vals, grads)`.
    /// The forward pass as parts, `{prefix}0`, `{prefix}1`, ...
    pub(super) fn lower_forward(
        &mut self,
        groups: &[Vec<Item>],
        prefix: &str,
    ) -> Emit<Vec<Part<'ctx>>> {
        groups
            .iter()
            .enumerate()
            .map(|(k, group)| self.lower_forward_group(&format!("{prefix}{k}"), group))
            .collect()
    }

    fn lower_forward_group(&mut self, name: &str, group: &[Item]) -> Emit<Part<'ctx>> {
        let f = self.begin_function(name, false, false);
        let straight_only = group.iter().all(|i| matches!(i, Item::Straight(_)));
        let (vals, second) = self.buffers(f);
        let out = if straight_only {
            f.get_nth_param(1).unwrap().set_name("out");
            second
        } else {
            vals
        };
        // Values stay valid across loops: a loop only writes slots nothing has read yet.
        let mut values = HashMap::new();
        for unit in group {
            match unit {
                Item::Straight(range) => self.emit_forward_nodes(&mut values, vals, out, range)?,
                loop_item => self.emit_item_forward(vals, loop_item)?,
            }
        }
        self.builder.build_return(None)?;
        Ok(Part {
            f,
            second: if straight_only { Buf::Vals } else { Buf::Grads },
            lr: false,
        })
    }

    /// Straight-line forward: each node's value from its operands' registers, stored once.
    fn emit_forward_nodes(
        &mut self,
        values: &mut HashMap<Slot, FloatValue<'ctx>>,
        vals: PointerValue<'ctx>,
        out: PointerValue<'ctx>,
        range: &Range<u32>,
    ) -> Emit<()> {
        for slot in range.clone().map(Slot) {
            let op = self.tape.op(slot);
            if op.is_leaf() {
                continue;
            }
            let x = self.operands(values, vals, slot)?;
            let mut ar = self.ir_arith();
            let v = op.forward(&mut ar, &x);
            ar.finish()?;
            v.set_name(&format!("n{}", slot.0));
            self.store_slot(out, slot, v)?;
            values.insert(slot, v);
        }
        Ok(())
    }

    /// `bwd{k}`: the backward walk over the group in reverse order. Straight-line gradients
    /// live in registers until a loop (which works on memory) or the end of the function
    /// needs them stored.
    fn lower_backward_group(&mut self, name: &str, group: &[Item]) -> Emit<FunctionValue<'ctx>> {
        let f = if self.train_dot.is_some() {
            // `train`'s variant also takes the next sample's inputs and this one's.
            let ptr = self.context.ptr_type(Default::default());
            let params = [
                ptr.into(),
                ptr.into(),
                self.f64_type.into(),
                ptr.into(),
                ptr.into(),
            ];
            self.begin_function_typed(name, &params)
        } else {
            self.begin_function(name, self.step_mode, false)
        };
        let (vals, grads) = self.buffers(f);
        self.lr = f.get_nth_param(2).map(|lr| lr.into_float_value());
        self.next_inputs = f.get_nth_param(3).map(|p| p.into_pointer_value());
        self.sample_inputs = f.get_nth_param(4).map(|p| p.into_pointer_value());
        let mut values = HashMap::new();
        let mut grad = HashMap::new();
        for unit in group.iter().rev() {
            match unit {
                Item::Straight(range) => {
                    self.emit_backward_nodes(&mut values, &mut grad, vals, grads, range)?
                }
                loop_item => {
                    self.store_grads(&mut grad, grads)?;
                    self.emit_item_backward(vals, grads, loop_item)?;
                }
            }
        }
        self.store_grads(&mut grad, grads)?;
        erase_unused_loads(values.values());
        self.builder.build_return(None)?;
        Ok(f)
    }

    /// Straight-line backward over `range` in reverse slot order.
    fn emit_backward_nodes(
        &mut self,
        values: &mut HashMap<Slot, FloatValue<'ctx>>,
        grad: &mut HashMap<Slot, FloatValue<'ctx>>,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        range: &Range<u32>,
    ) -> Emit<()> {
        let mut local = Vec::new();
        for slot in range.clone().map(Slot).rev() {
            let op = self.tape.op(slot);
            if op.is_leaf() || !self.tape.needs_grad(slot) {
                continue;
            }
            let g = self.grad_of(grad, grads, slot)?;
            let x = self.operands(values, vals, slot)?;
            let out = self.value_of(values, vals, slot)?;
            let mut ar = self.ir_arith();
            op.local_grads(&mut ar, &x, out, g, &mut local);
            ar.finish()?;
            for (&a, &d) in self.tape.args(slot).iter().zip(&local) {
                if !self.tape.needs_grad(a) {
                    continue;
                }
                let before = self.grad_of(grad, grads, a)?;
                let after = self
                    .builder
                    .build_float_add(before, d, &format!("g{}", a.0))?;
                grad.insert(a, after);
            }
        }
        Ok(())
    }

    /// Stores every gradient held in registers, in slot order, and forgets them: from here
    /// on memory holds their running values.
    fn store_grads(
        &mut self,
        grad: &mut HashMap<Slot, FloatValue<'ctx>>,
        grads: PointerValue<'ctx>,
    ) -> Emit<()> {
        let mut touched: Vec<_> = grad.drain().collect();
        touched.sort_by_key(|(s, _)| *s);
        for (slot, g) in touched {
            self.store_slot(grads, slot, g)?;
            self.grad_stored[slot.index()] = true;
        }
        Ok(())
    }

    /// The gradient of `slot` so far: from this chunk, or its value on entry to the chunk.
    /// On entry, a gradient no earlier chunk stored is the interpreter's starting value: 1 for
    /// the loss, the accumulated gradient for a param, 0 for anything else.
    fn grad_of(
        &self,
        grad: &mut HashMap<Slot, FloatValue<'ctx>>,
        grads: PointerValue<'ctx>,
        slot: Slot,
    ) -> Emit<FloatValue<'ctx>> {
        if let Some(&g) = grad.get(&slot) {
            return Ok(g);
        }
        // In `step`, params start from 0 like everything else.
        let is_param = slot.index() < self.tape.num_params() && !self.step_mode;
        let g = if self.grad_stored[slot.index()] || (is_param && Some(slot) != self.tape.loss()) {
            self.load_slot(grads, slot, &format!("g{}", slot.0))?
        } else if Some(slot) == self.tape.loss() {
            self.f64_type.const_float(1.0)
        } else {
            self.f64_type.const_float(0.0)
        };
        grad.insert(slot, g);
        Ok(g)
    }

    /// `bwd_rest`: what the chunks did not store: 1 for a loss no node computes (a leaf), 0
    /// for every other kept non-param slot outside the gradient cone (and, in `step`, param).
    fn lower_backward_rest(&mut self, prefix: &str) -> Emit<FunctionValue<'ctx>> {
        let f = self.begin_function(&format!("{prefix}_rest"), false, false);
        let (_, grads) = self.buffers(f);
        if let Some(loss) = self.tape.loss() {
            if !self.grad_stored[loss.index()] {
                self.store_slot(grads, loss, self.f64_type.const_float(1.0))?;
                self.grad_stored[loss.index()] = true;
            }
        }
        let mut unstored: Vec<bool> = self.grad_stored.iter().map(|&s| !s).collect();
        if !self.step_mode {
            unstored[..self.tape.num_params()].fill(false);
        }
        for (u, &kept) in unstored.iter_mut().zip(&self.kept) {
            *u &= kept;
        }
        self.zero_grads_where(grads, &unstored)?;
        self.builder.build_return(None)?;
        Ok(f)
    }

    /// `bwd_init`: zeroes the non-param gradients (in `step`, also the params' not updated
    /// in place) that loops accumulate in memory (loops have no registers to start from 0
    /// in), and sets the loss's to 1 if it is among them. From then on memory holds those
    /// gradients' running values, as if stored by a chunk.
    fn lower_backward_init(
        &mut self,
        prefix: &str,
        groups: &[Vec<Item>],
    ) -> Emit<FunctionValue<'ctx>> {
        let f = self.begin_function(&format!("{prefix}_init"), false, false);
        let (_, grads) = self.buffers(f);
        let mut in_memory = vec![false; self.tape.len()];
        for unit in groups.iter().flatten() {
            mark_loop_grads(unit, &mut in_memory);
        }
        for (s, m) in in_memory[..self.tape.num_params()].iter_mut().enumerate() {
            *m &= self.step_mode && !self.fused_update[s];
        }
        self.zero_grads_where(grads, &in_memory)?;
        if let Some(loss) = self.tape.loss().filter(|l| in_memory[l.index()]) {
            self.store_slot(grads, loss, self.f64_type.const_float(1.0))?;
        }
        for (stored, &m) in self.grad_stored.iter_mut().zip(&in_memory) {
            *stored |= m;
        }
        self.builder.build_return(None)?;
        Ok(f)
    }

    /// Zeroes the gradients of the slots where `which` is true, one memset per run.
    pub(super) fn zero_grads_where(&self, grads: PointerValue<'ctx>, which: &[bool]) -> Emit<()> {
        let zero = self.context.i8_type().const_zero();
        let mut s = 0;
        while s < self.tape.len() {
            if !which[s] {
                s += 1;
                continue;
            }
            let start = s;
            while s < self.tape.len() && which[s] {
                s += 1;
            }
            let ptr = self.slot_ptr(grads, Slot(start as u32))?;
            let bytes = self
                .context
                .i64_type()
                .const_int(8 * (s - start) as u64, false);
            self.builder.build_memset(ptr, 8, zero, bytes)?;
        }
        Ok(())
    }

    /// An entry point that calls `parts` in order (taking `lr` if `with_lr`).
    pub(super) fn lower_driver(
        &mut self,
        name: &str,
        parts: &[Part<'ctx>],
        with_lr: bool,
    ) -> Emit<()> {
        let f = self.begin_function(name, with_lr, true);
        let (vals, grads) = self.buffers(f);
        let lr = f.get_nth_param(2).map(|lr| lr.into_float_value());
        self.emit_calls(parts, vals, grads, lr)?;
        self.builder.build_return(None)?;
        Ok(())
    }

    /// Calls `parts` in order on the buffers (with `lr` where a part takes it).
    pub(super) fn emit_calls(
        &self,
        parts: &[Part<'ctx>],
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        lr: Option<FloatValue<'ctx>>,
    ) -> Emit<()> {
        for part in parts {
            let second = match part.second {
                Buf::Vals => vals,
                Buf::Grads => grads,
            };
            let mut args: Vec<BasicMetadataValueEnum> = vec![vals.into(), second.into()];
            if let Some(lr) = lr.filter(|_| part.lr) {
                args.push(lr.into());
            }
            self.builder.build_call(part.f, &args, "")?;
        }
        Ok(())
    }
}

/// Drops the operand loads a chunk turned out not to need (`add` and `sum` do not read their
/// operands' values in backward), with their address computations, so even O0 code is lean.
fn erase_unused_loads<'a, 'ctx: 'a>(values: impl Iterator<Item = &'a FloatValue<'ctx>>) {
    for v in values {
        let Some(load) = v.as_instruction() else {
            continue;
        };
        if load.get_opcode() != InstructionOpcode::Load || load.get_first_use().is_some() {
            continue;
        }
        let address = load.get_operand(0).and_then(|op| match op {
            Operand::Value(v) => v.into_pointer_value().as_instruction(),
            Operand::Block(_) => None,
        });
        load.erase_from_basic_block();
        if let Some(gep) = address.filter(|g| g.get_first_use().is_none()) {
            gep.erase_from_basic_block();
        }
    }
}

/// The buffer a function takes as its second argument (the first is always `vals`).
#[derive(Clone, Copy)]
pub(super) enum Buf {
    Vals,
    Grads,
}

/// What a loop weighs against [`super::JitBuilder::chunk_size`]: its body is a few nodes.
const LOOP_WEIGHT: usize = 16;

/// The schedule cut into functions of about `chunk_size` weight: straight-line nodes count
/// with their operands (one wide `Sum` weighs what it emits), loops count [`LOOP_WEIGHT`].
pub(super) fn function_groups(
    tape: &Tape,
    schedule: &Schedule,
    chunk_size: usize,
) -> Vec<Vec<Item>> {
    let limit = chunk_size.max(1);
    let mut groups = Vec::new();
    let mut group = Vec::new();
    let mut weight = 0;
    for item in &schedule.items {
        let Item::Straight(range) = item else {
            group.push(item.clone());
            weight += LOOP_WEIGHT * item.loops();
            // A first nest gets a function of its own: `train` (`step.rs`) swaps it.
            let first_nest = groups.is_empty() && group.len() == 1 && matches!(item, Item::Nest(_));
            if weight >= limit || first_nest {
                groups.push(std::mem::take(&mut group));
                weight = 0;
            }
            continue;
        };
        let mut start = range.start;
        for s in range.clone() {
            weight += 1 + tape.args(Slot(s)).len();
            if weight >= limit {
                group.push(Item::Straight(start..s + 1));
                groups.push(std::mem::take(&mut group));
                (start, weight) = (s + 1, 0);
            }
        }
        if start < range.end {
            group.push(Item::Straight(start..range.end));
        }
    }
    if !group.is_empty() {
        groups.push(group);
    }
    groups
}

/// Marks the slots whose gradients a loop reads or accumulates in memory: exactly those, not
/// the range around them (a layer's sums lie a whole neuron apart), and not the operands that
/// take no gradient (nothing adds into theirs).
fn mark_loop_grads(unit: &Item, in_memory: &mut [bool]) {
    fn mark(a: Affine, len: u32, count: u32, in_memory: &mut [bool]) {
        for j in 0..count {
            for t in 0..len {
                in_memory[a.at_nested(t, j).index()] = true;
            }
        }
    }
    fn visit(item: &Item, count: u32, in_memory: &mut [bool]) {
        let args = |m: &MapLoop, in_memory: &mut [bool]| {
            for (&a, _) in m.args.iter().zip(&m.grad_args).filter(|(_, &g)| g) {
                mark(a, m.len, count, in_memory);
            }
        };
        match item {
            Item::Straight(_) => {}
            Item::Map(run) => {
                mark(run.out, run.len, count, in_memory);
                args(run, in_memory);
            }
            Item::Sum(sum) => {
                mark(sum.slot, 1, count, in_memory);
                if sum.grad_first {
                    mark(sum.first, 1, count, in_memory);
                }
                if sum.grad_tail {
                    mark(sum.tail, sum.tail_len, count, in_memory);
                }
            }
            Item::Dot(dot) => {
                mark(dot.sum.slot, 1, count, in_memory);
                if dot.sum.grad_first {
                    mark(dot.sum.first, 1, count, in_memory);
                }
                args(&dot.products, in_memory);
            }
            Item::Nest(nest) => {
                for body in &nest.body {
                    visit(body, nest.count, in_memory);
                }
            }
        }
    }
    visit(unit, 1, in_memory);
}
