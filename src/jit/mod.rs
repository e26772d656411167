//! The JIT: lowers a tape to LLVM IR in-process and runs it as native code.
//!
//! `emit` turns the tape and its plan into IR modules, `compiler` optimizes each for the host
//! CPU and compiles it to an object file (modules side by side on several threads), `engine`
//! links the objects and owns the code; [`Jit`] ties them to the [`crate::Program`] API.

mod abi;
mod cache;
mod compiler;
mod emit;
mod engine;
mod export;
mod ir_arith;
mod options;
mod tiers;

pub use cache::{Cache, DEFAULT_SIZE as DEFAULT_CACHE_SIZE};
pub use export::{ExportOptions, ExportParams, ExportTarget, Exported};
pub use options::{JitBuilder, JitStats, NestStats, OptLevel, Tier, Tiering, MIN_LOOP_RUN};

use std::time::Instant;

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::kernels::Kernels;
use crate::optim::Stepper;
use crate::passes::schedule::Schedule;
use crate::passes::{layout, loops as recovery};
use crate::plan::{PerSlot, Plan, PlanOptions};
use crate::program::{Backend, Program};
use crate::tape::{Slot, Tape};
use emit::LazyEntry;
use engine::Native;
use tiers::{Background, Compiled, Engine};

impl JitBuilder {
    /// Linearizes and compiles `graph`.
    pub fn compile(&self, graph: &Graph) -> Result<Jit> {
        self.compile_tape(Tape::from_graph(graph)?)
    }

    /// Compiles an already linearized tape. (A `Tape` is verified when it is built and
    /// cannot be changed afterwards, so it is not checked again here.) With
    /// [`Tiering::Auto`] it returns once the first tier is ready and compiles native code in
    /// the background.
    pub fn compile_tape(&self, tape: Tape) -> Result<Jit> {
        let start = Instant::now();
        let first_tier = match self.tiering {
            Tiering::Off => false,
            Tiering::FirstTierOnly => true,
            Tiering::Auto => tape.copies().is_none() && !self.keep_ir,
        };
        if !first_tier {
            let compiled = self.compile_native(tape.clone(), start)?;
            return Jit::new(tape, self, Engine::Native(Box::new(compiled)), None, start);
        }
        // The compile starts first, so that it runs beside the first tier's preparation.
        // (What it asks LLVM before it may enter it is asked here.)
        compiler::host_avx512();
        let background = match self.tiering {
            Tiering::FirstTierOnly => None,
            _ => match Background::start(self, tape.clone(), start) {
                Some(background) => Some(background),
                // (No thread to spare: compiled here and now.)
                None => return self.clone().tiering(Tiering::Off).compile_tape(tape),
            },
        };
        let kernels = Kernels::new(&tape);
        let (runs, fused) = (kernels.stats().runs, kernels.stats().fused);
        let engine = Engine::Kernels(Box::new(kernels));
        let mut jit = Jit::new(tape, self, engine, background, start)?;
        jit.stats.first_tier_secs = start.elapsed().as_secs_f64();
        jit.stats.first_tier_op_runs = runs;
        jit.stats.first_tier_fused = fused;
        Ok(jit)
    }

    /// Compiles `tape` to native code (the clock started at `start`): loop recovery, param
    /// layout, the plan, LLVM.
    fn compile_native(&self, tape: Tape, start: Instant) -> Result<Compiled> {
        let keyed = self.with_cache_source(&tape);
        let built: Vec<Slot> = tape.param_slots().to_vec();
        let (tape, schedule) = self.schedule_native(tape)?;
        if self.cancelled() {
            return Err(called_off());
        }
        let mut compiled = keyed.compile_schedule(tape, schedule, start)?;
        if self.compile_ahead && !self.cancelled() {
            for module in compiled.link_ahead(self.threads())? {
                compiled.stats.add_lazy_module(&module);
            }
            compiled.stats.compile_secs = start.elapsed().as_secs_f64();
        }
        // Param k sat in slot built[k] as built, and sits in param_slots()[k] now.
        let now = compiled.tape.param_slots();
        if now != built.as_slice() {
            let mut moved = vec![0u32; built.len()];
            for (b, n) in built.iter().zip(now) {
                moved[b.index()] = n.0;
            }
            compiled.stats.moved_params = built.iter().zip(now).filter(|(b, n)| b != n).count();
            compiled.native.set_moved_params(moved);
        }
        Ok(compiled)
    }

    /// `tape` as native code runs it: its loops recovered, and its params moved where the
    /// loops read them (`Tape::param_slots` says where each one went).
    fn schedule_native(&self, tape: Tape) -> Result<(Tape, Schedule)> {
        let schedule = std::thread::scope(|scope| {
            // The planning passes ask who reads each slot; a second core counts it while
            // recovery scans (a batch of copies has millions of slots).
            if self.threads() > 1 && self.loop_recovery {
                scope.spawn(|| tape.consumers());
            }
            recovery::schedule(&tape, self.loop_recovery)
        });
        layout::apply(tape, schedule)
    }

    /// The plan's options from this builder's, for a CPU with or without AVX-512.
    fn plan_options(&self, avx512: bool) -> PlanOptions {
        PlanOptions {
            chunk_size: self.chunk_size,
            fast_math: self.fast_math,
            zero_skipping: self.zero_skipping,
            host_avx512: avx512,
        }
    }

    /// Plans, verifies and compiles `tape` as `schedule` lays it out (scheduling began at
    /// `start`). Any schedule is safe here: `Plan::new` verifies the plan it makes and
    /// refuses one that does not compute the tape.
    fn compile_schedule(&self, tape: Tape, schedule: Schedule, start: Instant) -> Result<Compiled> {
        let mut stats = JitStats {
            tape_nodes: tape.len(),
            op_nodes: tape.op_nodes(),
            ..JitStats::default()
        };
        let plan = Plan::new(&tape, &schedule, self.plan_options(compiler::host_avx512()))?;
        stats.schedule_secs = start.elapsed().as_secs_f64();
        stats.loops = plan.loops;
        stats.loop_nodes = plan.loop_nodes;
        stats.nest_depth = plan.nest_depth;
        stats.nests = plan
            .functions
            .iter()
            .flat_map(|f| NestStats::of(f, &plan.nests))
            .collect();
        stats.modules = plan.modules.len();
        stats.buffered_slots = plan.buffers.buffer_len();
        stats.local_grads = plan.grads.local.count();
        stats.local_values = plan.local_values.count();
        stats.stored_first_additions = plan.grads.stored_count();
        stats.constant_operands = plan.constants.count();
        stats.split_rows = plan.split.as_ref().map_or(0, |s| s.rows);
        if let Some(step) = &plan.step {
            stats.fused_updates = step.fused.iter().filter(|&&f| f).count();
            stats.deferred_grads = (0..tape.num_params()).filter(|&s| step.defers(s)).count();
            stats.merged_train = step.train.is_some();
            stats.zero_skipping = step.train.as_ref().is_some_and(|t| t.skip_zeros.is_some());
        }
        stats.compile_threads = self.threads().min(plan.modules.len());
        if let Some(state) = &self.background {
            // (Native code is worth its compile once the first tier has run about as long.)
            let estimate = match compiler::all_cached(&plan, self) {
                true => std::time::Duration::ZERO,
                false => tiers::compile_estimate(
                    self.opt_level,
                    self.codegen_level(),
                    tape.op_nodes() - plan.loop_nodes,
                ),
            };
            let deferred = Instant::now();
            if !state.wait_until_worth(estimate) {
                return Err(called_off());
            }
            stats.compile_deferred_secs = deferred.elapsed().as_secs_f64();
        }
        // (A background compile touches LLVM from here on only: before, the host's features
        // come from the first ask, on the program's thread.)
        if !self.enter_llvm() {
            return Err(called_off());
        }
        let native = Native::compile(&tape, &plan, self, stats.compile_threads, &mut stats)?;
        stats.compile_secs = start.elapsed().as_secs_f64();
        // (Per slot only where there are locals: a batch of copies has millions of slots.)
        let (values, grads) = (&plan.local_values, &plan.grads.local);
        let kept = match values.count() {
            0 => plan.kept.clone(),
            _ => PerSlot::from_fn(tape.len(), plan.copies.as_ref(), |s| {
                plan.kept.get(s) && !values.is_local(Slot(s as u32))
            }),
        };
        let local_grads = match grads.count() {
            0 => PerSlot::default(),
            _ => PerSlot::from_fn(tape.len(), plan.copies.as_ref(), |s| {
                grads.is_local(Slot(s as u32))
            }),
        };
        let options = JitBuilder {
            background: None,
            ..self.clone()
        };
        Ok(Compiled {
            unlinked: tape.loss().map(|_| std::sync::Arc::new((plan, options))),
            compiling: None,
            failed: 0,
            native,
            tape,
            kept,
            local_grads,
            stats,
        })
    }
}

/// A tape compiled to native code, with its buffers. Owns everything the code needs: it can
/// be moved and dropped freely, and no compiled function outlives it.
///
/// ```
/// use tapejit::{Graph, Jit, Program};
/// let g = Graph::new();
/// let x = g.input();
/// let w = g.param(3.0);
/// g.set_loss((w * x).powf(2.0)).unwrap();
/// let mut jit = Jit::compile(&g).unwrap();
/// jit.set_inputs(&[2.0]).unwrap();
/// assert_eq!(jit.forward(), 36.0);
/// jit.backward().unwrap();
/// assert_eq!(jit.grad(w).unwrap(), 24.0);
/// ```
///
/// `Jit::compile` returns as soon as the first tier can run ([`Tiering`]); native code
/// compiles on a background thread and takes over between two calls. Every tier computes
/// the same bits; [`Jit::tier`] and [`JitStats`] say which ran.
///
/// Native code is reachable only through a live `Jit`: once it is dropped (or moved), nothing
/// can call into the freed code, and the compiler says so:
///
/// ```compile_fail
/// # use tapejit::{Graph, Jit, Program};
/// # let g = Graph::new();
/// # g.set_loss(g.param(1.0).exp()).unwrap();
/// let mut jit = Jit::compile(&g).unwrap();
/// drop(jit);
/// jit.forward(); // error[E0382]: borrow of moved value: `jit`
/// ```
///
/// A `Jit` is `Send` (pinned by a static assertion below) but not `Sync`: reading gradients
/// through `&Jit` may store the ones `step` deferred, so two threads must not share one:
///
/// ```compile_fail
/// fn assert_sync<T: Sync>() {}
/// assert_sync::<tapejit::Jit>(); // error[E0277]: `UnsafeCell<Vec<f64>>` cannot be shared
/// ```
pub struct Jit {
    /// The tape as built: what every tier's slots speak.
    tape: Tape,
    engine: Engine,
    /// Native code compiling, while the first tier runs.
    background: Option<Background>,
    /// The start of the latest call that recomputes every value, while native code compiles
    /// (the first tier's running time, told to the compile: [`Jit::poll`]).
    last_call: Option<Instant>,
    /// When the compile started (the clock of [`JitStats::native_after_secs`]).
    start: Instant,
    stats: JitStats,
    /// The options it was compiled with (no compile running): what an export compiles with.
    options: JitBuilder,
    /// The optimizer, if not the plain SGD the code fuses, and its state.
    stepper: Stepper,
    /// Anomaly mode ([`crate::anomaly`]).
    detect_anomaly: bool,
}

impl Jit {
    /// Linearizes and compiles `graph` at the default level, O2.
    pub fn compile(graph: &Graph) -> Result<Jit> {
        Jit::builder().compile(graph)
    }

    pub fn builder() -> JitBuilder {
        JitBuilder::default()
    }

    fn new(
        tape: Tape,
        options: &JitBuilder,
        engine: Engine,
        background: Option<Background>,
        start: Instant,
    ) -> Result<Jit> {
        let stats = match &engine {
            Engine::Native(compiled) => compiled.stats.clone(),
            Engine::Kernels(_) => JitStats {
                tape_nodes: tape.len(),
                op_nodes: tape.op_nodes(),
                ..JitStats::default()
            },
        };
        let mut jit = Jit {
            tape,
            engine,
            background,
            last_call: None,
            start,
            stats,
            options: JitBuilder {
                background: None,
                ..options.clone()
            },
            stepper: Stepper::default(),
            detect_anomaly: false,
        };
        if !options.optimizer.is_plain() {
            jit.set_optimizer(options.optimizer)?;
        }
        Ok(jit)
    }

    /// What compiling measured, and which tier ran how many calls. The fields that describe
    /// native code fill in when it takes over.
    pub fn stats(&self) -> &JitStats {
        &self.stats
    }

    pub fn opt_level(&self) -> OptLevel {
        self.options.opt_level
    }

    /// The tier that runs the next call (native code may take over at its start, if it is
    /// ready: see [`Jit::wait_for_native`]).
    pub fn tier(&self) -> Tier {
        match self.engine {
            Engine::Kernels(_) => Tier::Kernels,
            Engine::Native(_) => Tier::Native,
        }
    }

    /// Waits for the native compile running in the background, if one is, and switches to
    /// it; and for `train`'s module, if it compiles on a thread of its own. Its error, if
    /// it failed (the program then goes on as it ran, which computes the same numbers: on the
    /// first tier, or `train` as `step` per sample).
    pub fn wait_for_native(&mut self) -> Result<()> {
        if let Some(background) = self.background.take() {
            self.take_over(background.join())?;
        }
        self.finish_lazy(true)
    }

    /// Switches to native code if its compile has finished (at the start of a call), and
    /// tells the compile how long the first tier has run: the time since the previous such
    /// call (the program's time between calls included, which only starts it sooner).
    fn poll(&mut self) {
        let _ = self.finish_lazy(false);
        let Some(background) = &self.background else {
            return;
        };
        let now = Instant::now();
        if let Some(previous) = self.last_call.replace(now) {
            background.ran_first_tier(now - previous);
        }
        if background.is_finished() {
            let _ = self.wait_for_native();
        }
    }

    /// Links a lazy entry point's module compiled on a thread of its own, if it is ready (or
    /// once it is, if `wait`). A failed one is the error, also kept in
    /// [`JitStats::native_error`]: its method runs on without it (`train` as `step` per
    /// sample, the same numbers).
    fn finish_lazy(&mut self, wait: bool) -> Result<()> {
        let Engine::Native(compiled) = &mut self.engine else {
            return Ok(());
        };
        match compiled.finish_lazy(wait) {
            Ok(Some(linked)) => {
                self.stats.add_lazy_module(&linked.module);
                self.stats.first_use_compile_secs += linked.secs;
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => {
                self.stats.native_error.get_or_insert(e.clone());
                Err(e)
            }
        }
    }

    /// Starts compiling `train`'s module on a thread of its own, unless tiering is off (then
    /// the call that needs it compiles it); whether it compiles so now.
    fn start_lazy_train(&mut self) -> bool {
        match &mut self.engine {
            Engine::Native(c) if self.options.tiering != Tiering::Off => {
                c.start_lazy(LazyEntry::Train)
            }
            _ => false,
        }
    }

    /// Native code takes over from the first tier, carrying every number over.
    fn take_over(&mut self, compiled: Result<Compiled>) -> Result<()> {
        let mut compiled = match compiled {
            Ok(compiled) => Box::new(compiled),
            Err(e) => {
                self.stats.native_error = Some(e.clone());
                return Err(e);
            }
        };
        let Engine::Kernels(kernels) = &self.engine else {
            return Ok(());
        };
        tiers::carry_over(&self.tape, kernels, &mut compiled);
        let state = (!self.stepper.optimizer.is_plain()).then(|| self.optimizer_state());
        let tier_stats = std::mem::take(&mut self.stats);
        self.stats = JitStats {
            first_tier_secs: tier_stats.first_tier_secs,
            first_tier_op_runs: tier_stats.first_tier_op_runs,
            first_tier_fused: tier_stats.first_tier_fused,
            first_tier_passes: tier_stats.first_tier_passes,
            native_passes: tier_stats.native_passes,
            native_after_secs: Some(self.start.elapsed().as_secs_f64()),
            ..compiled.stats.clone()
        };
        self.engine = Engine::Native(compiled);
        if let Some(state) = state {
            // The optimizer's state, from the first tier's addresses to native code's.
            self.stepper = Stepper::new(self.stepper.optimizer, self.params_len());
            self.set_optimizer_state(&state)?;
        }
        Ok(())
    }

    /// Counts a call on the tier that runs it, native code taking over first if ready.
    fn begin_call(&mut self) {
        self.poll();
        self.count_pass();
    }

    /// Counts a pass on the tier that runs it.
    fn count_pass(&mut self) {
        match self.engine {
            Engine::Kernels(_) => self.stats.first_tier_passes += 1,
            Engine::Native(_) => self.stats.native_passes += 1,
        }
    }

    /// Whether `train` runs sample by sample for now, something faster on its way: native
    /// code compiling while the first tier runs, or native `train`'s module compiling.
    fn train_coming(&self) -> bool {
        let compiling = |c: &Compiled| c.is_compiling(LazyEntry::Train);
        self.background.is_some() || self.native().is_some_and(compiling)
    }

    fn native(&self) -> Option<&Compiled> {
        match &self.engine {
            Engine::Native(compiled) => Some(compiled),
            Engine::Kernels(_) => None,
        }
    }

    /// The optimized LLVM IR as text; values are named after slots (`%n17`, `%g17`).
    /// [`Error::IrNotKept`] unless compiled with [`JitBuilder::keep_ir`]`(true)` (which
    /// compiles natively at once).
    ///
    /// ```
    /// use tapejit::{Error, Graph, Jit};
    /// let g = Graph::new();
    /// g.set_loss(g.param(1.0).exp()).unwrap();
    /// assert_eq!(Jit::compile(&g).unwrap().ir(), Err(Error::IrNotKept));
    /// let jit = Jit::builder().keep_ir(true).compile(&g).unwrap();
    /// assert!(jit.ir().unwrap().contains("define void @forward"));
    /// ```
    pub fn ir(&self) -> Result<String> {
        let ir = self.native().and_then(|c| c.native.ir());
        ir.map(String::from).ok_or(Error::IrNotKept)
    }

    /// Writes this program as a relocatable object file at `path` and a C header beside it
    /// (`path` with the extension `.h`): the deployment form, which runs where there is no
    /// LLVM, Python or Rust (it needs the C library's libm only). It computes the bits this
    /// JIT computes on the same CPU: the same plan and emitter, at the level this program
    /// was compiled at. The header documents the entry points; in short (`P` the prefix of
    /// `options`):
    ///
    /// - `void P_init(double *workspace)`, once; the workspace holds `P_WORKSPACE_DOUBLES`
    ///   numbers the caller owns;
    /// - `double P_forward(double *workspace, const double *inputs, double *outputs)`: the
    ///   loss (NaN without one) and the outputs, in the order they were added;
    /// - with [`ExportParams::Buffer`]: `P_set_params`, `P_get_params`, in creation order;
    /// - with [`ExportOptions::training`]: `double P_step(workspace, inputs, lr)` and
    ///   `void P_train(workspace, inputs, n, lr, losses)` by the program's optimizer, its
    ///   state in the workspace (`P_init` writes the state as of the export: training goes
    ///   on where this program stands).
    ///
    /// Frozen params are those of the moment of the call. Bad requests are
    /// [`Error::Export`]: a target LLVM lacks, a path that cannot be written, a prefix that
    /// is not a C identifier, training without params or a loss. A failed export leaves the
    /// files at both paths as they were (none where there was none); a successful one
    /// replaces each whole (written beside it, then renamed).
    ///
    /// ```no_run
    /// # use tapejit::{ExportOptions, Graph, Jit};
    /// let g = Graph::new();
    /// let x = g.input();
    /// g.add_output((g.param(0.5) * x).tanh()).unwrap();
    /// let jit = Jit::compile(&g).unwrap();
    /// jit.export("model.o", &ExportOptions::new("model")).unwrap(); // and model.h
    /// ```
    pub fn export(
        &self,
        path: impl AsRef<std::path::Path>,
        options: &ExportOptions,
    ) -> Result<Exported> {
        let program = export::Snapshot {
            params: self.params(),
            optimizer: self.stepper.optimizer,
            state: self.optimizer_state(),
        };
        export::export(&self.tape, &self.options, &program, path.as_ref(), options)
    }

    /// Compiles and links `entry`'s module if this program runs native code with that entry
    /// point and it is not linked yet. On the first tier, asks the background compile to link
    /// it before native code takes over, so that no call waits for it then.
    fn link_lazy(&mut self, entry: LazyEntry) -> Result<()> {
        let compiled = match &mut self.engine {
            Engine::Native(compiled) => compiled,
            Engine::Kernels(_) => {
                if let Some(background) = &self.background {
                    background.want(entry);
                }
                return Ok(());
            }
        };
        let start = Instant::now();
        if let Some(module) = compiled.link_lazy(entry)? {
            self.stats.add_lazy_module(&module);
            self.stats.first_use_compile_secs += start.elapsed().as_secs_f64();
        }
        Ok(())
    }
}

/// The error of a background compile its program no longer wants.
fn called_off() -> Error {
    compiler::llvm_error("compile", "called off")
}

impl crate::minibatch::Replicas for Jit {
    fn prepare_replicas(&mut self) -> Result<()> {
        self.link_lazy(LazyEntry::Accumulate)
    }
    fn replica(&self) -> Box<dyn crate::minibatch::Replica + '_> {
        match &self.engine {
            Engine::Native(compiled) => Box::new(compiled.native.replica()),
            Engine::Kernels(kernels) => Box::new(kernels.replica()),
        }
    }
    fn workspace(&self) -> &crate::minibatch::Workspace {
        match &self.engine {
            Engine::Native(compiled) => compiled.native.workspace(),
            Engine::Kernels(kernels) => kernels.workspace(),
        }
    }
    fn has_stages(&self) -> bool {
        self.native().is_some_and(|c| c.native.has_stages())
    }
}

/// Forwards a `Backend` hook to the tier that runs.
macro_rules! on_tier {
    ($self:ident, $k:ident => $kernels:expr, $c:ident => $native:expr) => {
        match &$self.engine {
            Engine::Kernels($k) => $kernels,
            Engine::Native($c) => $native,
        }
    };
}

impl Backend for Jit {
    fn program_tape(&self) -> &Tape {
        &self.tape
    }
    fn value_buffer(&self) -> &[f64] {
        on_tier!(self, k => k.values(), c => c.native.values())
    }
    fn grad_buffer(&self) -> &[f64] {
        on_tier!(self, k => k.grads(), c => c.native.grads())
    }
    fn leaf_address(&self, s: Slot) -> usize {
        on_tier!(self, k => k.address(s), c => c.native.address(s))
    }
    fn params_len(&self) -> usize {
        on_tier!(self, _k => self.tape.num_params(), c => c.native.buffers().params_len(&c.tape))
    }
    fn value_at(&self, s: Slot) -> f64 {
        on_tier!(self, k => k.values()[k.address(s)], c => c.native.value_at(s))
    }
    fn grad_at(&self, s: Slot) -> f64 {
        on_tier!(self, k => k.grads()[k.address(s)], c => c.native.grad_at(s))
    }
    fn slot_values(&self) -> &[f64] {
        on_tier!(self, k => &k.in_slot_order().0, c => c.native.slot_values())
    }
    fn slot_grads(&self) -> &[f64] {
        on_tier!(self, k => &k.in_slot_order().1, c => c.native.slot_grads())
    }
    fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]) {
        match &mut self.engine {
            Engine::Kernels(k) => k.buffers_mut(),
            Engine::Native(c) => c.native.buffers_mut(),
        }
    }
    fn keeps(&self, slot: Slot) -> bool {
        on_tier!(self, _k => true, c => c.keeps(slot))
    }
    fn keeps_grad(&self, slot: Slot) -> bool {
        on_tier!(self, _k => true, c => c.keeps_grad(slot))
    }
    fn run_forward(&mut self) {
        self.begin_call();
        match &mut self.engine {
            Engine::Kernels(k) => k.forward(),
            Engine::Native(c) => c.native.forward(),
        }
    }
    fn run_backward(&mut self) {
        // (Never a switch here: backward reads what forward left in this tier's buffers.)
        self.count_pass();
        match &mut self.engine {
            Engine::Kernels(k) => k.backward(),
            Engine::Native(c) => c.native.backward(),
        }
    }
    fn run_update(&mut self, lr: f64) {
        self.count_pass();
        match &mut self.engine {
            Engine::Kernels(k) => k.update(lr),
            Engine::Native(c) => c.native.update(lr),
        }
    }
    fn begin_step(&mut self) {
        // (`run_step` follows, which recomputes everything: a switch point.)
        self.poll();
        if let Engine::Native(c) = &mut self.engine {
            c.native.discard_deferred();
        }
    }
    fn run_step(&mut self, lr: f64) {
        self.count_pass();
        match &mut self.engine {
            Engine::Kernels(k) => k.step(lr),
            Engine::Native(c) => c.native.step(lr),
        }
    }
    fn prepare_train(&mut self) -> Result<()> {
        self.poll();
        if self.start_lazy_train() {
            // (`run_train` steps sample by sample while it compiles.)
            return Ok(());
        }
        self.link_lazy(LazyEntry::Train)
    }
    fn run_minibatches(
        &mut self,
        samples: &crate::Samples<'_>,
        batch: usize,
        lr: f64,
        threads: usize,
    ) -> Result<Vec<f64>> {
        self.begin_call();
        let mut losses = Vec::new();
        let (mut done, n) = (0, samples.len());
        // On the first tier with native code coming, and every input finite (else the one
        // call below finds the first that is not, changing nothing): a minibatch at a time,
        // native code taking over between two (the same numbers as separate calls).
        if self.background.is_some() && samples.check_finite().is_ok() {
            while self.background.is_some() && done < n {
                let minibatch = samples.part(done..(done + batch).min(n));
                losses.extend(crate::minibatch::train(
                    self, &minibatch, batch, lr, threads,
                )?);
                done += minibatch.len();
                self.poll();
            }
        }
        if done < n {
            let rest = samples.part(done..n);
            losses.extend(crate::minibatch::train(self, &rest, batch, lr, threads)?);
        }
        Ok(losses)
    }
    fn stepper(&self) -> &Stepper {
        &self.stepper
    }
    fn stepper_mut(&mut self) -> &mut Stepper {
        &mut self.stepper
    }
    fn anomaly_mode(&self) -> bool {
        self.detect_anomaly
    }
    fn set_anomaly_mode(&mut self, on: bool) {
        self.detect_anomaly = on;
    }
    fn may_change_tier(&self) -> bool {
        self.background.is_some()
    }
    fn run_train(&mut self, inputs: &[f64], lr: f64) -> std::result::Result<Vec<f64>, usize> {
        // (Counted by the passes it runs: the first tier's steps, or native `train` as one.)
        self.poll();
        let width = self.tape.num_inputs();
        let mut losses = Vec::with_capacity(inputs.len() / width.max(1));
        let mut done = 0;
        // On the first tier with native code coming, or on native code while `train`'s
        // module compiles: a sample at a time (`step`), switching between two. (Native
        // `train` compiles its merged layer on first use, on a thread of its own; if that
        // fails, `step` per sample computes the same.)
        while self.train_coming() && done < inputs.len() && width > 0 {
            let sample = &inputs[done..done + width];
            let offset = done / width;
            let trained = crate::program::train_checking_chunks(self, sample, lr);
            losses.extend(trained.map_err(|sample| sample + offset)?);
            done += width;
            self.poll();
            if matches!(self.engine, Engine::Native(_)) && !self.start_lazy_train() {
                let _ = self.link_lazy(LazyEntry::Train);
            }
        }
        let rest = &inputs[done..];
        let trained = match &mut self.engine {
            Engine::Native(c) => c.native.train(rest, lr),
            Engine::Kernels(_) => None,
        };
        if trained.is_some() {
            self.stats.native_passes += 1;
        }
        let trained = match trained {
            Some(trained) => trained,
            None => crate::program::train_checking_chunks(self, rest, lr),
        };
        let offset = done / width.max(1);
        losses.extend(trained.map_err(|sample| sample + offset)?);
        Ok(losses)
    }
}
// `Jit` may move to another thread (it owns everything its code touches), but not be shared:
// reading gradients through `&Jit` may store deferred ones (`Native::grads`).
const _: fn() = || {
    fn assert_send<T: Send>() {}
    assert_send::<Jit>();
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::schedule::Item;
    use crate::plan::ZeroSkipping;
    use crate::{Interpreter, Program};

    /// `graph` compiled as `schedule` says, at every level, against the interpreter: the
    /// same params after a few steps, bit for bit, and the same gradients.
    fn assert_matches_interpreter(graph: &Graph, schedule: impl Fn(&Tape) -> Schedule) {
        let inputs: Vec<f64> = (0..graph.num_inputs())
            .map(|i| (i as f64 * 0.37).sin())
            .collect();
        let mut interp = Interpreter::new(graph).unwrap();
        let mut want = Vec::new();
        for _ in 0..3 {
            want.push(interp.step(&inputs, 0.1).unwrap());
        }
        for level in OptLevel::ALL {
            let tape = Tape::from_graph(graph).unwrap();
            let s = schedule(&tape);
            let builder = Jit::builder().opt_level(level).chunk_size(40);
            let compiled = builder.compile_schedule(tape.clone(), s, Instant::now());
            let engine = Engine::Native(Box::new(compiled.unwrap()));
            let mut jit = Jit::new(tape, &builder, engine, None, Instant::now()).unwrap();
            let got: Vec<f64> = (0..3).map(|_| jit.step(&inputs, 0.1).unwrap()).collect();
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "losses at {level}");
            assert_eq!(
                bits(&jit.params()),
                bits(&interp.params()),
                "params at {level}"
            );
            assert_eq!(
                bits(&jit.param_grads()),
                bits(&interp.param_grads()),
                "grads at {level}"
            );
        }
    }

    /// A nest of nests: `copies` copies of a layer of `width` tanh neurons over `n` inputs
    /// each, sharing weights, scheduled as a nest over the copies whose body is the layer's
    /// nest (as loop recovery finds it for one copy).
    #[test]
    fn nests_of_nests_run_in_the_interpreters_order() {
        let (copies, width, n) = (3usize, 4usize, 9usize);
        let g = Graph::new();
        let w: Vec<Vec<_>> = (0..width)
            .map(|k| {
                (0..n)
                    .map(|i| g.param(((k * n + i) as f64 * 0.1).cos()))
                    .collect()
            })
            .collect();
        let x = g.inputs(copies * n);
        let mut outs = Vec::new();
        for c in 0..copies {
            for row in &w {
                let terms = row.iter().zip(&x[c * n..]).map(|(&wi, &xi)| wi * xi);
                outs.push(g.sum(terms).tanh());
            }
        }
        g.set_loss(g.sum(outs.iter().map(|&o| o * o))).unwrap();
        assert_matches_interpreter(&g, |tape| {
            // Recovery finds the copies: a nest over them whose body is the layer's nest.
            let s = recovery::schedule(tape, true);
            let copies_nest = s.items.iter().find_map(|i| match i {
                Item::Nest(n) if n.count == copies as u32 => Some(n),
                _ => None,
            });
            let layer = copies_nest.and_then(|n| match n.body.as_slice() {
                [Item::Nest(layer)] => Some(layer),
                _ => None,
            });
            assert_eq!(layer.map(|l| l.count), Some(width as u32), "{:?}", s.items);
            assert_eq!(s.items.iter().map(Item::depth).max(), Some(2));
            s
        });
    }

    /// A `sum` far wider than a function is cut into parts across functions, its additions
    /// in order; repeated operands included.
    #[test]
    fn wide_sums_are_cut_across_functions() {
        let g = Graph::new();
        let x = g.inputs(7);
        let p = g.param(0.5);
        let terms: Vec<_> = (0..500)
            .map(|i| (x[i % 7] * p).tanh() + x[(i * 3) % 7])
            .collect();
        let total = g.sum(terms.iter().chain(&terms[..50]));
        g.set_loss(total * total).unwrap();
        let straight = |tape: &Tape| recovery::schedule(tape, false);
        assert_matches_interpreter(&g, straight);
        let tape = Tape::from_graph(&g).unwrap();
        let plan = Plan::new(
            &tape,
            &straight(&tape),
            PlanOptions {
                chunk_size: 40,
                fast_math: false,
                zero_skipping: ZeroSkipping::Auto,
                host_avx512: false,
            },
        )
        .unwrap();
        plan.verify(&tape).unwrap();
        let parts = plan
            .functions
            .iter()
            .flatten()
            .filter(|i| matches!(i, Item::SumPart { .. }))
            .count();
        assert!(parts >= 550 / 40, "{parts} parts");
    }
}
