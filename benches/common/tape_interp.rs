//! The yardstick for graphs built anew (issue #40): a tape interpreter as fast as a plain one
//! gets, running tapejit's own tapes. A published benchmark of graphs that change constantly
//! crowned such an interpreter in C (a compact array of op records, one switch loop, no
//! compile step); this is that design in Rust, so the report can say how tapejit compares.
//!
//! [`TapeInterp::from_tape`] converts a [`Tape`] once into compact records: one byte per
//! operation (its [`Kind`]), the operands' indices laid end to end in one `u32` array (a
//! record's count is its kind's arity; a sum's counts, and `powf`'s exponents, sit in side
//! tables read in the same order), and constants as values of the buffer, set once. Leaves
//! come first in the buffers (params, inputs, then constants), and operation `i` writes entry
//! `first_op + i`, so a record needs no output index. A step is one loop over the records
//! forward and one backward, allocating nothing.
//!
//! It computes **bit for bit** what [`tapejit::Interpreter`] computes (checked by
//! `tests/tape_interp.rs`): forward in tape order; backward in reverse tape order, each op's
//! local derivative written as `src/op.rs` writes it and added into its operands' gradients
//! operand by operand; the SGD update as `Program::step` does it. Two liberties change no
//! bit. Operations the loss does not read (an output's own) run after the others, so that
//! backward walks a prefix of the records: nothing the loss reads depends on them. And
//! backward adds into every operand, where the interpreter skips inputs made without a
//! gradient: nothing reads a leaf's gradient during backward, so those are zeroed at its end.
//!
//! Included with `#[path]` by the report and the tests.

// Each includer uses part of this file.
#![allow(dead_code)]

use tapejit::{Op, Slot, Tape};

/// What a record computes: an operation of [`Op`] other than a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    /// Its exponent is the next of [`TapeInterp::exponents`].
    Powf,
    Exp,
    Log,
    Tanh,
    Relu,
    Sigmoid,
    Softplus,
    Log1p,
    Abs,
    Sin,
    Cos,
    Sqrt,
    Max,
    Min,
    /// Its operand count is the next of [`TapeInterp::sum_lens`].
    Sum,
}

impl Kind {
    /// The record of `op`, `None` for a leaf. Exhaustive: a new op does not build until it
    /// has a record here and arms in `forward` and `backward`.
    fn of(op: Op) -> Option<Kind> {
        Some(match op {
            Op::Input(_) | Op::Param(_) | Op::Const(_) => return None,
            Op::Add => Kind::Add,
            Op::Sub => Kind::Sub,
            Op::Mul => Kind::Mul,
            Op::Div => Kind::Div,
            Op::Neg => Kind::Neg,
            Op::Powf(_) => Kind::Powf,
            Op::Exp => Kind::Exp,
            Op::Log => Kind::Log,
            Op::Tanh => Kind::Tanh,
            Op::Relu => Kind::Relu,
            Op::Sigmoid => Kind::Sigmoid,
            Op::Softplus => Kind::Softplus,
            Op::Log1p => Kind::Log1p,
            Op::Abs => Kind::Abs,
            Op::Sin => Kind::Sin,
            Op::Cos => Kind::Cos,
            Op::Sqrt => Kind::Sqrt,
            Op::Max => Kind::Max,
            Op::Min => Kind::Min,
            Op::Sum => Kind::Sum,
        })
    }
}

/// A tape as compact records, with its value and gradient buffers.
pub struct TapeInterp {
    /// One per operation: the needs-gradient ones in tape order, then the others.
    kinds: Vec<Kind>,
    /// Each record's operands (buffer indices), record after record.
    args: Vec<u32>,
    /// Each sum's operand count, sum after sum.
    sum_lens: Vec<u32>,
    /// Each `powf`'s exponent, one after another.
    exponents: Vec<f64>,
    /// Where operation 0 writes: params, inputs and constants come before.
    first_op: usize,
    /// The operations backward walks (those the loss reads: the first of `kinds`), and the
    /// operands, sums and exponents they read.
    backward_ops: usize,
    backward_args: usize,
    backward_sums: usize,
    backward_exponents: usize,
    values: Vec<f64>,
    grads: Vec<f64>,
    num_params: usize,
    input_base: usize,
    num_inputs: usize,
    loss: Option<usize>,
    /// Inputs made without a gradient, whose gradient backward zeroes after adding into it.
    no_grad_inputs: Vec<u32>,
    /// Each param's buffer index, in creation order.
    param_index: Vec<u32>,
    /// Each tape slot's buffer index.
    index_of_slot: Vec<u32>,
}

/// A tape's node as the conversion reads it.
struct Node {
    op: Op,
    needs_grad: bool,
    /// Its operands' slots in [`TapeInterp::from_tape`]'s scratch.
    args: std::ops::Range<usize>,
}

impl TapeInterp {
    /// Converts `tape` into records, once; values start as a fresh program's (params'
    /// initial values, constants), gradients at 0.
    pub fn from_tape(tape: &Tape) -> TapeInterp {
        let (p, n_in) = (tape.num_params(), tape.num_inputs());
        let mut nodes = Vec::with_capacity(tape.len());
        let mut slot_args: Vec<u32> = Vec::new();
        for s in tape.slots() {
            let view = tape.node(s).expect("a slot of the tape");
            let start = slot_args.len();
            slot_args.extend(view.args.iter().map(|a| a.0));
            nodes.push(Node {
                op: view.op,
                needs_grad: view.needs_grad,
                args: start..slot_args.len(),
            });
        }
        // Buffer indices: params and inputs where the tape has them, then constants, then
        // the operations backward walks, then the rest.
        let mut index_of_slot = vec![0u32; nodes.len()];
        let mut values = vec![0.0; nodes.len()];
        let mut next = (p + n_in) as u32;
        for (s, node) in nodes.iter().enumerate() {
            match node.op {
                Op::Param(_) | Op::Input(_) => index_of_slot[s] = s as u32,
                Op::Const(c) => {
                    index_of_slot[s] = next;
                    values[next as usize] = c;
                    next += 1;
                }
                _ => {}
            }
        }
        for (&s, &init) in tape.param_slots().iter().zip(tape.param_init()) {
            values[s.index()] = init;
        }
        let first_op = next as usize;
        for pass_needs_grad in [true, false] {
            for (s, node) in nodes.iter().enumerate() {
                if !node.op.is_leaf() && node.needs_grad == pass_needs_grad {
                    index_of_slot[s] = next;
                    next += 1;
                }
            }
        }
        let mut t = TapeInterp {
            kinds: Vec::with_capacity(nodes.len() - first_op),
            args: Vec::with_capacity(slot_args.len()),
            sum_lens: Vec::new(),
            exponents: Vec::new(),
            first_op,
            backward_ops: 0,
            backward_args: 0,
            backward_sums: 0,
            backward_exponents: 0,
            grads: vec![0.0; values.len()],
            values,
            num_params: p,
            input_base: tape.input_base(),
            num_inputs: n_in,
            loss: tape.loss().map(|l| index_of_slot[l.index()] as usize),
            no_grad_inputs: (p..p + n_in)
                .filter(|&s| !nodes[s].needs_grad)
                .map(|s| s as u32)
                .collect(),
            param_index: tape.param_slots().iter().map(|s| s.0).collect(),
            index_of_slot,
        };
        for pass_needs_grad in [true, false] {
            for node in nodes.iter().filter(|n| n.needs_grad == pass_needs_grad) {
                let Some(kind) = Kind::of(node.op) else {
                    continue;
                };
                let operands = &slot_args[node.args.clone()];
                t.args
                    .extend(operands.iter().map(|&a| t.index_of_slot[a as usize]));
                match node.op {
                    Op::Sum => t.sum_lens.push(operands.len() as u32),
                    Op::Powf(c) => t.exponents.push(c),
                    _ => {}
                }
                t.kinds.push(kind);
            }
            if pass_needs_grad {
                t.backward_ops = t.kinds.len();
                t.backward_args = t.args.len();
                t.backward_sums = t.sum_lens.len();
                t.backward_exponents = t.exponents.len();
            }
        }
        t.check();
        t
    }

    /// What makes the loops' unchecked reads sound: each record reads its arity's operands
    /// (a sum its count, at least one), each an entry before the one it writes, and the
    /// side tables hold what the records read.
    fn check(&self) {
        let (mut a, mut s, mut e) = (0usize, 0usize, 0usize);
        for (i, &kind) in self.kinds.iter().enumerate() {
            let n = match kind {
                Kind::Sum => {
                    s += 1;
                    self.sum_lens[s - 1] as usize
                }
                Kind::Powf => {
                    e += 1;
                    1
                }
                Kind::Add | Kind::Sub | Kind::Mul | Kind::Div | Kind::Max | Kind::Min => 2,
                Kind::Neg | Kind::Exp | Kind::Log | Kind::Tanh | Kind::Relu | Kind::Sigmoid => 1,
                Kind::Softplus | Kind::Log1p | Kind::Abs | Kind::Sin | Kind::Cos | Kind::Sqrt => 1,
            };
            assert!(n >= 1);
            let out = self.first_op + i;
            assert!(self.args[a..a + n].iter().all(|&x| (x as usize) < out));
            a += n;
            if i + 1 == self.backward_ops {
                assert_eq!(
                    (a, s, e),
                    (
                        self.backward_args,
                        self.backward_sums,
                        self.backward_exponents
                    )
                );
            }
        }
        assert_eq!(
            (a, s, e),
            (self.args.len(), self.sum_lens.len(), self.exponents.len())
        );
        assert_eq!(self.first_op + self.kinds.len(), self.values.len());
        assert_eq!(self.values.len(), self.grads.len());
        assert!(self.loss.map_or(true, |l| l < self.values.len()));
    }

    pub fn num_inputs(&self) -> usize {
        self.num_inputs
    }

    /// Buffer entries: one per tape slot.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn set_inputs(&mut self, inputs: &[f64]) {
        let base = self.input_base;
        self.values[base..base + self.num_inputs].copy_from_slice(inputs);
    }

    /// `Program::step` with plain SGD: inputs, `zero_grad`, forward, backward, `p -= lr *
    /// grad`. Returns the loss before the update.
    pub fn step(&mut self, inputs: &[f64], lr: f64) -> f64 {
        self.set_inputs(inputs);
        let loss = self.loss.expect("a tape with a loss");
        let before = self.values[loss];
        self.grads[..self.num_params].fill(0.0);
        self.forward();
        self.backward();
        let n = self.num_params;
        for (p, g) in self.values[..n].iter_mut().zip(&self.grads[..n]) {
            *p -= lr * g;
        }
        if loss < self.first_op {
            before
        } else {
            self.values[loss]
        }
    }

    /// Every operation's value, record by record.
    pub fn forward(&mut self) {
        let vals = self.values.as_mut_ptr();
        let (args, sum_lens, exponents) = (&self.args, &self.sum_lens, &self.exponents);
        let (mut a, mut s, mut e) = (0usize, 0usize, 0usize);
        for (i, &kind) in self.kinds.iter().enumerate() {
            // SAFETY (every `unsafe` below): `check` proved that the records read `args`
            // and the side tables within their lengths, and buffer entries before
            // `first_op + i`, which is below `values.len()`.
            macro_rules! x {
                ($k:expr) => {
                    unsafe { *vals.add(*args.get_unchecked(a + $k) as usize) }
                };
            }
            // A unary or binary operation: its operands read, the cursor moved past them.
            macro_rules! unary {
                (|$x:ident| $v:expr) => {{
                    let $x = x!(0);
                    a += 1;
                    $v
                }};
            }
            macro_rules! binary {
                (|$x0:ident, $x1:ident| $v:expr) => {{
                    let ($x0, $x1) = (x!(0), x!(1));
                    a += 2;
                    $v
                }};
            }
            let v = match kind {
                Kind::Add => binary!(|x0, x1| x0 + x1),
                Kind::Sub => binary!(|x0, x1| x0 - x1),
                Kind::Mul => binary!(|x0, x1| x0 * x1),
                Kind::Div => binary!(|x0, x1| x0 / x1),
                Kind::Max => binary!(|x0, x1| if x1 > x0 { x1 } else { x0 }),
                Kind::Min => binary!(|x0, x1| if x0 > x1 { x1 } else { x0 }),
                Kind::Neg => unary!(|x| -x),
                Kind::Powf => {
                    let c = unsafe { *exponents.get_unchecked(e) };
                    e += 1;
                    unary!(|x| power(x, c))
                }
                Kind::Exp => unary!(|x| tapejit::op::exp(x)),
                Kind::Log => unary!(|x| tapejit::op::log(x)),
                Kind::Tanh => unary!(|x| tapejit::op::tanh(x)),
                Kind::Relu => unary!(|x| if 0.0 > x { 0.0 } else { x }),
                Kind::Sigmoid => unary!(|x| sigmoid(x)),
                // max(x, 0) + log1p(e^-|x|)
                Kind::Softplus => unary!(|x| {
                    let positive_part = if x > 0.0 { x } else { 0.0 };
                    positive_part + tapejit::op::log1p(tapejit::op::exp(-abs(x)))
                }),
                Kind::Log1p => unary!(|x| tapejit::op::log1p(x)),
                Kind::Abs => unary!(|x| abs(x)),
                Kind::Sin => unary!(|x| tapejit::op::sin(x)),
                Kind::Cos => unary!(|x| tapejit::op::cos(x)),
                Kind::Sqrt => unary!(|x| sqrt(x)),
                Kind::Sum => {
                    let n = unsafe { *sum_lens.get_unchecked(s) } as usize;
                    s += 1;
                    let mut acc = x!(0);
                    for k in 1..n {
                        acc += x!(k);
                    }
                    a += n;
                    acc
                }
            };
            unsafe { *vals.add(self.first_op + i) = v };
        }
    }

    /// Gradients from the loss's, in reverse record order: zeroes every gradient but the
    /// params' (which accumulate until `step` zeroes them), sets the loss's to 1, and adds
    /// each operation's local gradients into its operands', operand by operand.
    pub fn backward(&mut self) {
        let Some(loss) = self.loss else {
            return;
        };
        self.grads[self.num_params..].fill(0.0);
        self.grads[loss] = 1.0;
        let (vals, grads) = (self.values.as_ptr(), self.grads.as_mut_ptr());
        let (args, sum_lens, exponents) = (&self.args, &self.sum_lens, &self.exponents);
        let mut a = self.backward_args;
        let (mut s, mut e) = (self.backward_sums, self.backward_exponents);
        for (i, &kind) in self.kinds[..self.backward_ops].iter().enumerate().rev() {
            // SAFETY (every `unsafe` below): as in `forward`; the cursors walk back over
            // what forward read of the first `backward_ops` records.
            let (out, g) = unsafe {
                let o = self.first_op + i;
                (*vals.add(o), *grads.add(o))
            };
            // Operand `k`'s buffer index (inside the `unsafe` of `x` and `add`).
            macro_rules! arg {
                ($k:expr) => {
                    *args.get_unchecked(a + $k) as usize
                };
            }
            macro_rules! x {
                ($k:expr) => {
                    unsafe { *vals.add(arg!($k)) }
                };
            }
            macro_rules! add {
                ($k:expr, $d:expr) => {
                    unsafe { *grads.add(arg!($k)) += $d }
                };
            }
            // A unary operation's local gradient added into its operand's.
            macro_rules! unary {
                (|$x:ident| $d:expr) => {{
                    a -= 1;
                    let $x = x!(0);
                    add!(0, $d);
                }};
            }
            match kind {
                Kind::Add => {
                    a -= 2;
                    add!(0, g);
                    add!(1, g);
                }
                Kind::Sub => {
                    a -= 2;
                    add!(0, g);
                    add!(1, -g);
                }
                Kind::Mul => {
                    a -= 2;
                    let (da, db) = (x!(1) * g, x!(0) * g);
                    add!(0, da);
                    add!(1, db);
                }
                Kind::Div => {
                    a -= 2;
                    let da = g / x!(1);
                    let db = -(out / x!(1)) * g;
                    add!(0, da);
                    add!(1, db);
                }
                // The gradient goes to the operand picked (a on a tie).
                Kind::Max => {
                    a -= 2;
                    let (da, db) = picked(x!(1) > x!(0), g);
                    add!(0, da);
                    add!(1, db);
                }
                Kind::Min => {
                    a -= 2;
                    let (da, db) = picked(x!(0) > x!(1), g);
                    add!(0, da);
                    add!(1, db);
                }
                Kind::Neg => unary!(|_x| -g),
                Kind::Powf => {
                    e -= 1;
                    let c = unsafe { *exponents.get_unchecked(e) };
                    unary!(|x| power_derivative(x, c, out) * g)
                }
                Kind::Exp => unary!(|_x| out * g),
                Kind::Log => unary!(|x| g / x),
                Kind::Tanh => unary!(|_x| (1.0 - out * out) * g),
                Kind::Relu => unary!(|_x| (if out > 0.0 { 1.0 } else { 0.0 }) * g),
                Kind::Sigmoid => unary!(|_x| (out * (1.0 - out)) * g),
                Kind::Softplus => unary!(|x| sigmoid(x) * g),
                Kind::Log1p => unary!(|x| g / (1.0 + x)),
                // sign(x), 0 at the zeros and NaN
                Kind::Abs => unary!(|x| {
                    let below = if 0.0 > x { -1.0 } else { 0.0 };
                    (if x > 0.0 { 1.0 } else { below }) * g
                }),
                Kind::Sin => unary!(|x| tapejit::op::cos(x) * g),
                Kind::Cos => unary!(|x| -tapejit::op::sin(x) * g),
                Kind::Sqrt => unary!(|_x| (0.5 / out) * g),
                Kind::Sum => {
                    s -= 1;
                    let n = unsafe { *sum_lens.get_unchecked(s) } as usize;
                    a -= n;
                    for k in 0..n {
                        add!(k, g);
                    }
                }
            }
        }
        for &k in &self.no_grad_inputs {
            self.grads[k as usize] = 0.0;
        }
    }

    /// The params in creation order.
    pub fn params(&self) -> Vec<f64> {
        self.param_index
            .iter()
            .map(|&k| self.values[k as usize])
            .collect()
    }

    /// Sets the params, given in creation order.
    pub fn set_params(&mut self, params: &[f64]) {
        for (&k, &p) in self.param_index.iter().zip(params) {
            self.values[k as usize] = p;
        }
    }

    /// Every value in tape slot order (as `Program::values` shows the interpreter's).
    pub fn values_by_slot(&self) -> Vec<f64> {
        self.by_slot(&self.values)
    }

    /// Every gradient in tape slot order.
    pub fn grads_by_slot(&self) -> Vec<f64> {
        self.by_slot(&self.grads)
    }

    fn by_slot(&self, buf: &[f64]) -> Vec<f64> {
        self.index_of_slot
            .iter()
            .map(|&k| buf[k as usize])
            .collect()
    }

    /// The buffer index of tape slot `s`.
    pub fn index(&self, s: Slot) -> usize {
        self.index_of_slot[s.index()] as usize
    }
}

// The scalar formulas, shared with the other bench interpreter (an includer of both loads
// them twice, which costs nothing).
#[allow(clippy::duplicate_mod)]
#[path = "scalar_formulas.rs"]
mod scalar_formulas;
use scalar_formulas::{abs, picked, power, power_derivative, sigmoid, sqrt};
