//! The JIT: lowers a tape to LLVM IR in-process and runs it as native code.
//!
//! `lower` turns the tape into an IR module, `engine` optimizes it for the host CPU, compiles
//! it to machine code, frees the compiler and owns the code; [`Jit`] ties them to the
//! [`Program`] API.

mod engine;
mod ir_arith;
mod lanes;
mod loops;
mod lower;
mod step;

use inkwell::OptimizationLevel;

use std::time::Instant;

use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::passes::{layout, loops as recovery};
use crate::program::Program;
use crate::tape::{Slot, Tape};
use engine::Native;

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
    /// vectorizer for recovered loops, instruction combining and, at O3, GVN. None of these
    /// passes changes a result: no pass gets fast-math flags.
    pub fn pipeline(self) -> Option<&'static str> {
        match self {
            OptLevel::O0 => None,
            OptLevel::O1 => {
                Some("function(instcombine<no-verify-fixpoint>,loop-vectorize,slp-vectorizer)")
            }
            OptLevel::O2 => Some(
                "function(early-cse<memssa>,instcombine<no-verify-fixpoint>,loop-vectorize,\
                 slp-vectorizer,instcombine<no-verify-fixpoint>,simplifycfg)",
            ),
            OptLevel::O3 => Some(
                "function(early-cse<memssa>,instcombine<no-verify-fixpoint>,gvn,loop-vectorize,\
                 slp-vectorizer,instcombine<no-verify-fixpoint>,simplifycfg)",
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

/// Where compilation spent its time, and how big the result is.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JitStats {
    /// Nodes on the tape.
    pub tape_nodes: usize,
    /// Functions the tape was lowered into (chunks plus entry points).
    pub functions: usize,
    /// IR instructions after optimization.
    pub ir_instructions: usize,
    /// Seconds spent finding loops and laying out params.
    pub schedule_secs: f64,
    /// Seconds spent emitting and verifying IR.
    pub ir_build_secs: f64,
    /// Seconds spent in the IR pass pipeline.
    pub optimize_secs: f64,
    /// Seconds spent generating machine code, freeing the compiler's memory and linking.
    pub codegen_secs: f64,
    /// Loops the loop-recovery pass made (0 with recovery off).
    pub loops: usize,
    /// Tape nodes those loops cover.
    pub loop_nodes: usize,
    /// Bytes of machine code and its constants (the object's text and read-only data
    /// sections): with the buffers (2 x 8 bytes per tape node), about what a live `Jit`
    /// keeps resident beyond its tape.
    pub code_bytes: usize,
}

impl JitStats {
    pub fn total_secs(&self) -> f64 {
        self.schedule_secs + self.ir_build_secs + self.optimize_secs + self.codegen_secs
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

    /// Whether to re-roll the tape's repeated patterns into loops (default on; see
    /// [`crate::passes::loops`]). Results are bit-identical either way; off, every node is
    /// lowered as straight-line code.
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

    /// Whether to keep the optimized IR as text for [`Jit::ir`] (default off). Off, a compiled
    /// `Jit` keeps only its machine code: the LLVM module and context are freed as soon as the
    /// machine code exists (on a 1,000,000-node tape they are gigabytes; the code is tens of
    /// megabytes). On, the IR text stays too, about as large as the module was.
    pub fn keep_ir(mut self, on: bool) -> Self {
        self.keep_ir = on;
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

    /// Linearizes and compiles `graph`.
    pub fn compile(&self, graph: &Graph) -> Result<Jit> {
        self.compile_tape(Tape::from_graph(graph)?)
    }

    /// Compiles an already linearized tape. (A `Tape` is verified when it is built and
    /// cannot be changed afterwards, so it is not checked again here.)
    pub fn compile_tape(&self, tape: Tape) -> Result<Jit> {
        let mut stats = JitStats {
            tape_nodes: tape.len(),
            ..JitStats::default()
        };
        let start = Instant::now();
        let mut schedule = recovery::schedule(&tape, self.loop_recovery);
        let tape = match layout::param_layout(&tape, &schedule) {
            Some(from) => {
                let moved = tape.into_param_layout(&from)?;
                schedule = recovery::schedule(&moved, self.loop_recovery);
                moved
            }
            None => tape,
        };
        stats.schedule_secs = start.elapsed().as_secs_f64();
        stats.loops = schedule.loops;
        stats.loop_nodes = schedule.loop_nodes;
        let kept = schedule.kept(&tape);
        let native = Native::compile(&tape, &schedule, self, &mut stats)?;
        Ok(Jit {
            tape,
            kept,
            native,
            stats,
            opt_level: self.opt_level,
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
/// A `Jit` may move to another thread (it is `Send`), but not be shared between threads: its
/// reads of gradients may run native code that writes them.
///
/// ```compile_fail
/// fn shared<T: Sync>() {}
/// shared::<tapejit::Jit>(); // error[E0277]: `UnsafeCell<Vec<f64>>` cannot be shared
/// ```
pub struct Jit {
    tape: Tape,
    /// Per slot: whether the buffers hold it ([`recovery::Schedule::kept`]).
    kept: Vec<bool>,
    native: Native,
    stats: JitStats,
    opt_level: OptLevel,
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
}

impl Program for Jit {
    fn tape(&self) -> &Tape {
        &self.tape
    }
    fn values(&self) -> &[f64] {
        self.native.values()
    }
    fn grads(&self) -> &[f64] {
        self.native.grads()
    }
    fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]) {
        self.native.buffers_mut()
    }
    fn is_kept(&self, slot: Slot) -> bool {
        self.kept.get(slot.index()).copied().unwrap_or(true)
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
    fn run_train(&mut self, inputs: &[f64], lr: f64) -> Vec<f64> {
        let width = self.tape.num_inputs();
        match self.native.train(inputs, width, lr) {
            Some(losses) => losses,
            None => crate::program::step_per_sample(self, inputs, lr),
        }
    }
}
