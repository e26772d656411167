//! Straight-line code: one group of instructions per tape node, values in SSA registers.
//!
//! Within a function an operand from elsewhere is loaded once, constants are immediates,
//! and every computed value (and gradient) is stored once, because users may read any slot.
//! A `sum` the plan cut into parts ([`Item::SumPart`](crate::passes::schedule::Item)) keeps its
//! running total in its own slot between functions.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use inkwell::values::{FloatValue, InstructionOpcode, Operand, PointerValue};

use super::{Emit, Emitter, Frame};
use crate::op::Op;
use crate::plan::memory::GradStart;
use crate::tape::{Args, Slot};

/// A forward function's values in registers.
#[derive(Default)]
pub(super) struct ForwardChunk<'ctx> {
    values: HashMap<Slot, FloatValue<'ctx>>,
}

/// A backward function's values and gradients in registers.
#[derive(Default)]
pub(super) struct BackwardChunk<'ctx> {
    pub(super) values: HashMap<Slot, FloatValue<'ctx>>,
    grads: HashMap<Slot, FloatValue<'ctx>>,
    /// Gradients this function stored before a loop: memory holds them from there on.
    stored: HashSet<Slot>,
}

impl<'ctx> Emitter<'ctx, '_> {
    /// The value of `slot` inside the current function: cached, an immediate, or loaded once.
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
            Op::Const(c) => self.f64_type().const_float(c),
            _ => self.load_slot(vals, slot, &format!("n{}", slot.0))?,
        };
        cache.insert(slot, v);
        Ok(v)
    }

    fn operands(
        &self,
        cache: &mut HashMap<Slot, FloatValue<'ctx>>,
        vals: PointerValue<'ctx>,
        args: Args<'_>,
    ) -> Emit<Vec<FloatValue<'ctx>>> {
        args.iter().map(|a| self.value_of(cache, vals, a)).collect()
    }

    /// Each node's value from its operands' registers, stored once (through `out`).
    pub(super) fn straight_forward(
        &self,
        chunk: &mut ForwardChunk<'ctx>,
        vals: PointerValue<'ctx>,
        out: PointerValue<'ctx>,
        range: &Range<u32>,
    ) -> Emit<()> {
        for slot in range.clone().map(Slot) {
            let op = self.tape.op(slot);
            if op.is_leaf() {
                continue;
            }
            let x = self.operands(&mut chunk.values, vals, self.tape.args(slot))?;
            let mut ar = self.scalar_arith();
            let v = op.forward(&mut ar, &x);
            ar.finish()?;
            v.set_name(&format!("n{}", slot.0));
            self.store_slot(out, slot, v)?;
            chunk.values.insert(slot, v);
        }
        Ok(())
    }

    /// Operands `args` of the sum at `slot`, added left to right to the total so far (its
    /// first operand for the first part, else what the slot holds), stored back.
    pub(super) fn sum_part_forward(
        &self,
        chunk: &mut ForwardChunk<'ctx>,
        vals: PointerValue<'ctx>,
        out: PointerValue<'ctx>,
        slot: Slot,
        args: &Range<u32>,
    ) -> Emit<()> {
        let operands = (self.tape.args(slot)).slice(args.start as usize..args.end as usize);
        let x = self.operands(&mut chunk.values, vals, operands)?;
        let (mut total, rest) = if args.start == 0 {
            (x[0], &x[1..])
        } else {
            (self.load_slot(vals, slot, "partial")?, &x[..])
        };
        for &xi in rest {
            total = self.builder.build_float_add(total, xi, "")?;
        }
        self.store_slot(out, slot, total)?;
        if args.end as usize == self.tape.args(slot).len() {
            total.set_name(&format!("n{}", slot.0));
            chunk.values.insert(slot, total);
        }
        Ok(())
    }

    /// Backward over `range` in reverse slot order.
    pub(super) fn straight_backward(
        &self,
        chunk: &mut BackwardChunk<'ctx>,
        frame: Frame<'ctx>,
        range: &Range<u32>,
    ) -> Emit<()> {
        let mut local = Vec::new();
        for slot in range.clone().map(Slot).rev() {
            let op = self.tape.op(slot);
            if op.is_leaf() || !self.tape.takes_grad(slot) {
                continue;
            }
            let g = self.grad_of(chunk, frame, slot)?;
            let x = self.operands(&mut chunk.values, frame.vals, self.tape.args(slot))?;
            let out = self.value_of(&mut chunk.values, frame.vals, slot)?;
            let mut ar = self.scalar_arith();
            op.local_grads(&mut ar, &x, out, g, &mut local);
            ar.finish()?;
            for (a, &d) in self.tape.args(slot).iter().zip(&local) {
                self.add_grad(chunk, frame, a, d)?;
            }
        }
        Ok(())
    }

    /// A sum cut into parts is differentiated whole by its last part: its gradient into
    /// every operand, in operand order, with the operands' running gradients in registers (a
    /// part of its own would store and reload those it shares with other parts, and these
    /// independent additions cost code generation little, unlike the forward's chain).
    pub(super) fn sum_part_backward(
        &self,
        chunk: &mut BackwardChunk<'ctx>,
        frame: Frame<'ctx>,
        slot: Slot,
        args: &Range<u32>,
    ) -> Emit<()> {
        let last = args.end as usize == self.tape.args(slot).len();
        if !last || !self.tape.takes_grad(slot) {
            return Ok(());
        }
        let g = self.grad_of(chunk, frame, slot)?;
        for a in self.tape.args(slot) {
            self.add_grad(chunk, frame, a, g)?;
        }
        Ok(())
    }

    /// `grad[a] += d` in registers, if `a` takes a gradient.
    fn add_grad(
        &self,
        chunk: &mut BackwardChunk<'ctx>,
        frame: Frame<'ctx>,
        a: Slot,
        d: FloatValue<'ctx>,
    ) -> Emit<()> {
        if !self.tape.takes_grad(a) {
            return Ok(());
        }
        let before = self.grad_of(chunk, frame, a)?;
        let after = self
            .builder
            .build_float_add(before, d, &format!("g{}", a.0))?;
        chunk.grads.insert(a, after);
        Ok(())
    }

    /// The gradient of `slot` so far: from this function's registers, else where the plan
    /// says it starts ([`GradStart`]).
    fn grad_of(
        &self,
        chunk: &mut BackwardChunk<'ctx>,
        frame: Frame<'ctx>,
        slot: Slot,
    ) -> Emit<FloatValue<'ctx>> {
        if let Some(&g) = chunk.grads.get(&slot) {
            return Ok(g);
        }
        let start = if chunk.stored.contains(&slot) {
            GradStart::Memory
        } else {
            let steps = frame.steps();
            self.plan
                .grads
                .start(self.tape, slot, frame.function(), steps)
        };
        let g = match start {
            GradStart::Memory => self.load_slot(frame.grads, slot, &format!("g{}", slot.0))?,
            GradStart::One => self.f64_type().const_float(1.0),
            GradStart::Zero => self.f64_type().const_float(0.0),
        };
        chunk.grads.insert(slot, g);
        Ok(g)
    }

    /// Stores every gradient held in registers, in slot order, and forgets them: from here
    /// on memory holds their running values.
    pub(super) fn store_grads(
        &self,
        chunk: &mut BackwardChunk<'ctx>,
        grads: PointerValue<'ctx>,
    ) -> Emit<()> {
        let mut touched: Vec<_> = chunk.grads.drain().collect();
        touched.sort_by_key(|(s, _)| *s);
        for (slot, g) in touched {
            self.store_slot(grads, slot, g)?;
            chunk.stored.insert(slot);
        }
        Ok(())
    }
}

/// Drops the operand loads a function turned out not to need (`add` and `sum` do not read
/// their operands' values in backward), with their address computations, so even O0 code is
/// lean.
pub(super) fn erase_unused_loads<'a, 'ctx: 'a>(values: impl Iterator<Item = &'a FloatValue<'ctx>>) {
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
