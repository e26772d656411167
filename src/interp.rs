//! The reference interpreter: the oracle every other backend is checked against.
//!
//! It walks the tape with plain `f64` arithmetic through the very formulas of [`crate::op`],
//! in the order every backend must follow: forward in slot order; backward in reverse slot
//! order, each node adding its operands' local gradients operand by operand.

use crate::error::Result;
use crate::graph::Graph;
use crate::op::F64;
use crate::program::{initial_buffers, Backend};
use crate::tape::Tape;

/// Runs a tape by walking it. Slow, simple, and the definition of the right answer.
pub struct Interpreter {
    tape: Tape,
    values: Vec<f64>,
    grads: Vec<f64>,
    operands: Vec<f64>,
    local: Vec<f64>,
}

impl Interpreter {
    /// Linearizes `graph` and prepares buffers.
    pub fn new(graph: &Graph) -> Result<Interpreter> {
        Ok(Interpreter::from_tape(Tape::from_graph(graph)?))
    }

    pub fn from_tape(tape: Tape) -> Interpreter {
        let (values, grads) = initial_buffers(&tape);
        Interpreter {
            tape,
            values,
            grads,
            operands: Vec::new(),
            local: Vec::new(),
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
        for s in self.tape.slots() {
            let op = self.tape.op(s);
            if op.is_leaf() {
                continue;
            }
            self.operands.clear();
            self.operands
                .extend(self.tape.args(s).iter().map(|a| self.values[a.index()]));
            self.values[s.index()] = op.forward(&mut F64, &self.operands);
        }
    }

    fn run_backward(&mut self) {
        let Some(loss) = self.tape.loss() else {
            return;
        };
        self.grads[self.tape.num_params()..].fill(0.0);
        self.grads[loss.index()] = 1.0;
        for s in self.tape.slots().rev() {
            let op = self.tape.op(s);
            if op.is_leaf() || !self.tape.needs_grad(s) {
                continue;
            }
            let args = self.tape.args(s);
            self.operands.clear();
            self.operands
                .extend(args.iter().map(|a| self.values[a.index()]));
            let (out, g) = (self.values[s.index()], self.grads[s.index()]);
            op.local_grads(&mut F64, &self.operands, out, g, &mut self.local);
            for (a, d) in args.iter().zip(&self.local) {
                if self.tape.needs_grad(*a) {
                    self.grads[a.index()] += d;
                }
            }
        }
    }

    fn run_update(&mut self, lr: f64) {
        let n = self.tape.num_params();
        for (p, g) in self.values[..n].iter_mut().zip(&self.grads[..n]) {
            *p -= lr * g;
        }
    }
}
