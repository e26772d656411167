//! The reference interpreter: the oracle every other backend is checked against.
//!
//! It walks the tape with plain `f64` arithmetic through the very formulas of [`crate::op`],
//! in the order every backend must follow: forward in slot order; backward in reverse slot
//! order, each node adding its operands' local gradients operand by operand.

use crate::aligned::AlignedBuf;
use crate::error::Result;
use crate::graph::Graph;
use crate::minibatch::Workspace;
use crate::minibatch::{Replica, Replicas};
use crate::op::F64;
use crate::optim::Stepper;
use crate::program::Backend;
use crate::tape::Tape;

/// Runs a tape by walking it. Slow, simple, and the definition of the right answer.
pub struct Interpreter {
    tape: Tape,
    values: Vec<f64>,
    grads: Vec<f64>,
    operands: Vec<f64>,
    local: Vec<f64>,
    workspace: Workspace,
    stepper: Stepper,
    /// Anomaly mode ([`crate::anomaly`]).
    detect_anomaly: bool,
}

impl Interpreter {
    /// Linearizes `graph` and prepares buffers.
    pub fn new(graph: &Graph) -> Result<Interpreter> {
        Ok(Interpreter::from_tape(Tape::from_graph(graph)?))
    }

    pub fn from_tape(tape: Tape) -> Interpreter {
        // (The oracle walks every node, each as stored: as fast with a batch's copies as
        // without.)
        let tape = tape.without_copies();
        let (values, grads) = tape.initial_buffers();
        Interpreter {
            tape,
            values,
            grads,
            operands: Vec::new(),
            local: Vec::new(),
            workspace: Workspace::default(),
            stepper: Stepper::default(),
            detect_anomaly: false,
        }
    }
}

impl Backend for Interpreter {
    fn program_tape(&self) -> &Tape {
        &self.tape
    }
    fn value_buffer(&self) -> &[f64] {
        &self.values
    }
    fn grad_buffer(&self) -> &[f64] {
        &self.grads
    }
    fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]) {
        (&mut self.values, &mut self.grads)
    }

    fn run_forward(&mut self) {
        forward(&self.tape, &mut self.values, &mut self.operands);
    }

    fn run_backward(&mut self) {
        let (operands, local) = (&mut self.operands, &mut self.local);
        backward(&self.tape, &self.values, &mut self.grads, operands, local);
    }

    fn run_minibatches(
        &mut self,
        samples: &crate::Samples<'_>,
        batch: usize,
        lr: f64,
        threads: usize,
    ) -> Result<Vec<f64>> {
        crate::minibatch::train(self, samples, batch, lr, threads)
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

    fn run_update(&mut self, lr: f64) {
        let n = self.tape.num_params();
        for (p, g) in self.values[..n].iter_mut().zip(&self.grads[..n]) {
            *p -= lr * g;
        }
    }
}

/// Forward over `values`, in slot order.
fn forward(tape: &Tape, values: &mut [f64], operands: &mut Vec<f64>) {
    for s in tape.slots() {
        let node = tape.stored(s);
        if node.op().is_leaf() {
            continue;
        }
        operands.clear();
        operands.extend(node.args().iter().map(|a| values[a.index()]));
        values[s.index()] = node.op().forward(&mut F64, operands);
    }
}

/// Backward into `grads`, in reverse slot order (params' gradients accumulate).
fn backward(
    tape: &Tape,
    values: &[f64],
    grads: &mut [f64],
    operands: &mut Vec<f64>,
    local: &mut Vec<f64>,
) {
    let Some(loss) = tape.loss() else {
        return;
    };
    grads[tape.num_params()..].fill(0.0);
    grads[loss.index()] = 1.0;
    for s in tape.slots().rev() {
        let node = tape.stored(s);
        if node.op().is_leaf() || !node.needs_grad() {
            continue;
        }
        let args = node.args();
        operands.clear();
        operands.extend(args.iter().map(|a| values[a.index()]));
        let (out, g) = (values[s.index()], grads[s.index()]);
        node.op().local_grads(&mut F64, operands, out, g, local);
        for (&a, d) in args.iter().zip(local.iter()) {
            if tape.stored(a).needs_grad() {
                grads[a.index()] += d;
            }
        }
    }
}

impl Replicas for Interpreter {
    fn replica(&self) -> Box<dyn Replica + '_> {
        Box::new(InterpreterReplica {
            tape: &self.tape,
            values: self.values.clone(),
            operands: Vec::new(),
            local: Vec::new(),
        })
    }

    fn workspace(&self) -> &Workspace {
        &self.workspace
    }
}

/// The interpreter's walk over buffers of its own ([`Replicas::replica`]).
struct InterpreterReplica<'t> {
    tape: &'t Tape,
    values: Vec<f64>,
    operands: Vec<f64>,
    local: Vec<f64>,
}

impl Replica for InterpreterReplica<'_> {
    fn values_mut(&mut self) -> &mut [f64] {
        &mut self.values
    }
    fn into_values(self: Box<Self>) -> AlignedBuf {
        AlignedBuf::from_slice(&self.values)
    }
    fn accumulate(&mut self, inputs: &[f64], losses: &mut [f64], grads: &mut [f64]) {
        let tape = self.tape;
        let (base, loss) = (tape.input_base(), tape.loss().expect("a loss"));
        grads[..tape.num_params()].fill(0.0);
        for (x, l) in inputs.chunks_exact(tape.num_inputs()).zip(losses) {
            self.values[base..base + x.len()].copy_from_slice(x);
            forward(tape, &mut self.values, &mut self.operands);
            *l = self.values[loss.index()];
            let (operands, local) = (&mut self.operands, &mut self.local);
            backward(tape, &self.values, grads, operands, local);
        }
    }
}
