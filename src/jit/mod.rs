//! The JIT: lowers a tape to LLVM IR in-process and runs it as native code.
//!
//! `emit` turns the tape and its plan into IR modules, `compiler` optimizes each for the host
//! CPU and compiles it to an object file (modules side by side on several threads), `engine`
//! links the objects and owns the code; [`Jit`] ties them to the [`crate::Program`] API.

mod compiler;
mod emit;
mod engine;
mod ir_arith;

use inkwell::OptimizationLevel;

use std::time::Instant;

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::optim::{Optimizer, Stepper};
use crate::passes::{layout, loops as recovery};
use crate::plan::{PerSlot, Plan, PlanOptions, ZeroSkipping};
use crate::program::{Backend, Program};
use crate::tape::{Slot, Tape};
use emit::LazyEntry;
use engine::Native;

/// The fewest repetitions loop recovery rolls into a loop (fewer run faster straight-line).
pub const MIN_LOOP_RUN: u32 = recovery::MIN_RUN;

/// How hard LLVM works. Each level picks an IR pass pipeline and a code-generator level
/// (see [`OptLevel::pipeline`]); the default is O2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OptLevel {
    O0,
    O1,
    #[default]
    O2,
    O3,
}

impl OptLevel {
    pub const ALL: [OptLevel; 4] = [OptLevel::O0, OptLevel::O1, OptLevel::O2, OptLevel::O3];

    /// The new-pass-manager pipeline run on the module, `None` for no IR passes.
    ///
    /// Not LLVM's `default<On>`: on straight-line tape code its memory passes (DSE, GVN's load
    /// analysis, LICM) spend quadratic alias queries on loads and stores that the lowering
    /// already made non-redundant, and the SelectionDAG chokes on unvectorized blocks. What
    /// pays here is the SLP vectorizer, which merges the per-slot loads and stores of
    /// neighbouring slots into vector ones (4x fewer instructions, faster codegen), the loop
    /// vectorizer for recovered loops, instruction combining and, at O3, GVN; first SROA,
    /// which makes a backward function's scratch of local gradients
    /// (`crate::plan::local`) registers and finds nothing elsewhere. None of these
    /// passes changes a result: no pass gets fast-math flags. A module of loop code only runs
    /// the same without SLP at O2 and O3, one of straight-line code SLP finds nothing in at
    /// O1 to O3 (see `pipeline_without_slp`).
    pub fn pipeline(self) -> Option<&'static str> {
        self.passes(true)
    }

    /// The level's pipeline without the SLP vectorizer (`None` at O0, which has none): for
    /// straight-line code with nothing for SLP to merge ([`crate::plan::functions::slp_pays`];
    /// a random DAG of 5,000 nodes compiles in 0.16 s instead of 0.8-1.1 at O1), and at O2
    /// and O3 for a module of loop code only ([`crate::plan::functions::loop_code`]), which
    /// reads and writes lanes whose slots are not adjacent one slot at a time
    /// (`emit::lanes`), so that instruction combining and early CSE see every load and store;
    /// SLP would turn those loads back into gathers (on Zen 4, moons' step 16 -> 17-20 us) and
    /// its alias checks over the stores triple the compile time.
    pub(crate) fn pipeline_without_slp(self) -> Option<&'static str> {
        self.passes(false)
    }

    fn passes(self, slp: bool) -> Option<&'static str> {
        match (self, slp) {
            (OptLevel::O0, _) => None,
            (OptLevel::O1, true) => {
                Some("function(sroa,instcombine<no-verify-fixpoint>,loop-vectorize,slp-vectorizer)")
            }
            (OptLevel::O1, false) => {
                Some("function(sroa,instcombine<no-verify-fixpoint>,loop-vectorize)")
            }
            (OptLevel::O2, true) => Some(
                "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,loop-vectorize,\
                 slp-vectorizer,instcombine<no-verify-fixpoint>,simplifycfg)",
            ),
            (OptLevel::O2, false) => Some(
                "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,loop-vectorize,\
                 instcombine<no-verify-fixpoint>,simplifycfg)",
            ),
            (OptLevel::O3, true) => Some(
                "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,gvn,loop-vectorize,\
                 slp-vectorizer,instcombine<no-verify-fixpoint>,simplifycfg)",
            ),
            (OptLevel::O3, false) => Some(
                "function(sroa,early-cse<memssa>,instcombine<no-verify-fixpoint>,gvn,loop-vectorize,\
                 instcombine<no-verify-fixpoint>,simplifycfg)",
            ),
        }
    }

    /// The level machine-code generation runs at: O1 uses the fast instruction selector, whose
    /// cost is linear; O2 and O3 the SelectionDAG and greedy register allocation.
    pub(crate) fn codegen(self) -> OptimizationLevel {
        match self {
            OptLevel::O0 | OptLevel::O1 => OptimizationLevel::None,
            OptLevel::O2 => OptimizationLevel::Default,
            OptLevel::O3 => OptimizationLevel::Aggressive,
        }
    }
}

impl std::fmt::Display for OptLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}

/// `"O0"`..`"O3"`, as `Display` writes them.
impl std::str::FromStr for OptLevel {
    type Err = Error;

    fn from_str(s: &str) -> Result<OptLevel> {
        OptLevel::ALL
            .into_iter()
            .find(|l| l.to_string() == s)
            .ok_or_else(|| Error::UnknownOptLevel { given: s.into() })
    }
}

/// Where compilation spent its time, and how big the result is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JitStats {
    /// Nodes on the tape.
    pub tape_nodes: usize,
    /// Of those, operations: everything but params, inputs and constants.
    pub op_nodes: usize,
    /// Functions the tape was lowered into (chunks plus entry points).
    pub functions: usize,
    /// IR instructions after optimization.
    pub ir_instructions: usize,
    /// Seconds spent finding loops, laying out params and planning the lowering.
    pub schedule_secs: f64,
    /// Seconds spent emitting and verifying IR, summed over the modules (which compile side
    /// by side: see [`JitStats::compile_secs`] for the time that passed).
    pub ir_build_secs: f64,
    /// Seconds spent in the IR pass pipeline, summed over the modules.
    pub optimize_secs: f64,
    /// Seconds spent generating machine code and freeing the compiler's memory, summed over
    /// the modules, and linking.
    pub codegen_secs: f64,
    /// Seconds from the tape to linked native code, as a clock on the wall sees them.
    pub compile_secs: f64,
    /// Seconds compiling what only some methods run, when they first did: `train`'s merged
    /// first layer ([`crate::Program::train`]) and `accumulate`
    /// ([`crate::Program::train_minibatches`]); 0 until then. The stage times and sizes
    /// above include them from then on.
    pub first_use_compile_secs: f64,
    /// LLVM modules the functions were grouped into (each compiled on its own).
    pub modules: usize,
    /// Threads that compiled them.
    pub compile_threads: usize,
    /// Loops the loop-recovery pass made (0 with recovery off).
    pub loops: usize,
    /// Tape nodes those loops cover.
    pub loop_nodes: usize,
    /// How deep the loops nest (0: no nest; 1: nests of loops; 2: nests of nests ...).
    pub nest_depth: usize,
    /// Bytes of machine code and its constants (the object's text and read-only data
    /// sections): with the buffers (2 x 8 bytes per buffered slot), about what a live `Jit`
    /// keeps resident beyond its tape.
    pub code_bytes: usize,
    /// Numbers each of the values and gradients buffers holds: the slots the code keeps in
    /// memory, side by side (a fused dot's products live in registers and take no room;
    /// `tape_nodes` if a loop would address them otherwise), and the gaps that start a
    /// layer's rows of weights on cache lines.
    pub buffered_slots: usize,
    /// Slots whose gradient never leaves a nest's repetition, kept in registers rather than
    /// memory: a rollout step's (or a batch copy's) intermediate results, whose every
    /// gradient addition comes from the same step (`Program::grad` of one is
    /// [`crate::Error::NotKept`]).
    pub local_grads: usize,
    /// Slots whose value never leaves a nest's repetition and no derivative reads, kept in
    /// registers and never stored (`Program::value` of one is [`crate::Error::NotKept`]).
    pub local_values: usize,
    /// Loop operands that read one constant wherever they run (`x * 0.5` made at every use,
    /// a node per repetition), which the code uses as a number instead of loading them.
    pub constant_operands: usize,
    /// Rows (inputs) of the first layer that [`crate::Program::train_minibatches`] cuts into
    /// one range per thread (each thread's rows of weights never leave it; one thread runs
    /// the same stages over every row); 0 where the threads share out the samples instead.
    pub split_rows: usize,
    /// The repeated structure loop recovery found: each outermost nest in tape order (a
    /// batch written as copies, a rollout's steps, a layer's neurons), with the nests in it.
    pub nests: Vec<NestStats>,
}

/// One recovered nest: a body of tape nodes repeated `count` times.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NestStats {
    /// Repetitions.
    pub count: u32,
    /// Tape nodes it covers (every repetition's).
    pub nodes: usize,
    /// Whether its repetitions run side by side in vector lanes (forward, at least).
    pub lanes: bool,
    /// Gradients added over its repetitions after they ran, each slot's contributions in a
    /// register, instead of in every repetition: the weights a batch's copies share.
    pub shared_grads: usize,
    /// The nests in its body, in tape order.
    pub inner: Vec<NestStats>,
}

impl NestStats {
    fn of(items: &[recovery::Item]) -> Vec<NestStats> {
        items
            .iter()
            .filter_map(|item| match item {
                recovery::Item::Nest(n) => Some(NestStats {
                    count: n.count,
                    nodes: item.loop_nodes(),
                    lanes: n.lanes.forward().is_some(),
                    shared_grads: n.shared_grads.len(),
                    inner: NestStats::of(&n.body),
                }),
                _ => None,
            })
            .collect()
    }
}

impl JitStats {
    /// Seconds compiling took: [`JitStats::compile_secs`]. (The stages' seconds add up to
    /// more when modules compile side by side.)
    pub fn total_secs(&self) -> f64 {
        self.compile_secs
    }

    /// Adds one compiled module's stage times and sizes.
    fn add_module(&mut self, module: &JitStats) {
        self.ir_build_secs += module.ir_build_secs;
        self.optimize_secs += module.optimize_secs;
        self.codegen_secs += module.codegen_secs;
        self.functions += module.functions;
        self.ir_instructions += module.ir_instructions;
        self.code_bytes += module.code_bytes;
    }

    /// The share of the tape's operations that run in loops (0 to 1).
    pub fn coverage(&self) -> f64 {
        self.loop_nodes as f64 / self.op_nodes.max(1) as f64
    }
}

/// Options for compiling; start from [`Jit::builder`].
#[derive(Clone, Debug)]
pub struct JitBuilder {
    opt_level: OptLevel,
    chunk_size: usize,
    pipeline: Option<String>,
    codegen: Option<OptLevel>,
    loop_recovery: bool,
    fast_math: bool,
    keep_ir: bool,
    /// 0: every core.
    compile_threads: usize,
    zero_skipping: ZeroSkipping,
    optimizer: Optimizer,
}

impl Default for JitBuilder {
    fn default() -> Self {
        JitBuilder {
            opt_level: OptLevel::default(),
            chunk_size: 250,
            pipeline: None,
            codegen: None,
            loop_recovery: true,
            fast_math: false,
            keep_ir: false,
            compile_threads: 0,
            zero_skipping: ZeroSkipping::Auto,
            optimizer: Optimizer::default(),
        }
    }
}

impl JitBuilder {
    /// The optimization level (default O2).
    pub fn opt_level(mut self, level: OptLevel) -> Self {
        self.opt_level = level;
        self
    }

    /// About how many tape nodes (each counted with its operands; a recovered loop counts 16)
    /// go into one native function (default 250). Smaller functions optimize faster; LLVM's
    /// passes are superlinear in function size, so this is what keeps compile time linear in
    /// tape size.
    pub fn chunk_size(mut self, nodes: usize) -> Self {
        self.chunk_size = nodes.max(1);
        self
    }

    /// Replaces the level's IR pipeline with a new-pass-manager pipeline string, e.g.
    /// `"function(instcombine,gvn)"`; the code generator still runs at the level's setting.
    pub fn pipeline(mut self, pipeline: impl Into<String>) -> Self {
        self.pipeline = Some(pipeline.into());
        self
    }

    /// Whether to recover the tape's repeated structure as loops (default on): runs, dot
    /// products, and repetitions of them at any depth (neurons, copies, steps; see
    /// [`JitStats::nests`]). Results are bit-identical either way; off, every node is lowered
    /// as straight-line code.
    pub fn loop_recovery(mut self, on: bool) -> Self {
        self.loop_recovery = on;
        self
    }

    /// Lets LLVM treat the arithmetic of recovered loops as real numbers (default off):
    /// reassociate sums, ignore the sign of zero, and contract a multiply and an add into one
    /// FMA. Results then agree with the interpreter only to rounding. On MNIST 784-50-10
    /// (`examples/report`, 2,000 steps) the mean loss is the same and params differ by up to
    /// 1.6e-15 of the largest; the tests hold results to 1e-9. `step` gains nothing (it is
    /// bound by memory traffic); `Program::train`, whose merged loop is bound by arithmetic,
    /// runs ~10% faster (5.6 against 6.2 us per MNIST sample). Straight-line code never gets
    /// fast-math flags.
    pub fn fast_math(mut self, on: bool) -> Self {
        self.fast_math = on;
        self
    }

    /// When `Program::train` skips the inputs that are exactly 0 in its merged first layer
    /// (default [`ZeroSkipping::Auto`]: in the samples with enough zeros to gain). A skipped
    /// input's products and weight updates are signed zeros that change nothing, and the code
    /// checks the cases where IEEE arithmetic says otherwise (weights or gradients that are not
    /// finite, -0 weights, sums that are -0) and runs those without skipping: results are the
    /// same bits on or off.
    pub fn zero_skipping(mut self, when: ZeroSkipping) -> Self {
        self.zero_skipping = when;
        self
    }

    /// Whether to keep the optimized IR as text for [`Jit::ir`] (default off). Off, a compiled
    /// `Jit` keeps only its machine code: the LLVM module and context are freed as soon as the
    /// machine code exists (on a 1,000,000-node tape they are gigabytes; the code is tens of
    /// megabytes). On, the IR text stays too, about as large as the module was.
    pub fn keep_ir(mut self, on: bool) -> Self {
        self.keep_ir = on;
        self
    }

    /// How many threads compile the program's modules side by side (default 0: one per core,
    /// as `std::thread::available_parallelism` counts them). The modules, and so the machine
    /// code, are the same for every count; only the time to compile changes.
    pub fn compile_threads(mut self, threads: usize) -> Self {
        self.compile_threads = threads;
        self
    }

    fn threads(&self) -> usize {
        match self.compile_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// The optimizer the program's updates use (default plain SGD, which `step` and `train`
    /// fuse into their backward passes): [`crate::optim`]'s [`crate::optim::Sgd`],
    /// [`crate::optim::Adam`] or [`crate::optim::AdamW`]; as
    /// [`Program::set_optimizer`] after compiling (refused hyperparameters are its error).
    pub fn optimizer(mut self, optimizer: impl Into<Optimizer>) -> Self {
        self.optimizer = optimizer.into();
        self
    }

    /// Generates machine code at `level`'s code-generator setting instead of the level's own.
    pub fn codegen(mut self, level: OptLevel) -> Self {
        self.codegen = Some(level);
        self
    }

    fn codegen_level(&self) -> OptimizationLevel {
        self.codegen.unwrap_or(self.opt_level).codegen()
    }

    fn effective_pipeline(&self) -> Option<String> {
        self.pipeline
            .clone()
            .or_else(|| self.opt_level.pipeline().map(String::from))
    }

    /// A module's pipeline, and whether its lanes touch slots one at a time: at O2 and O3 a
    /// module of `loop_code` gets [`OptLevel::pipeline_without_slp`] and lanes slot by slot
    /// (at O0 and O1 the level's pipeline and masked lanes); a module of straight-line code
    /// SLP would find nothing in (not `slp_pays`) that pipeline only; unless the builder has
    /// a pipeline of its own.
    fn module_pipeline(&self, loop_code: bool, slp_pays: bool) -> (Option<String>, bool) {
        let lanes_by_slot = loop_code && matches!(self.opt_level, OptLevel::O2 | OptLevel::O3);
        let without_slp = (lanes_by_slot || (!loop_code && !slp_pays))
            .then(|| self.opt_level.pipeline_without_slp())
            .flatten();
        match (&self.pipeline, without_slp) {
            (None, Some(pipeline)) => (Some(pipeline.to_string()), lanes_by_slot),
            _ => (self.effective_pipeline(), false),
        }
    }

    /// Linearizes and compiles `graph`.
    pub fn compile(&self, graph: &Graph) -> Result<Jit> {
        self.compile_tape(Tape::from_graph(graph)?)
    }

    /// Compiles an already linearized tape. (A `Tape` is verified when it is built and
    /// cannot be changed afterwards, so it is not checked again here.)
    pub fn compile_tape(&self, tape: Tape) -> Result<Jit> {
        let start = Instant::now();
        let schedule = std::thread::scope(|scope| {
            // The planning passes ask who reads each slot; a second core counts it while
            // recovery scans (a batch of copies has millions of slots).
            if self.threads() > 1 && self.loop_recovery {
                scope.spawn(|| tape.consumers());
            }
            recovery::schedule(&tape, self.loop_recovery)
        });
        let (tape, schedule) = layout::apply(tape, schedule)?;
        self.compile_schedule(tape, schedule, start)
    }

    /// Plans, verifies and compiles `tape` as `schedule` lays it out (scheduling began at
    /// `start`). Any schedule is safe here: `Plan::new` verifies the plan it makes and
    /// refuses one that does not compute the tape.
    fn compile_schedule(
        &self,
        tape: Tape,
        schedule: recovery::Schedule,
        start: Instant,
    ) -> Result<Jit> {
        let mut stats = JitStats {
            tape_nodes: tape.len(),
            op_nodes: tape.op_nodes(),
            ..JitStats::default()
        };
        let plan = Plan::new(
            &tape,
            &schedule,
            PlanOptions {
                chunk_size: self.chunk_size,
                fast_math: self.fast_math,
                zero_skipping: self.zero_skipping,
            },
        )?;
        stats.schedule_secs = start.elapsed().as_secs_f64();
        stats.loops = plan.loops;
        stats.loop_nodes = plan.loop_nodes;
        stats.nest_depth = plan.nest_depth;
        stats.nests = plan
            .functions
            .iter()
            .flat_map(|f| NestStats::of(f))
            .collect();
        stats.modules = plan.modules.len();
        stats.buffered_slots = plan.buffers.buffer_len();
        stats.local_grads = plan.grads.local.count();
        stats.local_values = plan.local_values.count();
        stats.constant_operands = plan.constants.count();
        stats.split_rows = plan.split.as_ref().map_or(0, |s| s.rows);
        stats.compile_threads = self.threads().min(plan.modules.len());
        let native = Native::compile(&tape, &plan, self, stats.compile_threads, &mut stats)?;
        stats.compile_secs = start.elapsed().as_secs_f64();
        // (Per slot only where there are locals: a batch of copies has millions of slots.)
        let (values, grads) = (&plan.local_values, &plan.grads.local);
        let kept = match values.count() {
            0 => plan.kept.clone(),
            _ => PerSlot::from_fn(tape.len(), plan.alike.as_ref(), |s| {
                plan.kept.get(s) && !values.is_local(Slot(s as u32))
            }),
        };
        let local_grads = match grads.count() {
            0 => PerSlot::default(),
            _ => PerSlot::from_fn(tape.len(), plan.alike.as_ref(), |s| {
                grads.is_local(Slot(s as u32))
            }),
        };
        let mut jit = Jit {
            kept,
            local_grads,
            unlinked: tape.loss().map(|_| Box::new((plan, self.clone()))),
            tape,
            native,
            stats,
            opt_level: self.opt_level,
            stepper: Stepper::default(),
            detect_anomaly: false,
        };
        if !self.optimizer.is_plain() {
            jit.set_optimizer(self.optimizer)?;
        }
        Ok(jit)
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
    tape: Tape,
    /// Per slot: whether the buffers hold its value ([`Plan::kept`], but local values).
    kept: PerSlot<bool>,
    /// Per slot: whether its gradient lives in registers ([`crate::plan::local`]); empty
    /// where none does.
    local_grads: PerSlot<bool>,
    native: Native,
    stats: JitStats,
    opt_level: OptLevel,
    /// The plan and options the lazy entry points' modules are compiled from when first
    /// called ([`emit::ModuleRole::Lazy`]), while one is left to link.
    unlinked: Option<Box<(Plan, JitBuilder)>>,
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

    pub fn stats(&self) -> &JitStats {
        &self.stats
    }

    pub fn opt_level(&self) -> OptLevel {
        self.opt_level
    }

    /// The optimized LLVM IR as text; values are named after slots (`%n17`, `%g17`).
    /// [`Error::IrNotKept`] unless compiled with [`JitBuilder::keep_ir`]`(true)`.
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
        self.native.ir().map(String::from).ok_or(Error::IrNotKept)
    }

    /// Compiles and links `entry`'s module if this program has that entry point and it is not
    /// linked yet; the plan is dropped once no lazy entry is left to link.
    fn link_lazy(&mut self, entry: LazyEntry) -> Result<()> {
        let Some(unlinked) = self.unlinked.as_deref() else {
            return Ok(());
        };
        let (plan, options) = unlinked;
        if !self.native.links(entry) && has_entry(&self.tape, plan, entry) {
            let start = Instant::now();
            let object = compiler::compile_lazy(&self.tape, plan, options, entry)?;
            self.stats.add_module(&object.stats);
            self.stats.modules += 1;
            self.native.link(entry, object, plan.split.as_ref())?;
            self.stats.first_use_compile_secs += start.elapsed().as_secs_f64();
        }
        let left = [LazyEntry::Train, LazyEntry::Accumulate]
            .into_iter()
            .any(|e| !self.native.links(e) && has_entry(&self.tape, plan, e));
        if !left {
            self.unlinked = None;
        }
        Ok(())
    }
}

/// Whether a program of `tape` planned as `plan` has the lazy entry point `entry`: `train`
/// where the plan merges a layer (elsewhere `train` is `step` per sample), `accumulate` where
/// the tape has a loss.
fn has_entry(tape: &Tape, plan: &Plan, entry: LazyEntry) -> bool {
    match entry {
        LazyEntry::Train => plan.step.as_ref().is_some_and(|s| s.train.is_some()),
        LazyEntry::Accumulate => tape.loss().is_some(),
    }
}

impl Backend for Jit {
    fn program_tape(&self) -> &Tape {
        &self.tape
    }
    fn value_buffer(&self) -> &[f64] {
        self.native.values()
    }
    fn grad_buffer(&self) -> &[f64] {
        self.native.grads()
    }
    fn leaf_address(&self, s: Slot) -> usize {
        self.native.layout().address(s)
    }
    fn params_len(&self) -> usize {
        self.native.layout().params_len(&self.tape)
    }
    fn value_at(&self, s: Slot) -> f64 {
        self.native.value_at(s)
    }
    fn grad_at(&self, s: Slot) -> f64 {
        self.native.grad_at(s)
    }
    fn slot_values(&self) -> &[f64] {
        self.native.slot_values()
    }
    fn slot_grads(&self) -> &[f64] {
        self.native.slot_grads()
    }
    fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]) {
        self.native.buffers_mut()
    }
    fn keeps(&self, slot: Slot) -> bool {
        slot.index() >= self.kept.len() || self.kept.get(slot.index())
    }
    fn keeps_grad(&self, slot: Slot) -> bool {
        let local = slot.index() < self.local_grads.len() && self.local_grads.get(slot.index());
        self.keeps(slot) && !local && !self.tape.drops_grad(slot)
    }
    fn run_forward(&mut self) {
        self.native.forward();
    }
    fn run_backward(&mut self) {
        self.native.backward();
    }
    fn run_update(&mut self, lr: f64) {
        self.native.update(lr);
    }
    fn run_step(&mut self, lr: f64) {
        self.native.step(lr);
    }
    fn begin_step(&mut self) {
        self.native.discard_deferred();
    }
    fn prepare_train(&mut self) -> Result<()> {
        self.link_lazy(LazyEntry::Train)
    }
    fn prepare_replicas(&mut self) -> Result<()> {
        self.link_lazy(LazyEntry::Accumulate)
    }
    fn replica(&self) -> Box<dyn crate::program::Replica + '_> {
        Box::new(self.native.replica())
    }
    fn workspace(&self) -> &crate::minibatch::Workspace {
        self.native.workspace()
    }
    fn has_stages(&self) -> bool {
        self.native.has_stages()
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

    fn run_train(&mut self, inputs: &[f64], lr: f64) -> std::result::Result<Vec<f64>, usize> {
        match self.native.train(inputs, lr) {
            Some(trained) => trained,
            None => crate::program::train_checking_chunks(self, inputs, lr),
        }
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
    use crate::passes::loops::Item;
    use crate::{Interpreter, Program};

    /// `graph` compiled as `schedule` says, at every level, against the interpreter: the
    /// same params after a few steps, bit for bit, and the same gradients.
    fn assert_matches_interpreter(graph: &Graph, schedule: impl Fn(&Tape) -> recovery::Schedule) {
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
            let mut jit = builder.compile_schedule(tape, s, Instant::now()).unwrap();
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
