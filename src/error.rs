//! The one error type of the crate. Each variant carries the data that locates the problem.

use thiserror::Error;

/// Everything that can go wrong when building, compiling or running a tape, or saving and
/// loading its params.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum Error {
    /// A value of one graph was combined with, or looked up in, another graph.
    #[error("value #{node} belongs to graph {value_graph}, not to graph {graph} ({context})")]
    ForeignValue {
        node: u32,
        value_graph: u64,
        graph: u64,
        context: &'static str,
    },
    /// `backward`, `step` or compilation of a backward pass without a loss.
    #[error("the graph has no loss: call Graph::set_loss before compiling for backward")]
    NoLoss,
    /// A slice passed to the program had the wrong length.
    #[error("{what}: expected {expected} values, got {got}")]
    WrongLength {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// [`crate::Graph::apply`] was given the wrong number of operands for its op
    /// (`expected: None` is `Sum`'s "one or more").
    #[error("{op} takes {} operands, not {got}", expected.map_or("one or more".to_string(), |n| n.to_string()))]
    Arity {
        op: &'static str,
        expected: Option<usize>,
        got: usize,
    },
    /// [`crate::Graph::apply`] was asked for an input or a param, which `Graph::input` and
    /// `Graph::param` make (they number them).
    #[error("{op} nodes are made with Graph::{op}, not Graph::apply")]
    LeafOp { op: &'static str },
    /// A slot past the end of the tape, given to [`crate::Tape::node`].
    #[error("slot {slot} is not on a tape of {len} slots")]
    NoSuchSlot { slot: u32, len: usize },
    /// An input or param was NaN or infinite.
    #[error("{what} {index} is not finite ({value})")]
    NonFinite {
        what: &'static str,
        index: usize,
        value: f64,
    },
    /// A learning rate that is NaN or infinite, given to `update`, `step` or `train`: every
    /// param would become NaN (or infinite), so the call is refused and changes nothing.
    #[error(
        "the learning rate is not finite ({value}): the update would make params NaN or infinite"
    )]
    NonFiniteLearningRate { value: f64 },
    /// [`crate::Samples`] that cannot be samples: fields of different numbers of rows, a
    /// row order naming a row they lack, a label beyond its classes, a byte conversion
    /// that makes a non-finite number.
    #[error("samples: {problem}")]
    Samples { problem: String },
    /// `Program::train_minibatches` with minibatches of 0 samples.
    #[error("a minibatch must hold at least one sample")]
    EmptyMinibatch,
    /// A value the tape does not keep: created after compilation, or not needed by any output
    /// or the loss (dead code is dropped).
    #[error("value #{node} is not on the tape (created after compiling, or no output or the loss depends on it)")]
    NotOnTape { node: u32 },
    /// A value the compiled program computes only in registers: a product that only a sum
    /// reads, fused into it by loop recovery (its value and gradient never reach memory), or
    /// an intermediate result of a rollout's step, whose gradient never leaves the step's
    /// registers (`Program::grad`; its value too, `Program::value`, where no derivative
    /// reads it). Mark it as an output (`Graph::add_output`) to keep it, or read
    /// `Program::every_value_and_grad`.
    #[error("value #{node} (or its gradient) lives only in registers and is not kept by this program; mark it as an output to keep it, or read every_value_and_grad")]
    NotKept { node: u32 },
    /// A tape failed `Tape::verify`; this is a bug in a pass, reported rather than run.
    #[error("tape invariant broken at slot {slot}: {what}")]
    InvalidTape { slot: u32, what: String },
    /// A lowering plan failed `Plan::verify`, or a schedule does not compute its tape; a bug
    /// in a pass or the planner, reported rather than run.
    #[error("lowering plan invariant broken at slot {slot}: {what}")]
    InvalidPlan { slot: u32, what: String },
    /// An optimizer's hyperparameters PyTorch would refuse (a beta of 1, a negative eps,
    /// Nesterov without momentum, ...), or an optimizer state that is not its own (other
    /// buffers, another count of params, a non-finite number).
    #[error("optimizer {optimizer}: {problem}")]
    Optimizer {
        optimizer: &'static str,
        problem: String,
    },
    /// Anomaly mode ([`crate::Program::detect_anomaly`]): the first node whose value (forward)
    /// or local derivative (backward) was not finite though its operands were: its graph
    /// node (`None`: a slot of no node the user made), op, operands' values, and the param's
    /// position (creation order) if it is a param, which an update made non-finite.
    #[error("{}", describe_anomaly(*pass, *node, op, *param, operands, *value))]
    Anomaly {
        pass: Pass,
        node: Option<u32>,
        op: &'static str,
        param: Option<usize>,
        operands: Vec<f64>,
        value: f64,
    },
    /// A missing, unreadable or malformed params file, or one saved for another architecture.
    #[error("{file}: {problem}")]
    Checkpoint { file: String, problem: String },
    /// `Jit::ir` on a `Jit` compiled without keeping its IR: by default the IR is freed once
    /// the machine code exists.
    #[error("the optimized IR was not kept: compile with JitBuilder::keep_ir(true) to read it")]
    IrNotKept,
    /// An optimization level's name that is not `O0`, `O1`, `O2` or `O3`
    /// (`str::parse::<OptLevel>`).
    #[error("unknown optimization level {given:?}: expected O0, O1, O2 or O3")]
    UnknownOptLevel { given: String },
    /// [`crate::Jit::export`] refused: a target this LLVM lacks, a file it cannot write, a
    /// prefix that is not a C identifier, or an export the program cannot honour.
    #[error("export: {problem}")]
    Export { problem: String },
    /// LLVM could not initialize the host target, verify a module, optimize or JIT it.
    #[error("LLVM {stage} failed: {message}")]
    Llvm {
        stage: &'static str,
        message: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The error for the first non-finite number of `inputs` from index `from` on (the start
    /// of the sample, or chunk, where a backend's `run_train` or the minibatch threads
    /// stopped; everything before it is finite).
    pub(crate) fn non_finite_input(inputs: &[f64], from: usize) -> Error {
        let index = (from..inputs.len())
            .find(|&i| !inputs[i].is_finite())
            .unwrap_or(from);
        Error::NonFinite {
            what: "input",
            index,
            value: inputs.get(index).copied().unwrap_or(f64::NAN),
        }
    }
}

/// [`Error::Anomaly`]'s message.
fn describe_anomaly(
    pass: Pass,
    node: Option<u32>,
    op: &str,
    param: Option<usize>,
    operands: &[f64],
    value: f64,
) -> String {
    let node = node.map_or("a node".to_string(), |n| format!("node #{n}"));
    match (pass, param) {
        (_, Some(k)) => format!("anomaly: param {k} ({node}) is {value}, made so by an update"),
        (Pass::Forward, None) => {
            format!("anomaly in forward: {node} ({op}) gave {value} from operands {operands:?}")
        }
        (Pass::Backward, None) => format!(
            "anomaly in backward: {node} ({op}), operands {operands:?}, gave its operand the \
             non-finite gradient {value}"
        ),
    }
}

/// Which pass found an anomaly ([`Error::Anomaly`]; also `tapejit::anomaly::Pass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward,
    Backward,
}
