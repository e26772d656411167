//! The JIT boundary: host target, LLVM passes, the execution engine, and the native
//! functions. This is the only module with `unsafe` code.
//!
//! **Invariant:** a [`Native`] owns the LLVM context, module and engine its function pointers
//! point into, and drops them only when it is dropped itself; the pointers are private and
//! called only through `&mut Native`, so no compiled function can run after its engine is gone.

use std::cell::{Cell, UnsafeCell};
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Once;
use std::time::Instant;

use inkwell::context::Context;
use inkwell::execution_engine::ExecutionEngine;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, InitializationConfig, RelocMode, Target, TargetMachine};
use inkwell::OptimizationLevel;

use super::emit::{Emitter, HostCpu, Lowered, BACKWARD, FORWARD, MATERIALIZE, STEP, TRAIN, UPDATE};
use super::{JitBuilder, JitStats};
use crate::error::{Error, Result};
use crate::op::MathFn;
use crate::plan::Plan;
use crate::program::initial_buffers;
use crate::tape::Tape;
use strum::IntoEnumIterator;

type PassFn = unsafe extern "C" fn(*mut f64, *mut f64);
type UpdateFn = unsafe extern "C" fn(*mut f64, *mut f64, f64);
type TrainFn = unsafe extern "C" fn(*mut f64, *mut f64, f64, *const f64, i64, *mut f64);

fn llvm_error(stage: &'static str, message: impl ToString) -> Error {
    Error::Llvm {
        stage,
        message: message.to_string(),
    }
}

/// Initializes the native target and sets LLVM's global codegen options, once per process.
///
/// Both options are about compile time on long straight-line blocks: the post-RA scheduler and
/// SelectionDAG's huge-region handling are superlinear there and buy no run time on this code.
fn initialize_llvm() -> Result<()> {
    static INIT: Once = Once::new();
    static mut INIT_ERROR: Option<String> = None;
    INIT.call_once(|| {
        if let Err(e) = Target::initialize_native(&InitializationConfig::default()) {
            // SAFETY: written only here, inside call_once, before any read below.
            unsafe { INIT_ERROR = Some(e) };
            return;
        }
        let args = [
            c"tapejit",
            c"-post-RA-scheduler=false",
            c"-dag-maps-huge-region=64",
        ];
        let argv: Vec<_> = args.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: argv holds NUL-terminated static strings; called once, before any pass runs.
        unsafe {
            inkwell::llvm_sys::support::LLVMParseCommandLineOptions(
                argv.len() as i32,
                argv.as_ptr(),
                std::ptr::null(),
            )
        };
    });
    // SAFETY: call_once has completed, so INIT_ERROR is no longer written.
    match unsafe { (*std::ptr::addr_of!(INIT_ERROR)).clone() } {
        Some(e) => Err(llvm_error("target initialization", e)),
        None => Ok(()),
    }
}

fn host_cpu() -> HostCpu {
    HostCpu {
        name: TargetMachine::get_host_cpu_name().to_string(),
        features: TargetMachine::get_host_cpu_features().to_string(),
    }
}

fn host_target_machine(cpu: &HostCpu, level: OptimizationLevel) -> Result<TargetMachine> {
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| llvm_error("target lookup", e))?;
    target
        .create_target_machine(
            &triple,
            &cpu.name,
            &cpu.features,
            level,
            RelocMode::Default,
            CodeModel::JITDefault,
        )
        .ok_or_else(|| llvm_error("target machine", "cannot create a machine for the host"))
}

/// Compiled native code and everything it lives in.
pub struct Native {
    /// One value and one gradient per slot; the only memory the native code touches.
    vals: Vec<f64>,
    /// In a cell because reading gradients (a `&self` method) may first have to store the
    /// ones `step` deferred (`pending`).
    grads: UnsafeCell<Vec<f64>>,
    /// `step` deferred gradients to `materialize`; nothing has read `grads` since.
    pending: Cell<bool>,
    /// Whether `step` defers any gradient.
    defers: bool,
    /// The numbers per sample `train` reads: the tape's `num_inputs`, which the code was
    /// compiled for.
    sample_width: usize,
    entries: Entries,
    // Dropped in this order by `Drop`: module handle, engine (which frees the module), context.
    module: ManuallyDrop<Module<'static>>,
    engine: ManuallyDrop<ExecutionEngine<'static>>,
    context: NonNull<Context>,
}

/// The entry points' machine code (see `emit/mod.rs` for their signatures).
struct Entries {
    forward: PassFn,
    backward: PassFn,
    update: UpdateFn,
    step: UpdateFn,
    materialize: PassFn,
    train: Option<TrainFn>,
}

// SAFETY: the LLVM context, module and engine are used by one thread at a time (every use
// goes through `&mut Native` or `&Native` for read-only printing) and hold no thread-locals.
unsafe impl Send for Native {}

impl Drop for Native {
    fn drop(&mut self) {
        // SAFETY: each field is dropped exactly once, users before what they borrow: the module
        // handle and the engine both borrow the context, which was leaked from a Box in
        // `compile` and is reclaimed last. The function pointers die with `self`.
        unsafe {
            ManuallyDrop::drop(&mut self.module);
            ManuallyDrop::drop(&mut self.engine);
            drop(Box::from_raw(self.context.as_ptr()));
        }
    }
}

impl Native {
    /// Lowers, verifies, optimizes and JITs `tape`, filling in `stats`.
    pub fn compile(
        tape: &Tape,
        plan: &Plan,
        options: &JitBuilder,
        stats: &mut JitStats,
    ) -> Result<Native> {
        initialize_llvm()?;
        let context = NonNull::from(Box::leak(Box::new(Context::create())));
        // SAFETY: the context lives until `Native::drop` (or the error path below) frees it,
        // after everything that borrows it; 'static is never observable outside this module.
        let ctx: &'static Context = unsafe { context.as_ref() };
        let built = Self::build(ctx, tape, plan, options, stats);
        match built {
            Ok((module, engine, entries)) => {
                let defers = plan.step.as_ref().is_some_and(|s| !s.deferred.is_empty());
                let (vals, grads) = initial_buffers(tape);
                Ok(Native {
                    vals,
                    grads: UnsafeCell::new(grads),
                    pending: Cell::new(false),
                    defers,
                    sample_width: tape.num_inputs(),
                    entries,
                    module: ManuallyDrop::new(module),
                    engine: ManuallyDrop::new(engine),
                    context,
                })
            }
            Err(e) => {
                // SAFETY: `build` has returned and dropped everything that borrowed the context.
                drop(unsafe { Box::from_raw(context.as_ptr()) });
                Err(e)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn build(
        ctx: &'static Context,
        tape: &Tape,
        plan: &Plan,
        options: &JitBuilder,
        stats: &mut JitStats,
    ) -> Result<(Module<'static>, ExecutionEngine<'static>, Entries)> {
        let cpu = host_cpu();
        let start = Instant::now();
        let Lowered { module, trains } = Emitter::new(ctx, tape, plan, &cpu)
            .emit()
            .map_err(|e| llvm_error("IR emission", e))?;
        module
            .verify()
            .map_err(|e| llvm_error("module verification", e))?;
        stats.ir_build_secs = start.elapsed().as_secs_f64();

        let start = Instant::now();
        let machine = host_target_machine(&cpu, options.codegen_level())?;
        module.set_triple(&machine.get_triple());
        module.set_data_layout(&machine.get_target_data().get_data_layout());
        if let Some(pipeline) = options.effective_pipeline() {
            module
                .run_passes(&pipeline, &machine, PassBuilderOptions::create())
                .map_err(|e| llvm_error("optimization", e))?;
        }
        stats.optimize_secs = start.elapsed().as_secs_f64();
        stats.ir_instructions = count_instructions(&module);
        stats.functions = module
            .get_functions()
            .filter(|f| f.count_basic_blocks() > 0)
            .count();

        let start = Instant::now();
        let engine = module
            .create_jit_execution_engine(options.codegen_level())
            .map_err(|e| llvm_error("execution engine", e))?;
        for math in MathFn::iter() {
            if let Some(f) = module.get_function(math.symbol()) {
                engine.add_global_mapping(&f, math.address());
            }
        }
        let address = |name| {
            engine
                .get_function_address(name)
                .map_err(|e| llvm_error("symbol lookup", e))
        };
        // MCJIT generates machine code for the whole module on the first lookup.
        let (forward, backward) = (address(FORWARD)?, address(BACKWARD)?);
        let (update, step) = (address(UPDATE)?, address(STEP)?);
        let materialize = address(MATERIALIZE)?;
        let train = if trains { Some(address(TRAIN)?) } else { None };
        stats.codegen_secs = start.elapsed().as_secs_f64();
        // SAFETY: the addresses are of functions the lowering defined with exactly these
        // signatures (see `lower`), and they stay valid while `engine` lives.
        let entries = unsafe {
            Entries {
                forward: std::mem::transmute::<usize, PassFn>(forward),
                backward: std::mem::transmute::<usize, PassFn>(backward),
                update: std::mem::transmute::<usize, UpdateFn>(update),
                step: std::mem::transmute::<usize, UpdateFn>(step),
                materialize: std::mem::transmute::<usize, PassFn>(materialize),
                train: train.map(|t| std::mem::transmute::<usize, TrainFn>(t)),
            }
        };
        Ok((module, engine, entries))
    }

    pub fn values(&self) -> &[f64] {
        &self.vals
    }

    /// The gradients, after storing any that `step` deferred.
    pub fn grads(&self) -> &[f64] {
        self.materialize();
        // SAFETY: `materialize` has returned; from here on no `&self` method writes `grads`
        // until a `&mut self` method (which ends this borrow) sets `pending` again.
        unsafe { &*self.grads.get() }
    }

    /// Both buffers, for writing (deferred gradients stored first).
    pub fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]) {
        self.materialize();
        (&mut self.vals, self.grads.get_mut())
    }

    /// Stores the gradients `step` deferred, if it did and they are still pending. They
    /// depend on values and sum gradients every other entry point may change, so each of
    /// them (and every reader of `grads`) calls this first.
    fn materialize(&self) {
        if self.pending.replace(false) {
            // SAFETY: as in `forward`; `materialize` only reads `vals` (so the `*mut` made
            // from a shared borrow is never written through) and writes `grads`, to which
            // no reference exists while `pending` is set: `pending` is set only by
            // `step(&mut self)`, and every path that hands out a borrow of `grads` clears it
            // (here) first.
            unsafe {
                let grads = (*self.grads.get()).as_mut_ptr();
                (self.entries.materialize)(self.vals.as_ptr() as *mut f64, grads)
            }
        }
    }

    /// Forgets deferred gradients: the caller is about to run `step`, which recomputes them.
    pub fn discard_deferred(&mut self) {
        self.pending.set(false);
    }

    /// Runs `forward` over the buffers.
    pub fn forward(&mut self) {
        let f = self.entries.forward;
        let (vals, grads) = self.buffers_mut();
        // SAFETY: the code reads and writes slots below the tape length only, both buffers
        // have that length (they are never resized), and the engine is alive (owned by self).
        unsafe { f(vals.as_mut_ptr(), grads.as_mut_ptr()) }
    }

    /// Runs `backward` over the buffers.
    pub fn backward(&mut self) {
        let f = self.entries.backward;
        let (vals, grads) = self.buffers_mut();
        // SAFETY: as in `forward`.
        unsafe { f(vals.as_mut_ptr(), grads.as_mut_ptr()) }
    }

    /// Runs `update` over the buffers.
    pub fn update(&mut self, lr: f64) {
        let f = self.entries.update;
        let (vals, grads) = self.buffers_mut();
        // SAFETY: as in `forward`.
        unsafe { f(vals.as_mut_ptr(), grads.as_mut_ptr(), lr) }
    }

    /// Runs `train` over the samples of `inputs` and returns their losses; `None` if the
    /// module has no `train`, or if `inputs` is not a whole number `>= 1` of samples of the
    /// width the code was compiled for.
    pub fn train(&mut self, inputs: &[f64], lr: f64) -> Option<Vec<f64>> {
        let train = self.entries.train?;
        let width = self.sample_width;
        let n = inputs.len().checked_div(width).filter(|&n| n >= 1)?;
        if n * width != inputs.len() {
            return None;
        }
        let mut losses = vec![0.0; n];
        self.pending.set(false);
        let (vals, grads) = (self.vals.as_mut_ptr(), self.grads.get_mut().as_mut_ptr());
        // SAFETY: as in `forward`; `train` reads `n * sample_width` numbers of `inputs` (its
        // length, checked above) and writes `n` losses.
        unsafe {
            train(
                vals,
                grads,
                lr,
                inputs.as_ptr(),
                n as i64,
                losses.as_mut_ptr(),
            )
        }
        self.pending.set(self.defers);
        Some(losses)
    }

    /// Runs `step` (zero_grad, forward, backward, update) over the buffers. The gradients it
    /// defers replace any still pending (it recomputes every gradient).
    pub fn step(&mut self, lr: f64) {
        self.pending.set(false);
        let (vals, grads) = (self.vals.as_mut_ptr(), self.grads.get_mut().as_mut_ptr());
        // SAFETY: as in `forward`.
        unsafe { (self.entries.step)(vals, grads, lr) }
        self.pending.set(self.defers);
    }

    /// The module's IR, after optimization.
    pub fn ir(&self) -> String {
        self.module.print_to_string().to_string()
    }
}

fn count_instructions(module: &Module<'_>) -> usize {
    module
        .get_functions()
        .flat_map(|f| f.get_basic_block_iter())
        .map(|b| b.get_instructions().count())
        .sum()
}
