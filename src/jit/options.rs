//! What a compile is asked for and what it reports: [`OptLevel`], [`JitBuilder`]'s options
//! and [`JitStats`]. The lowest of the JIT's stages, so that every stage can read them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use inkwell::OptimizationLevel;

use super::cache::{self, Cache};
use crate::error::{Error, Result};
use crate::optim::Optimizer;
use crate::passes::loops as recovery;
use crate::passes::schedule;
use crate::plan::{Nests, ZeroSkipping};
use crate::tape::Tape;

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
    /// (`emit::lane_io`), so that instruction combining and early CSE see every load and store;
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
    /// Of those, seconds a background compile waited before entering LLVM, until the program
    /// had run on the first tier about as long as LLVM was estimated to take ([`Tiering::Auto`];
    /// [`Jit::wait_for_native`](crate::Jit::wait_for_native) ends the wait).
    pub compile_deferred_secs: f64,
    /// Seconds compiling what only some methods run, when they first did: `train`'s merged
    /// first layer ([`crate::Program::train`]) and `accumulate`
    /// ([`crate::Program::train_minibatches`]); 0 until then. The stage times and sizes
    /// above include them from then on. (On native code with tiering on, `train`'s module
    /// compiles on a thread of its own while `train` steps sample by sample; these are that
    /// thread's seconds, counted once it is linked.)
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
    /// Loop operands that store their first addition to each gradient instead of zeroing it first.
    pub stored_first_additions: usize,
    /// Loop operands that read one constant wherever they run (`x * 0.5` made at every use,
    /// a node per repetition), which the code uses as a number instead of loading them.
    pub constant_operands: usize,
    /// Rows (inputs) of the first layer that [`crate::Program::train_minibatches`] cuts into
    /// one range per thread (each thread's rows of weights never leave it; one thread runs
    /// the same stages over every row); 0 where the threads share out the samples instead.
    pub split_rows: usize,
    /// Params `step` updates where a lane loop computes their whole gradient (their only use).
    pub fused_updates: usize,
    /// Of those, params whose gradients `step` leaves unstored until something reads them.
    pub deferred_grads: usize,
    /// Whether `train` merges the first layer's weight update with the next sample's forward.
    pub merged_train: bool,
    /// Whether that merged layer skips zero inputs (in `train` and `train_minibatches`).
    pub zero_skipping: bool,
    /// The repeated structure loop recovery found: each outermost nest in tape order (a
    /// batch written as copies, a rollout's steps, a layer's neurons), with the nests in it.
    pub nests: Vec<NestStats>,
    /// Params the layout pass moved to other slots of the compiled tape (the program still
    /// speaks the tape as built: [`crate::Program::tape`]).
    pub moved_params: usize,
    /// Seconds preparing the first tier, the kernel tier ([`Tiering`]); 0 without one.
    pub first_tier_secs: f64,
    /// Runs of one op the first tier computes its operations in (each a loop of that op's
    /// formula); 0 without a first tier.
    pub first_tier_op_runs: usize,
    /// Softmaxes written in scalars (max, subtract, exp, sum, divide) the first tier runs
    /// each as one unit, the same operations in the same order; 0 without a first tier.
    pub first_tier_fused: usize,
    /// Passes run on the first tier, and on native code: each `forward`, `backward`,
    /// `update` and `step` (a `step` with an optimizer other than plain SGD is a forward and
    /// a backward), each sample of a `train` call the first tier runs, and each native
    /// `train` and each `train_minibatches` call as one.
    pub first_tier_passes: u64,
    pub native_passes: u64,
    /// Seconds from the start of the compile until native code took over from the first
    /// tier (`None` while the first tier runs, and without one). Until then the fields
    /// above that describe native code (times, sizes, loops) are 0.
    pub native_after_secs: Option<f64>,
    /// Why native code never took over, if its compile failed in the background: the
    /// program goes on in the first tier, with the same results.
    pub native_error: Option<crate::error::Error>,
    /// The persistent compile cache's directory ([`JitBuilder::cache`]), `None` where the
    /// compile did not use one: turned off, `keep_ir`, or no usable directory.
    pub cache_dir: Option<PathBuf>,
    /// Modules loaded from the cache: LLVM did not run for them (their stage times are 0;
    /// their functions, instructions and code bytes are those the entry recorded).
    pub cache_hits: usize,
    /// Modules LLVM compiled while the cache was on (each then stored in it).
    pub cache_misses: usize,
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
    /// Whether its backward runs in vector lanes too.
    pub backward_lanes: bool,
    /// Whether that backward adds into operands all lanes share in blocks (the vertical order).
    pub vertical: bool,
    /// Whether forward runs first the body items the next repetition reads (not tape order).
    pub forward_reordered: bool,
    /// Maps of its body that add into their operands from the last in backward (a chain's
    /// link `x[s] - x[s - 1]` in lanes: the order that keeps each gradient's additions).
    pub operands_from_last: usize,
    /// Gradients added over its repetitions after they ran, each slot's contributions in a
    /// register, instead of in every repetition: the weights a batch's copies share.
    pub shared_grads: usize,
    /// The nests in its body, in tape order.
    pub inner: Vec<NestStats>,
}

impl NestStats {
    /// The nests of `items`, run as `nests` says.
    pub(super) fn of(items: &[schedule::Item], nests: &Nests) -> Vec<NestStats> {
        items
            .iter()
            .filter_map(|item| match item {
                schedule::Item::Nest(n) => {
                    let plan = nests.of(n);
                    Some(NestStats {
                        count: n.count,
                        nodes: item.loop_nodes(),
                        lanes: plan.lanes.forward().is_some(),
                        backward_lanes: plan.lanes.backward().is_some(),
                        vertical: plan.lanes.vertical(),
                        forward_reordered: !plan.forward_order.is_empty(),
                        operands_from_last: (0..n.body.len())
                            .filter(|&k| plan.adds_from_last(k))
                            .count(),
                        shared_grads: plan.shared_grads.len(),
                        inner: NestStats::of(&n.body, nests),
                    })
                }
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

    /// Adds a lazy entry point's module, linked after the plan's: its stage times and sizes,
    /// and one module more.
    pub(super) fn add_lazy_module(&mut self, module: &JitStats) {
        self.add_module(module);
        self.modules += 1;
    }

    /// Adds one compiled module's stage times and sizes.
    pub(super) fn add_module(&mut self, module: &JitStats) {
        self.ir_build_secs += module.ir_build_secs;
        self.optimize_secs += module.optimize_secs;
        self.codegen_secs += module.codegen_secs;
        self.functions += module.functions;
        self.ir_instructions += module.ir_instructions;
        self.code_bytes += module.code_bytes;
        self.cache_hits += module.cache_hits;
        self.cache_misses += module.cache_misses;
        if module.cache_dir.is_some() {
            self.cache_dir.clone_from(&module.cache_dir);
        }
    }

    /// The share of the tape's operations that run in loops (0 to 1).
    pub fn coverage(&self) -> f64 {
        self.loop_nodes as f64 / self.op_nodes.max(1) as f64
    }
}

/// Options for compiling; start from [`Jit::builder`](super::Jit::builder).
#[derive(Clone, Debug)]
pub struct JitBuilder {
    pub(super) opt_level: OptLevel,
    pub(super) chunk_size: usize,
    pub(super) pipeline: Option<String>,
    pub(super) codegen: Option<OptLevel>,
    pub(super) loop_recovery: bool,
    pub(super) fast_math: bool,
    pub(super) keep_ir: bool,
    /// 0: every core.
    pub(super) compile_threads: usize,
    pub(super) zero_skipping: ZeroSkipping,
    pub(super) optimizer: Optimizer,
    pub(super) tiering: Tiering,
    pub(super) compile_ahead: bool,
    pub(super) cache: Cache,
    pub(super) cache_size: Option<u64>,
    /// The cache of the compile this builder runs: set on the copy `compile_tape` compiles
    /// with ([`JitBuilder::with_cache_source`]), `None` on the user's builder.
    pub(super) cache_source: Option<Arc<cache::Source>>,
    /// The background compile this builder runs, if it runs one ([`CompileState`]).
    pub(super) background: Option<Arc<CompileState>>,
}

/// Set when the process exits: every background compile is then called off.
pub(super) static EXITING: AtomicBool = AtomicBool::new(false);

/// What a background compile and its program tell each other: whether the program still
/// wants it (it stops at its next stage or module once called off, or once the process
/// exits, [`EXITING`]), and whether it has entered LLVM (from then on a program that goes
/// waits for it to end: LLVM must not run on into the process's exit, whose handlers tear
/// down LLVM's globals).
#[derive(Debug, Default)]
pub(super) struct CompileState {
    called_off: AtomicBool,
    in_llvm: AtomicBool,
    /// Nanoseconds the program has run on the first tier, and whether it waits for native
    /// code ([`CompileState::wait_until_worth`]).
    first_tier_nanos: std::sync::atomic::AtomicU64,
    hurry: AtomicBool,
}

impl CompileState {
    /// The program ran on the first tier for `nanos` more.
    pub fn ran_first_tier(&self, nanos: u64) {
        self.first_tier_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The program waits for native code: no more deferring.
    pub fn hurry(&self) {
        self.hurry.store(true, Ordering::SeqCst);
    }

    /// Waits until the program has run on the first tier for as long as the compile left is
    /// estimated to take (`estimate`), or is waiting for it; false if called off meanwhile.
    /// (A graph run a few times, as one rebuilt often is, never pays for a compile, nor waits
    /// for one when dropped; one run long pays at most about twice what it would have.)
    pub fn wait_until_worth(&self, estimate: std::time::Duration) -> bool {
        let estimate = estimate.as_nanos().min(u64::MAX as u128) as u64;
        loop {
            if self.called_off() {
                return false;
            }
            let ran = self.first_tier_nanos.load(Ordering::Relaxed);
            if ran >= estimate || self.hurry.load(Ordering::SeqCst) {
                return true;
            }
            // (A short nap: the time left at the earliest, at most 5 ms, so that a drop or
            // a wait is answered at once.)
            let left = std::time::Duration::from_nanos(estimate - ran);
            std::thread::sleep(left.min(std::time::Duration::from_millis(5)));
        }
    }

    /// The program no longer wants the compile; whether it must wait for it to end.
    pub fn call_off(&self) -> bool {
        self.called_off.store(true, Ordering::SeqCst);
        self.in_llvm.load(Ordering::SeqCst)
    }

    pub fn called_off(&self) -> bool {
        self.called_off.load(Ordering::SeqCst) || EXITING.load(Ordering::SeqCst)
    }

    /// The compile is about to enter LLVM; false if it was called off (then it must not).
    /// (Each side stores before it loads, so one of them sees the other.)
    pub fn enter_llvm(&self) -> bool {
        self.in_llvm.store(true, Ordering::SeqCst);
        !self.called_off()
    }
}

/// How [`JitBuilder::compile`] gets a program running ([`JitBuilder::tiering`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tiering {
    /// Returns as soon as the first tier, the kernel tier, is ready (a few hundred
    /// nanoseconds per node: the tape as runs of one op, each a loop of that op's formula);
    /// native code compiles on a background thread and takes over between two calls once it
    /// is linked. The compile plans at once but enters LLVM only once the program has run on
    /// the first tier about as long as LLVM is estimated to take (or the cache holds every
    /// module, or [`crate::Jit::wait_for_native`] is called): a graph run a few times, as
    /// one rebuilt often is, never pays for a compile, and one run long pays at most about
    /// twice what compiling at once would have ([`JitStats::compile_deferred_secs`]). A tape
    /// holding a batch of copies (whose expanded tape is many times its stored one) and a
    /// builder that keeps the IR compile natively at once. On native code, `train`'s merged
    /// first layer, a module of its own, compiles on a thread of its own when `train` is
    /// first called, which steps sample by sample until it is linked (the same numbers).
    #[default]
    Auto,
    /// Returns once native code is linked: no first tier, and no call runs other code while
    /// something compiles (`train`'s first call compiles its merged first layer, and
    /// `train_minibatches`' its `accumulate`, before running).
    Off,
    /// The first tier only: nothing is compiled (for a graph that runs a few times).
    FirstTierOnly,
}

/// Which tier runs a program's calls ([`crate::Jit::tier`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The kernel tier: runs of one op, each a loop of the op's formula.
    Kernels,
    /// Machine code compiled by LLVM at the builder's level.
    Native,
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
            tiering: Tiering::Auto,
            compile_ahead: false,
            background: None,
            cache: Cache::Default,
            cache_size: None,
            cache_source: None,
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

    /// Whether to keep the optimized IR as text for [`Jit::ir`](super::Jit::ir) (default off). Off, a compiled
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

    pub(super) fn threads(&self) -> usize {
        match self.compile_threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
    }

    /// The optimizer the program's updates use (default plain SGD, which `step` and `train`
    /// fuse into their backward passes): [`crate::optim`]'s [`crate::optim::Sgd`],
    /// [`crate::optim::Adam`] or [`crate::optim::AdamW`]; as
    /// [`crate::Program::set_optimizer`] after compiling (refused hyperparameters are its error).
    pub fn optimizer(mut self, optimizer: impl Into<Optimizer>) -> Self {
        self.optimizer = optimizer.into();
        self
    }

    /// Whether native code compiles what only `train` and `train_minibatches` run (their
    /// modules: `train`'s merged first layer, `accumulate`) with the rest, side by side on the
    /// compile threads (default off: each compiles when its method is first called, so that
    /// a program that only steps never pays for it). On, for a program that will train, no
    /// call waits for LLVM once native code runs ([`JitStats::compile_secs`] counts them).
    pub fn compile_ahead(mut self, on: bool) -> Self {
        self.compile_ahead = on;
        self
    }

    /// How `compile` gets the program running (default [`Tiering::Auto`]: the kernel tier at
    /// once, native code when it is ready). Every tier computes the same bits.
    pub fn tiering(mut self, tiering: Tiering) -> Self {
        self.tiering = tiering;
        self
    }

    /// Whether the compile this builder runs in the background was called off.
    pub(super) fn cancelled(&self) -> bool {
        self.background.as_ref().is_some_and(|b| b.called_off())
    }

    /// Whether this compile may enter LLVM (it is not a background compile called off).
    pub(super) fn enter_llvm(&self) -> bool {
        self.background.as_ref().map_or(true, |b| b.enter_llvm())
    }

    /// Where compiled modules are kept for the next process that compiles the same structure
    /// with the same options (default [`Cache::Default`]: `TAPEJIT_CACHE`, else the user's
    /// cache directory). [`Cache::Off`] and [`Cache::Dir`] take precedence over
    /// `TAPEJIT_CACHE`. A cache that cannot be used is skipped, never an error; a program
    /// compiled with [`JitBuilder::keep_ir`] is not cached. [`JitStats::cache_hits`] says
    /// what it saved; the key, the entries and their safety are in `docs/design.md`.
    pub fn cache(mut self, cache: Cache) -> Self {
        self.cache = cache;
        self
    }

    /// The most bytes the cache directory's entries may take (default `TAPEJIT_CACHE_SIZE`,
    /// else [`DEFAULT_CACHE_SIZE`](super::DEFAULT_CACHE_SIZE), 1 GiB); those least recently
    /// used go first.
    pub fn cache_size(mut self, bytes: u64) -> Self {
        self.cache_size = Some(bytes);
        self
    }

    /// This builder with the cache of a compile of `tape` (`tape` as given, before the
    /// param layout), if it has one.
    pub(super) fn with_cache_source(&self, tape: &Tape) -> JitBuilder {
        let source = (!self.keep_ir)
            .then(|| cache::Source::new(&self.cache, self.cache_size, tape, |k| self.write_key(k)))
            .flatten();
        JitBuilder {
            cache_source: source.map(Arc::new),
            ..self.clone()
        }
    }

    /// Every option that changes the machine code, into the cache's key. (Taken apart
    /// exhaustively: a new option does not compile until it is written or said not to
    /// change code.)
    fn write_key(&self, key: &mut cache::KeyWriter) {
        let JitBuilder {
            opt_level,
            chunk_size,
            pipeline,
            codegen,
            loop_recovery,
            fast_math,
            keep_ir,
            compile_threads: _,
            zero_skipping,
            optimizer: _,
            tiering: _,
            compile_ahead: _,
            background: _,
            cache: _,
            cache_size: _,
            cache_source: _,
        } = self;
        key.str(&opt_level.to_string())
            .bytes(&(*chunk_size as u64).to_le_bytes())
            .str(&format!("{pipeline:?} {codegen:?} {zero_skipping:?}"))
            .bytes(&[*loop_recovery as u8, *fast_math as u8, *keep_ir as u8]);
    }

    /// Generates machine code at `level`'s code-generator setting instead of the level's own.
    /// On a large straight-line graph the fast one (O1's) compiles in a third to a quarter of
    /// O2's time, for code about 20% slower per call; with tiering on, native code then takes
    /// over that much sooner (docs/benchmarks.md: a 60k-node random DAG run 10,000 times,
    /// 0.48x a tape interpreter's time with `codegen(OptLevel::O1)`, 0.52x without).
    pub fn codegen(mut self, level: OptLevel) -> Self {
        self.codegen = Some(level);
        self
    }

    pub(super) fn codegen_level(&self) -> OptimizationLevel {
        self.codegen.unwrap_or(self.opt_level).codegen()
    }

    pub(super) fn effective_pipeline(&self) -> Option<String> {
        self.pipeline
            .clone()
            .or_else(|| self.opt_level.pipeline().map(String::from))
    }

    /// The pipeline of a module of `tape`'s plan functions `functions`, and whether its lanes
    /// touch slots one at a time: at O2 and O3 a module of loop code
    /// (`plan::functions::loop_code`) gets [`OptLevel::pipeline_without_slp`] and lanes slot
    /// by slot (at O0 and O1 the level's pipeline and masked lanes); a module of
    /// straight-line code SLP would find nothing in (not `plan::functions::slp_pays`) that
    /// pipeline only; unless the builder has a pipeline of its own.
    pub(super) fn module_pipeline<'p, I>(
        &self,
        tape: &Tape,
        functions: impl Fn() -> I,
    ) -> (Option<String>, bool)
    where
        I: Iterator<Item = &'p Vec<crate::passes::schedule::Item>>,
    {
        let loop_code = crate::plan::functions::loop_code(functions());
        let slp_pays = crate::plan::functions::slp_pays(tape, functions());
        let lanes_by_slot = loop_code && matches!(self.opt_level, OptLevel::O2 | OptLevel::O3);
        let without_slp = (lanes_by_slot || (!loop_code && !slp_pays))
            .then(|| self.opt_level.pipeline_without_slp())
            .flatten();
        match (&self.pipeline, without_slp) {
            (None, Some(pipeline)) => (Some(pipeline.to_string()), lanes_by_slot),
            _ => (self.effective_pipeline(), false),
        }
    }
}
