//! The exported object's C interface, as IR over the plan's entry points (`forward`,
//! `backward`, `step`), and the math functions those call, defined in the object.
//!
//! Every function takes the caller's workspace first: the values buffer, then the gradients
//! buffer, then the optimizer's state (`Layout`). Inputs, outputs and params move by runs
//! of consecutive addresses (a `memcpy` each) or, past a few runs, through a table of their
//! addresses: a few copies or loops whatever the graph.

use inkwell::attributes::AttributeLoc;
use inkwell::builder::{Builder, BuilderError};
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicMetadataTypeEnum, FloatType, IntType};
use inkwell::values::{FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::AddressSpace;
use strum::IntoEnumIterator;

use super::{ExportParams, Layout};
use crate::error::Result;
use crate::jit::abi::{BACKWARD, FORWARD, STEP};
use crate::jit::compiler::llvm_error;
use crate::jit::ir_arith::{IrArith, MathTable};
use crate::op::MathFn;
use crate::optim::{update_one, Optimizer, Scalars};

type Emit<T> = std::result::Result<T, BuilderError>;

/// Up to this many runs of consecutive addresses are copied run by run, not through a table.
const MAX_COPIED_RUNS: usize = 16;

/// `addresses` as runs of consecutive ones: (first address, length).
fn runs(addresses: &[u32]) -> Vec<(u32, usize)> {
    let mut runs: Vec<(u32, usize)> = Vec::new();
    for &a in addresses {
        match runs.last_mut() {
            Some((start, len)) if *start as usize + *len == a as usize => *len += 1,
            _ => runs.push((a, 1)),
        }
    }
    runs
}

/// What the interface exports, and of which layout.
pub(super) struct CApi<'a> {
    pub prefix: &'a str,
    pub layout: &'a Layout,
    pub training: bool,
    /// Whether `step` is the plan's own (plain SGD, fused into backward).
    pub plain_step: bool,
    pub optimizer: &'a Optimizer,
    pub params_mode: ExportParams,
    /// Whether the target stores a number's least significant byte first.
    pub little_endian: bool,
    /// The target's CPU and features, for every function (LLVM inlines only between
    /// functions of the same target).
    pub attributes: (&'a str, &'a str),
}

/// Defines each math function the plan's code declares: ours as their [`MathFn::formula`]
/// (the operations the interpreter runs), the rest as a call to the C library's.
pub(super) fn define_math<'ctx>(context: &'ctx Context, module: &Module<'ctx>) -> Result<()> {
    let builder = context.create_builder();
    let f64t = context.f64_type();
    let math = math_table(module);
    let emit = |m: MathFn, f: FunctionValue<'ctx>| -> Emit<()> {
        builder.position_at_end(context.append_basic_block(f, "entry"));
        let args: Vec<FloatValue> = f.get_param_iter().map(|p| p.into_float_value()).collect();
        let mut ar = IrArith::<FloatValue>::new(&builder, module, f64t, &math);
        let value = match (m.formula(&mut ar, &args), m.libm()) {
            (Some(v), _) => v,
            (None, Some(name)) => {
                let params = vec![f64t.into(); m.arity()];
                let libm = module.get_function(name).unwrap_or_else(|| {
                    module.add_function(name, f64t.fn_type(&params, false), None)
                });
                let args: Vec<_> = args.iter().map(|&a| a.into()).collect();
                let call = builder.build_call(libm, &args, "")?;
                call.try_as_basic_value()
                    .basic()
                    .ok_or(BuilderError::UnsetPosition)?
                    .into_float_value()
            }
            (None, None) => return Err(BuilderError::UnsetPosition),
        };
        ar.finish()?;
        builder.build_return(Some(&value))?;
        Ok(())
    };
    for (&m, &f) in &math {
        if f.count_basic_blocks() == 0 && m.intrinsic().is_none() {
            emit(m, f).map_err(|e| llvm_error("math definitions", e))?;
        }
    }
    Ok(())
}

/// The module's declaration (or definition) of each math function the plan's code calls.
fn math_table<'ctx>(module: &Module<'ctx>) -> MathTable<'ctx> {
    MathFn::iter()
        .filter_map(|m| module.get_function(m.symbol()).map(|f| (m, f)))
        .collect()
}

/// The IR builder's state while the interface is emitted.
struct Writer<'a, 'ctx> {
    context: &'ctx Context,
    module: &'a Module<'ctx>,
    builder: Builder<'ctx>,
    f64t: FloatType<'ctx>,
    i64t: IntType<'ctx>,
    api: &'a CApi<'a>,
}

impl CApi<'_> {
    /// Defines the interface's functions in `module`; their names.
    pub fn define<'ctx>(
        &self,
        context: &'ctx Context,
        module: &Module<'ctx>,
    ) -> Result<Vec<String>> {
        let w = Writer {
            context,
            module,
            builder: context.create_builder(),
            f64t: context.f64_type(),
            i64t: context.i64_type(),
            api: self,
        };
        w.all().map_err(|e| llvm_error("export interface", e))
    }
}

impl<'a, 'ctx> Writer<'a, 'ctx> {
    fn all(&self) -> Emit<Vec<String>> {
        let mut names = vec![self.init()?, self.forward()?];
        if self.api.params_mode == ExportParams::Buffer {
            names.push(self.move_params("set_params", true)?);
            names.push(self.move_params("get_params", false)?);
        }
        if self.api.training {
            let step = self.step()?;
            names.push(self.train(step)?);
            names.push(step.get_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn ptr(&self) -> inkwell::types::PointerType<'ctx> {
        self.context.ptr_type(AddressSpace::default())
    }

    /// A function `prefix_name` of `params`, returning a `double` or nothing, with its
    /// entry block under the builder.
    fn begin(
        &self,
        name: &str,
        params: &[BasicMetadataTypeEnum<'ctx>],
        returns: bool,
    ) -> FunctionValue<'ctx> {
        let ty = match returns {
            true => self.f64t.fn_type(params, false),
            false => self.context.void_type().fn_type(params, false),
        };
        let name = format!("{}_{name}", self.api.prefix);
        let f = self.module.add_function(&name, ty, Some(Linkage::External));
        let (cpu, features) = self.api.attributes;
        for attribute in [
            self.context.create_string_attribute("target-cpu", cpu),
            self.context
                .create_string_attribute("target-features", features),
        ] {
            f.add_attribute(AttributeLoc::Function, attribute);
        }
        self.builder
            .position_at_end(self.context.append_basic_block(f, "entry"));
        f
    }

    fn param(&self, f: FunctionValue<'ctx>, n: u32) -> PointerValue<'ctx> {
        f.get_nth_param(n)
            .expect("declared above")
            .into_pointer_value()
    }

    fn index(&self, i: u64) -> IntValue<'ctx> {
        self.i64t.const_int(i, false)
    }

    /// `&buf[index]`.
    fn at(&self, buf: PointerValue<'ctx>, index: IntValue<'ctx>) -> Emit<PointerValue<'ctx>> {
        // SAFETY: (of the GEP, not of Rust code) every index is below the workspace's or the
        // caller's array's length the header states.
        unsafe {
            self.builder
                .build_in_bounds_gep(self.f64t, buf, &[index], "")
        }
    }

    fn load(&self, buf: PointerValue<'ctx>, index: IntValue<'ctx>) -> Emit<FloatValue<'ctx>> {
        let p = self.at(buf, index)?;
        Ok(self
            .builder
            .build_load(self.f64t, p, "")?
            .into_float_value())
    }

    fn store(
        &self,
        buf: PointerValue<'ctx>,
        index: IntValue<'ctx>,
        x: FloatValue<'ctx>,
    ) -> Emit<()> {
        let p = self.at(buf, index)?;
        self.builder.build_store(p, x)?;
        Ok(())
    }

    /// The values and gradients buffers, and the state, in the workspace `ws`.
    fn buffers(&self, ws: PointerValue<'ctx>) -> Emit<[PointerValue<'ctx>; 3]> {
        let len = self.api.layout.buffer_len as u64;
        Ok([
            ws,
            self.at(ws, self.index(len))?,
            self.at(ws, self.index(2 * len))?,
        ])
    }

    /// A private constant array, `name` naming one list of addresses (so made once).
    fn table(&self, name: &str, addresses: &[u32]) -> PointerValue<'ctx> {
        if let Some(made) = self.module.get_global(name) {
            return made.as_pointer_value();
        }
        let i32t = self.context.i32_type();
        let values: Vec<_> = addresses
            .iter()
            .map(|&a| i32t.const_int(a as u64, false))
            .collect();
        let init = i32t.const_array(&values);
        let g = self.module.add_global(init.get_type(), None, name);
        g.set_initializer(&init);
        g.set_constant(true);
        g.set_linkage(Linkage::Private);
        g.set_unnamed_addr(true);
        g.as_pointer_value()
    }

    /// `body(i)` for `i` in `0..n`.
    fn each(
        &self,
        f: FunctionValue<'ctx>,
        n: IntValue<'ctx>,
        mut body: impl FnMut(IntValue<'ctx>) -> Emit<()>,
    ) -> Emit<()> {
        let before = self
            .builder
            .get_insert_block()
            .ok_or(BuilderError::UnsetPosition)?;
        let [head, inside, done] =
            ["head", "body", "done"].map(|b| self.context.append_basic_block(f, b));
        self.builder.build_unconditional_branch(head)?;
        self.builder.position_at_end(head);
        let i = self.builder.build_phi(self.i64t, "i")?;
        i.add_incoming(&[(&self.index(0), before)]);
        let i_value = i.as_basic_value().into_int_value();
        let more = self
            .builder
            .build_int_compare(inkwell::IntPredicate::ULT, i_value, n, "")?;
        self.builder.build_conditional_branch(more, inside, done)?;
        self.builder.position_at_end(inside);
        body(i_value)?;
        let next = self.builder.build_int_add(i_value, self.index(1), "")?;
        let end = self
            .builder
            .get_insert_block()
            .ok_or(BuilderError::UnsetPosition)?;
        i.add_incoming(&[(&next, end)]);
        self.builder.build_unconditional_branch(head)?;
        self.builder.position_at_end(done);
        Ok(())
    }

    /// `to[table[i]] = from[i]` (`scatter`) or `to[i] = from[table[i]]`, for every entry.
    fn copy(
        &self,
        f: FunctionValue<'ctx>,
        name: &str,
        addresses: &[u32],
        from: PointerValue<'ctx>,
        to: PointerValue<'ctx>,
        scatter: bool,
    ) -> Emit<()> {
        if addresses.is_empty() {
            return Ok(());
        }
        // Side by side (a program's inputs, a layer's params): one copy per run.
        let runs = runs(addresses);
        if runs.len() <= MAX_COPIED_RUNS {
            for (at, (start, len)) in runs.into_iter().scan(0, |at, run| {
                let here = *at;
                *at += run.1;
                Some((here, run))
            }) {
                let (mine, theirs) = (self.index(at as u64), self.index(start as u64));
                let (from, to) = match scatter {
                    true => (self.at(from, mine)?, self.at(to, theirs)?),
                    false => (self.at(from, theirs)?, self.at(to, mine)?),
                };
                self.builder
                    .build_memcpy(to, 8, from, 8, self.index(8 * len as u64))
                    .map_err(|_| BuilderError::UnsetPosition)?;
            }
            return Ok(());
        }
        let table = self.table(name, addresses);
        let i32t = self.context.i32_type();
        self.each(f, self.index(addresses.len() as u64), |i| {
            // SAFETY: (of the GEP) `i` is below the table's length.
            let entry = unsafe { self.builder.build_in_bounds_gep(i32t, table, &[i], "")? };
            let address = self.builder.build_load(i32t, entry, "")?.into_int_value();
            let address = self.builder.build_int_z_extend(address, self.i64t, "")?;
            let (read, write) = if scatter { (i, address) } else { (address, i) };
            let x = self.load(from, read)?;
            self.store(to, write, x)
        })
    }

    /// `init(workspace)`: the constants (and frozen params) written, everything else 0.
    fn init(&self) -> Emit<String> {
        let f = self.begin("init", &[self.ptr().into()], false);
        let ws = self.param(f, 0);
        let layout = self.api.layout;
        let image = layout.image.len() as u64;
        if image > 0 {
            // As bytes in the target's order: one constant, where 40,000 numbers made one
            // by one took a fifth of the export's time.
            let bytes: Vec<u8> = (layout.image.iter())
                .flat_map(|x| match self.api.little_endian {
                    true => x.to_le_bytes(),
                    false => x.to_be_bytes(),
                })
                .collect();
            let init = self.context.const_string(&bytes, false);
            let g = self.module.add_global(init.get_type(), None, "image");
            g.set_initializer(&init);
            g.set_constant(true);
            g.set_alignment(8);
            g.set_linkage(Linkage::Private);
            g.set_unnamed_addr(true);
            let bytes = self.index(8 * image);
            self.builder
                .build_memcpy(ws, 8, g.as_pointer_value(), 8, bytes)
                .map_err(|_| BuilderError::UnsetPosition)?;
        }
        let rest = layout.workspace_doubles() as u64 - image;
        if rest > 0 {
            let from = self.at(ws, self.index(image))?;
            let zero = self.context.i8_type().const_zero();
            self.builder
                .build_memset(from, 8, zero, self.index(8 * rest))
                .map_err(|_| BuilderError::UnsetPosition)?;
        }
        self.builder.build_return(None)?;
        Ok(f.get_name().to_string_lossy().into_owned())
    }

    /// The plan's entry point `name`.
    fn entry(&self, name: &str) -> Emit<FunctionValue<'ctx>> {
        self.module
            .get_function(name)
            .ok_or(BuilderError::UnsetPosition)
    }

    /// The loss as the values buffer holds it, or NaN.
    fn loss(&self, vals: PointerValue<'ctx>) -> Emit<FloatValue<'ctx>> {
        match self.api.layout.loss {
            Some((at, _)) => self.load(vals, self.index(at as u64)),
            None => Ok(self.f64t.const_float(f64::NAN)),
        }
    }

    /// The inputs (`inputs[0..NUM_INPUTS]`) into the values buffer.
    fn set_inputs(
        &self,
        f: FunctionValue<'ctx>,
        inputs: PointerValue<'ctx>,
        vals: PointerValue<'ctx>,
    ) -> Emit<()> {
        let addresses = &self.api.layout.inputs;
        self.copy(f, "input_addresses", addresses, inputs, vals, true)
    }

    /// `forward(workspace, inputs, outputs)`: the loss (NaN without one).
    fn forward(&self) -> Emit<String> {
        let ptr = self.ptr().into();
        let f = self.begin("forward", &[ptr, ptr, ptr], true);
        let (ws, inputs, outputs) = (self.param(f, 0), self.param(f, 1), self.param(f, 2));
        let [vals, grads, _] = self.buffers(ws)?;
        self.set_inputs(f, inputs, vals)?;
        self.builder
            .build_call(self.entry(FORWARD.name)?, &[vals.into(), grads.into()], "")?;
        self.copy(
            f,
            "output_addresses",
            &self.api.layout.outputs,
            vals,
            outputs,
            false,
        )?;
        let loss = self.loss(vals)?;
        self.builder.build_return(Some(&loss))?;
        Ok(f.get_name().to_string_lossy().into_owned())
    }

    /// `set_params(workspace, params)` (`into`) or `get_params(workspace, params)`.
    fn move_params(&self, name: &str, into: bool) -> Emit<String> {
        let ptr = self.ptr().into();
        let f = self.begin(name, &[ptr, ptr], false);
        let (ws, params) = (self.param(f, 0), self.param(f, 1));
        let addresses = &self.api.layout.params;
        match into {
            true => self.copy(f, "param_addresses", addresses, params, ws, true)?,
            false => self.copy(f, "param_addresses", addresses, ws, params, false)?,
        }
        self.builder.build_return(None)?;
        Ok(f.get_name().to_string_lossy().into_owned())
    }

    /// `step(workspace, inputs, lr)`: set the inputs, zero the params' gradients, forward,
    /// backward, update; the loss before the update.
    fn step(&self) -> Emit<FunctionValue<'ctx>> {
        let ptr = self.ptr().into();
        let f = self.begin("step", &[ptr, ptr, self.f64t.into()], true);
        let (ws, inputs) = (self.param(f, 0), self.param(f, 1));
        let lr = f.get_nth_param(2).expect("declared").into_float_value();
        let [vals, grads, state] = self.buffers(ws)?;
        let buffers = [vals.into(), grads.into()];
        self.set_inputs(f, inputs, vals)?;
        // (A leaf loss, a param, is read before the update changes it.)
        let before = self.loss(vals)?;
        if self.api.plain_step {
            let args = [vals.into(), grads.into(), lr.into()];
            self.builder.build_call(self.entry(STEP.name)?, &args, "")?;
        } else {
            let params_len = self.api.layout.params_len as u64;
            let zero = self.context.i8_type().const_zero();
            self.builder
                .build_memset(grads, 8, zero, self.index(8 * params_len))
                .map_err(|_| BuilderError::UnsetPosition)?;
            self.builder
                .build_call(self.entry(FORWARD.name)?, &buffers, "")?;
            self.builder
                .build_call(self.entry(BACKWARD.name)?, &buffers, "")?;
            self.update(f, vals, grads, state, lr)?;
        }
        let loss = match self.api.layout.loss {
            Some((_, true)) => before,
            _ => self.loss(vals)?,
        };
        self.builder.build_return(Some(&loss))?;
        Ok(f)
    }

    /// The optimizer's step over the params' addresses ([`update_one`], as the JIT's
    /// `Stepper` runs it): its count in `state[0]`, its buffers after.
    fn update(
        &self,
        f: FunctionValue<'ctx>,
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        state: PointerValue<'ctx>,
        lr: FloatValue<'ctx>,
    ) -> Emit<()> {
        let math = math_table(self.module);
        let mut ar = IrArith::<FloatValue>::new(&self.builder, self.module, self.f64t, &math);
        let zero = self.index(0);
        let steps = self.load(state, zero)?;
        let t = self
            .builder
            .build_float_add(steps, self.f64t.const_float(1.0), "t")?;
        self.store(state, zero, t)?;
        let s = Scalars::compute(&mut ar, self.optimizer(), t, lr);
        let len = self.api.layout.params_len as u64;
        let buffers = self.optimizer().buffer_names().len() as u64;
        self.each(f, self.index(len), |i| {
            let p = self.load(vals, i)?;
            let g = self.load(grads, i)?;
            let mut at = Vec::new();
            let mut entries = Vec::new();
            for b in 0..buffers {
                let offset = self.builder.build_int_add(i, self.index(1 + b * len), "")?;
                entries.push(self.load(state, offset)?);
                at.push(offset);
            }
            let p = update_one(&mut ar, self.optimizer(), &s, p, g, &mut entries);
            self.store(vals, i, p)?;
            for (offset, x) in at.into_iter().zip(entries) {
                self.store(state, offset, x)?;
            }
            Ok(())
        })?;
        ar.finish()
    }

    fn optimizer(&self) -> &Optimizer {
        self.api.optimizer
    }

    /// `train(workspace, inputs, n, lr, losses)`: `step` on each of `n` samples, each loss
    /// into `losses` (which may be NULL).
    fn train(&self, step: FunctionValue<'ctx>) -> Emit<String> {
        let ptr = self.ptr().into();
        let params = [ptr, ptr, self.i64t.into(), self.f64t.into(), ptr];
        let f = self.begin("train", &params, false);
        let (ws, inputs) = (self.param(f, 0), self.param(f, 1));
        let n = f.get_nth_param(2).expect("declared").into_int_value();
        let lr = f.get_nth_param(3).expect("declared").into_float_value();
        let losses = self.param(f, 4);
        let width = self.index(self.api.layout.inputs.len() as u64);
        let keep = self.builder.build_is_not_null(losses, "")?;
        self.each(f, n, |i| {
            let offset = self.builder.build_int_mul(i, width, "")?;
            let sample = self.at(inputs, offset)?;
            let args = [ws.into(), sample.into(), lr.into()];
            let call = self.builder.build_call(step, &args, "")?;
            let loss = call
                .try_as_basic_value()
                .basic()
                .ok_or(BuilderError::UnsetPosition)?
                .into_float_value();
            let [store, next] = ["store", "next"].map(|b| self.context.append_basic_block(f, b));
            self.builder.build_conditional_branch(keep, store, next)?;
            self.builder.position_at_end(store);
            self.store(losses, i, loss)?;
            self.builder.build_unconditional_branch(next)?;
            self.builder.position_at_end(next);
            Ok(())
        })?;
        self.builder.build_return(None)?;
        Ok(f.get_name().to_string_lossy().into_owned())
    }
}
