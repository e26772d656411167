//! The operations: each one's forward formula and local derivative, side by side.
//!
//! This is the single source of truth for what an op computes. The formulas are written once,
//! generically over [`Arith`], and every backend instantiates them: the interpreter with plain
//! `f64` arithmetic ([`F64`]), the JIT with an LLVM IR emitter. That is what makes the JIT
//! bit-identical to the interpreter by construction: both perform the same IEEE operations in
//! the same order. A new op is one new arm in [`Op::forward`] and one in [`Op::local_grads`].

/// The scalar operations a backend must provide to evaluate ops.
///
/// Every method is one IEEE-754 double operation (or one call to a libm function through
/// [`libm`]); implementations must not fuse, reassociate or approximate.
pub trait Arith {
    /// A scalar: an `f64` for the interpreter, an IR value for the JIT.
    type V: Copy;
    fn constant(&mut self, c: f64) -> Self::V;
    fn add(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn div(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn neg(&mut self, a: Self::V) -> Self::V;
    fn exp(&mut self, a: Self::V) -> Self::V;
    fn log(&mut self, a: Self::V) -> Self::V;
    fn tanh(&mut self, a: Self::V) -> Self::V;
    fn powf(&mut self, a: Self::V, c: f64) -> Self::V;
    /// `then if a > b else otherwise` (false when either is NaN).
    fn select_gt(&mut self, a: Self::V, b: Self::V, then: Self::V, otherwise: Self::V) -> Self::V;
}

/// An operation of the graph. Leaves (`Input`, `Param`, `Const`) have no operands; `Sum` has
/// one or more; the others have the arity [`Op::arity`] gives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// The `n`-th input, set before each run.
    Input(u32),
    /// The `n`-th trainable parameter.
    Param(u32),
    /// A constant; its value is part of the op.
    Const(f64),
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    /// `a.powf(c)` for a constant exponent `c`.
    Powf(f64),
    Exp,
    Log,
    Tanh,
    /// micrograd's relu: `0 if a < 0 else a`.
    Relu,
    Sigmoid,
    /// `b if b > a else a`.
    Max,
    /// `((a0 + a1) + a2) + ...`, left to right.
    Sum,
}

impl Op {
    /// The number of operands, or `None` for `Sum` (any number, at least one).
    pub fn arity(self) -> Option<usize> {
        match self {
            Op::Input(_) | Op::Param(_) | Op::Const(_) => Some(0),
            Op::Neg | Op::Powf(_) | Op::Exp | Op::Log | Op::Tanh | Op::Relu | Op::Sigmoid => {
                Some(1)
            }
            Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Max => Some(2),
            Op::Sum => None,
        }
    }

    pub fn is_leaf(self) -> bool {
        matches!(self, Op::Input(_) | Op::Param(_) | Op::Const(_))
    }

    /// A short name for dumps and errors.
    pub fn name(self) -> &'static str {
        match self {
            Op::Input(_) => "input",
            Op::Param(_) => "param",
            Op::Const(_) => "const",
            Op::Add => "add",
            Op::Sub => "sub",
            Op::Mul => "mul",
            Op::Div => "div",
            Op::Neg => "neg",
            Op::Powf(_) => "powf",
            Op::Exp => "exp",
            Op::Log => "log",
            Op::Tanh => "tanh",
            Op::Relu => "relu",
            Op::Sigmoid => "sigmoid",
            Op::Max => "max",
            Op::Sum => "sum",
        }
    }

    /// The value of a non-leaf op from its operands' values.
    ///
    /// Leaves have no formula: their values live in the buffers. Calling this on a leaf returns
    /// the constant's value for `Const` and is a caller bug otherwise (it returns `0.0`).
    pub fn forward<A: Arith>(self, ar: &mut A, x: &[A::V]) -> A::V {
        match self {
            Op::Const(c) => ar.constant(c),
            Op::Input(_) | Op::Param(_) => ar.constant(0.0),
            Op::Add => ar.add(x[0], x[1]),
            Op::Sub => ar.sub(x[0], x[1]),
            Op::Mul => ar.mul(x[0], x[1]),
            Op::Div => ar.div(x[0], x[1]),
            Op::Neg => ar.neg(x[0]),
            Op::Powf(c) => ar.powf(x[0], c),
            Op::Exp => ar.exp(x[0]),
            Op::Log => ar.log(x[0]),
            Op::Tanh => ar.tanh(x[0]),
            Op::Relu => {
                let zero = ar.constant(0.0);
                ar.select_gt(zero, x[0], zero, x[0])
            }
            Op::Sigmoid => {
                // 1 / (1 + e^-x)
                let minus_x = ar.neg(x[0]);
                let e = ar.exp(minus_x);
                let one = ar.constant(1.0);
                let denom = ar.add(one, e);
                ar.div(one, denom)
            }
            Op::Max => ar.select_gt(x[1], x[0], x[1], x[0]),
            Op::Sum => {
                let mut acc = x[0];
                for &xi in &x[1..] {
                    acc = ar.add(acc, xi);
                }
                acc
            }
        }
    }

    /// What each operand's gradient receives, in operand order, given the operands `x`, this
    /// op's value `out` and its gradient `g`. The caller adds `grads[i] += local[i]` in order.
    pub fn local_grads<A: Arith>(
        self,
        ar: &mut A,
        x: &[A::V],
        out: A::V,
        g: A::V,
        local: &mut Vec<A::V>,
    ) {
        local.clear();
        match self {
            Op::Input(_) | Op::Param(_) | Op::Const(_) => {}
            Op::Add => local.extend([g, g]),
            Op::Sub => {
                let minus_g = ar.neg(g);
                local.extend([g, minus_g]);
            }
            Op::Mul => {
                // d(ab)/da = b, d(ab)/db = a
                let da = ar.mul(x[1], g);
                let db = ar.mul(x[0], g);
                local.extend([da, db]);
            }
            Op::Div => {
                // d(a/b)/da = 1/b, d(a/b)/db = -(a/b)/b
                let da = ar.div(g, x[1]);
                let out_over_b = ar.div(out, x[1]);
                let minus = ar.neg(out_over_b);
                let db = ar.mul(minus, g);
                local.extend([da, db]);
            }
            Op::Neg => {
                let minus_g = ar.neg(g);
                local.push(minus_g);
            }
            Op::Powf(c) => {
                // d(a^c)/da = c * a^(c-1), as micrograd writes it
                let c_ = ar.constant(c);
                let a_pow = ar.powf(x[0], c - 1.0);
                let d = ar.mul(c_, a_pow);
                local.push(ar.mul(d, g));
            }
            Op::Exp => local.push(ar.mul(out, g)),
            Op::Log => local.push(ar.div(g, x[0])),
            Op::Tanh => {
                // d tanh = 1 - tanh^2
                let one = ar.constant(1.0);
                let t2 = ar.mul(out, out);
                let d = ar.sub(one, t2);
                local.push(ar.mul(d, g));
            }
            Op::Relu => {
                // micrograd: (out.data > 0) * out.grad
                let (zero, one) = (ar.constant(0.0), ar.constant(1.0));
                let d = ar.select_gt(out, zero, one, zero);
                local.push(ar.mul(d, g));
            }
            Op::Sigmoid => {
                // d sigmoid = s * (1 - s)
                let one = ar.constant(1.0);
                let one_minus = ar.sub(one, out);
                let d = ar.mul(out, one_minus);
                local.push(ar.mul(d, g));
            }
            Op::Max => {
                // the gradient goes to the operand max picked
                let (zero, one) = (ar.constant(0.0), ar.constant(1.0));
                let da = ar.select_gt(x[1], x[0], zero, one);
                let db = ar.select_gt(x[1], x[0], one, zero);
                let (da, db) = (ar.mul(da, g), ar.mul(db, g));
                local.extend([da, db]);
            }
            Op::Sum => local.extend(x.iter().map(|_| g)),
        }
    }
}

/// The libm functions both backends call. The JIT calls these very functions (by address), so
/// the interpreter and the JIT agree bit for bit, and LLVM cannot rewrite them (it would turn
/// `pow(x, 2.0)` into `x * x`, which can differ in the last bit).
pub mod libm {
    pub extern "C" fn exp(x: f64) -> f64 {
        x.exp()
    }
    pub extern "C" fn log(x: f64) -> f64 {
        x.ln()
    }
    pub extern "C" fn tanh(x: f64) -> f64 {
        x.tanh()
    }
    pub extern "C" fn powf(x: f64, c: f64) -> f64 {
        x.powf(c)
    }
}

/// Plain `f64` arithmetic: the interpreter's instance of [`Arith`].
pub struct F64;

impl Arith for F64 {
    type V = f64;
    fn constant(&mut self, c: f64) -> f64 {
        c
    }
    fn add(&mut self, a: f64, b: f64) -> f64 {
        a + b
    }
    fn sub(&mut self, a: f64, b: f64) -> f64 {
        a - b
    }
    fn mul(&mut self, a: f64, b: f64) -> f64 {
        a * b
    }
    fn div(&mut self, a: f64, b: f64) -> f64 {
        a / b
    }
    fn neg(&mut self, a: f64) -> f64 {
        -a
    }
    fn exp(&mut self, a: f64) -> f64 {
        libm::exp(a)
    }
    fn log(&mut self, a: f64) -> f64 {
        libm::log(a)
    }
    fn tanh(&mut self, a: f64) -> f64 {
        libm::tanh(a)
    }
    fn powf(&mut self, a: f64, c: f64) -> f64 {
        libm::powf(a, c)
    }
    fn select_gt(&mut self, a: f64, b: f64, then: f64, otherwise: f64) -> f64 {
        if a > b {
            then
        } else {
            otherwise
        }
    }
}
