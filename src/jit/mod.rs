//! The JIT: lowers a tape to LLVM IR in-process and runs it as native code.

use crate::error::Result;
use crate::graph::Graph;
use crate::program::Program;
use crate::tape::Tape;

/// How hard LLVM works: the IR pass pipeline and the code generator's level.
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
}

/// Options for [`Jit::builder`].
#[derive(Clone, Debug, Default)]
pub struct JitBuilder {
    opt_level: OptLevel,
}

impl JitBuilder {
    pub fn opt_level(mut self, level: OptLevel) -> Self {
        self.opt_level = level;
        self
    }
    pub fn compile(&self, graph: &Graph) -> Result<Jit> {
        self.compile_tape(Tape::from_graph(graph)?)
    }
    pub fn compile_tape(&self, _tape: Tape) -> Result<Jit> {
        todo!()
    }
}

/// A tape compiled to native code, with its buffers.
pub struct Jit {}

impl Jit {
    /// Compiles at the default level, O2.
    pub fn compile(graph: &Graph) -> Result<Jit> {
        Jit::builder().compile(graph)
    }
    pub fn builder() -> JitBuilder {
        JitBuilder::default()
    }
}
