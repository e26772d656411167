//! tapejit: micrograd-style scalar autodiff, linearized once into a tape and compiled to
//! native code with LLVM.
//!
//! The pipeline: [`Graph`] (micrograd's API) -> [`Tape`] (linear, slot-indexed) ->
//! passes (loop recovery, param layout) -> plan (every lowering decision) -> LLVM IR ->
//! native `forward`, `backward`, `update` and `step` ([`Jit`]). The passes and the plan are
//! crate-private: users see graphs, tapes and [`Program`]s. The [`Interpreter`] runs the
//! same tape as the reference every backend must match bit for bit; both implement
//! [`Program`], so a training loop is written once.

pub(crate) mod aligned;
pub mod anomaly;
pub mod checkpoint;
pub mod datasets;
pub mod dot;
pub mod error;
pub(crate) mod finite;
pub mod graph;
pub mod interp;
pub(crate) mod kernels;
pub mod minibatch;
pub mod op;
pub mod optim;
pub(crate) mod passes;
pub(crate) mod plan;
pub mod program;
pub mod samples;
pub mod tape;

pub use error::{Error, Result};
pub use graph::{Graph, Value};
pub use interp::Interpreter;
pub use op::Op;
pub use program::Program;
pub use samples::Samples;
pub use tape::{Slot, Tape, TapeNodeView};
pub mod jit;
pub mod nn;
pub use jit::{
    Cache, ExportOptions, ExportParams, ExportTarget, Exported, Jit, JitBuilder, JitStats,
    NestStats, OptLevel, Tier, Tiering,
};
pub use plan::ZeroSkipping;

/// The README's examples are compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
