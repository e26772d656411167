//! The operations: each one's forward formula and local derivative, side by side.
//!
//! This is the single source of truth for what an op computes. The formulas are written once,
//! generically over [`Arith`], and every backend instantiates them: the interpreter with plain
//! `f64` arithmetic ([`F64`]), the JIT with an LLVM IR emitter. That is what makes the JIT
//! bit-identical to the interpreter by construction: both perform the same IEEE operations in
//! the same order. A new op is one new arm in [`Op::forward`] and one in [`Op::local_grads`].

mod formulas;
mod log_table;
mod power;
mod reads;
mod trig;

pub(crate) use formulas::{pow2, ROUNDER};
pub use reads::BackwardReads;

use power::{power, sqrt, sqrt_derivative};

/// The scalar operations a backend must provide to evaluate ops.
///
/// Every primitive is one IEEE-754 double operation (or one call to a [`MathFn`]; [`Arith::pow2`]
/// exact integer operations on bits), and the `_with` methods choose between computations;
/// implementations must not fuse, reassociate or approximate.
pub trait Arith {
    /// A scalar: an `f64` for the interpreter, an IR value for the JIT.
    type V: Copy;
    fn constant(&mut self, c: f64) -> Self::V;
    fn add(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn sub(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn mul(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn div(&mut self, a: Self::V, b: Self::V) -> Self::V;
    fn neg(&mut self, a: Self::V) -> Self::V;
    /// `f(args...)`, calling the very function [`MathFn::address`] names (`args` has
    /// [`MathFn::arity`] values).
    fn call(&mut self, f: MathFn, args: &[Self::V]) -> Self::V;
    /// `then if a > b else otherwise` (false when either is NaN).
    fn select_gt(&mut self, a: Self::V, b: Self::V, then: Self::V, otherwise: Self::V) -> Self::V;
    /// `a * b + c` rounded once (IEEE fusedMultiplyAdd; never made from `mul` and `add`,
    /// which round twice): what the math formulas' polynomials step by.
    fn mul_add(&mut self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `then(self)` if `a > b`, else `otherwise(self)`: [`Arith::select_gt`] of two values
    /// yet to be computed, the math formulas' branches. Both are computed and one picked;
    /// a backend that computes one value at a time (the interpreter) computes only the one
    /// it picks, with the same result.
    fn select_gt_with(
        &mut self,
        a: Self::V,
        b: Self::V,
        then: impl FnOnce(&mut Self) -> Self::V,
        otherwise: impl FnOnce(&mut Self) -> Self::V,
    ) -> Self::V
    where
        Self: Sized,
    {
        let then = then(self);
        let otherwise = otherwise(self);
        self.select_gt(a, b, then, otherwise)
    }
    /// [`Arith::select_gt_with`] of two long computations: a backend of vector lanes may
    /// compute only the case every lane takes, where they agree (each lane's result is the
    /// same), and both otherwise. The same result on every backend.
    #[inline(always)]
    fn branch_gt_with(
        &mut self,
        a: Self::V,
        b: Self::V,
        then: impl Fn(&mut Self) -> Self::V,
        otherwise: impl Fn(&mut Self) -> Self::V,
    ) -> Self::V
    where
        Self: Sized,
    {
        self.select_gt_with(a, b, then, otherwise)
    }
    /// `2^k` for an integral `k` in `[-1022, 1023]`, built from its bits: exactly
    /// `(bits(k + 1.5 * 2^52) + 1023) << 52` in wrapping integer arithmetic, for any `k`,
    /// so that backends agree on every input. What the math formulas scale by.
    fn pow2(&mut self, k: Self::V) -> Self::V;
    /// A positive normal `x` as `2^k z`, `z` in `[0.6875, 1.375)`, and which of 128
    /// subintervals `z` lies in (`i`: `[0.6875 + i/256, +1/256)` below 1,
    /// `[1 + (i - 80)/128, +1/128)` from 1): `[k, z, i]`, the reduction of a table-driven
    /// logarithm, read off the bits (exactly [`log_split`] in wrapping integer arithmetic,
    /// for any `x`, so that backends agree on every input).
    fn log_split(&mut self, x: Self::V) -> [Self::V; 3];
    /// `table`'s entry `i` (an integral `i` in `0..128`, as [`Arith::log_split`] gives).
    fn lookup(&mut self, table: &'static Table, i: Self::V) -> Self::V;
}

/// 128 numbers a formula looks up ([`Arith::lookup`]), by their bits, and the name the JIT's
/// IR gives them.
pub struct Table {
    pub name: &'static str,
    bits: [u64; 128],
}

impl Table {
    const fn of_bits(name: &'static str, bits: [u64; 128]) -> Table {
        Table { name, bits }
    }

    /// Entry `i` (taken modulo 128).
    pub fn value(&self, i: usize) -> f64 {
        f64::from_bits(self.bits[i % 128])
    }
}

/// The interpreter's [`Arith::log_split`]: with `t = bits(x) - bits(0.6875)`, `k = t >> 52`
/// (arithmetic), `i = (t >> 45) mod 128`, `z = from_bits(bits(x) - (t & 0xfff << 52))`.
pub fn log_split(x: f64) -> [f64; 3] {
    let bits = x.to_bits();
    let t = bits.wrapping_sub(LOG_OFFSET);
    let k = (t as i64) >> 52;
    let i = (t >> 45) % 128;
    let z = f64::from_bits(bits.wrapping_sub(t & (0xfff << 52)));
    [k as f64, z, i as f64]
}

/// The bits of 0.6875, where [`Arith::log_split`]'s `z` starts.
pub const LOG_OFFSET: u64 = 0x3fe6_0000_0000_0000;

/// An operation of the graph. Leaves (`Input`, `Param`, `Const`) have no operands; `Sum` has
/// one or more; the others have the arity [`Op::arity`] gives. `Op::iter()` lists every
/// variant once (fields 0), so tests and tables derived from it cover a new op unedited.
#[derive(Clone, Copy, Debug, PartialEq, strum::EnumIter, strum::EnumDiscriminants)]
#[strum_discriminants(name(OpKind))]
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
    /// `a.powf(c)` for a constant exponent `c` (derivative `c * a^(c-1)`, but `0.5 / out`
    /// for the square root).
    Powf(f64),
    /// [`exp`]: a formula of ours, written once over [`Arith`].
    Exp,
    Log,
    /// [`tanh`]: a formula of ours, written once over [`Arith`].
    Tanh,
    /// micrograd's relu: `0 if a < 0 else a`.
    Relu,
    Sigmoid,
    /// `log(1 + e^x)`, as `max(x, 0) + log1p(e^-|x|)`: finite for every finite `x` (0 at
    /// -1000, 1000 at 1000), `x` itself from about 33.3 on, where the rest rounds away.
    /// PyTorch returns `x` from 20 on (off by up to e^-20, 2e-9); this needs no threshold.
    /// Derivative `sigmoid(x)`, 0 and 1 far out.
    Softplus,
    /// `log(1 + x)`, a formula of ours (exact near 0, where `log(1 + x)` rounds `1 + x`).
    Log1p,
    /// `|x|` (`+0` for `-0`); derivative `sign(x)`, 0 at 0, as PyTorch's `sgn`.
    Abs,
    /// `sin(x)`: a formula of ours (libm's beyond `|x| < 2^20`).
    Sin,
    /// `cos(x)`: a formula of ours (libm's beyond `|x| < 2^20`).
    Cos,
    /// The square root: `x ** 0.5`'s very numbers, value and derivative (see `power`).
    Sqrt,
    /// `b if b > a else a`.
    Max,
    /// `b if b < a else a`: on a tie `a`, which takes the gradient, as in [`Op::Max`].
    Min,
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
            Op::Softplus | Op::Log1p | Op::Abs | Op::Sin | Op::Cos | Op::Sqrt => Some(1),
            Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Max | Op::Min => Some(2),
            Op::Sum => None,
        }
    }

    pub fn is_leaf(self) -> bool {
        matches!(self, Op::Input(_) | Op::Param(_) | Op::Const(_))
    }

    /// Whether `other` is this op as a copy of its node would have it: the same op, to the
    /// bit for a constant or an exponent, but any input for an input and any param for a
    /// param (a copy reads its own).
    pub(crate) fn repeated_as(self, other: Op) -> bool {
        match (self, other) {
            (Op::Input(_), Op::Input(_)) | (Op::Param(_), Op::Param(_)) => true,
            (Op::Const(x), Op::Const(y)) | (Op::Powf(x), Op::Powf(y)) => x.to_bits() == y.to_bits(),
            (x, y) => x == y,
        }
    }

    /// The op as two numbers that tell any two ops apart: its variant's position (derived, so
    /// a new variant gets its own) and its field's bits (an index, or a constant's or
    /// exponent's every bit; 0 for ops without one). What structural caches key on.
    pub fn key(self) -> [u64; 2] {
        let field = match self {
            Op::Input(n) | Op::Param(n) => n as u64,
            Op::Const(c) | Op::Powf(c) => c.to_bits(),
            Op::Add | Op::Sub | Op::Mul | Op::Div | Op::Neg | Op::Exp | Op::Log | Op::Tanh => 0,
            Op::Relu | Op::Sigmoid | Op::Softplus | Op::Log1p | Op::Abs | Op::Sin => 0,
            Op::Cos | Op::Sqrt | Op::Max | Op::Min | Op::Sum => 0,
        };
        [OpKind::from(self) as u64, field]
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
            Op::Softplus => "softplus",
            Op::Log1p => "log1p",
            Op::Abs => "abs",
            Op::Sin => "sin",
            Op::Cos => "cos",
            Op::Sqrt => "sqrt",
            Op::Max => "max",
            Op::Min => "min",
            Op::Sum => "sum",
        }
    }

    /// Where operand `i` must lie for this op to be finite and smooth there (no kink, no
    /// pole): what generated tests keep operands in. `Sum`'s operands are all alike.
    pub fn domain(self, operand: usize) -> Domain {
        match (self, operand) {
            (Op::Div, 1) | (Op::Relu, _) | (Op::Abs, _) => Domain::NonZero,
            // log1p's lies above -1: the positive half of it will do.
            (Op::Log, _) | (Op::Log1p, _) | (Op::Sqrt, _) => Domain::Positive,
            (Op::Powf(c), _) if c.fract() != 0.0 => Domain::Positive,
            // 0 too: its derivative `0 * a^-1` is NaN at a = 0.
            (Op::Powf(c), _) if c <= 0.0 => Domain::NonZero,
            (Op::Max, 1) | (Op::Min, 1) => Domain::ApartFrom(0),
            _ => Domain::Real,
        }
    }

    /// The operands `forward` and `local_grads` read: at least [`Op::arity`] (one for `Sum`).
    fn min_operands(self) -> usize {
        self.arity().unwrap_or(1)
    }

    /// The value of a non-leaf op from its operands' values.
    ///
    /// Leaves have no formula: their values live in the buffers. Calling this on a leaf returns
    /// the constant's value for `Const` and is a caller bug otherwise (it returns `0.0`), as is
    /// passing fewer operands than the op takes (the missing ones read as NaN).
    // (Inlined into every caller: a caller that knows the op, as the kernel tier's runs
    // do, [`Op::specialize`], keeps only its arm.)
    #[inline(always)]
    pub fn forward<A: Arith>(self, ar: &mut A, x: &[A::V]) -> A::V {
        if x.len() < self.min_operands() {
            return self.forward_padded(ar, x);
        }
        self.forward_of(ar, x)
    }

    /// [`Op::forward`] of too few operands: the missing ones NaN.
    #[inline(never)]
    #[cold]
    fn forward_padded<A: Arith>(self, ar: &mut A, x: &[A::V]) -> A::V {
        let x = padded_with_nan(ar, x, self.min_operands());
        self.forward_of(ar, &x)
    }

    /// [`Op::forward`] of enough operands.
    #[inline(always)]
    fn forward_of<A: Arith>(self, ar: &mut A, x: &[A::V]) -> A::V {
        match self {
            Op::Const(c) => ar.constant(c),
            Op::Input(_) | Op::Param(_) => ar.constant(0.0),
            Op::Add => ar.add(x[0], x[1]),
            Op::Sub => ar.sub(x[0], x[1]),
            Op::Mul => ar.mul(x[0], x[1]),
            Op::Div => ar.div(x[0], x[1]),
            Op::Neg => ar.neg(x[0]),
            Op::Powf(c) => power(ar, x[0], c),
            Op::Exp => ar.call(MathFn::Exp, &[x[0]]),
            Op::Log => ar.call(MathFn::Log, &[x[0]]),
            Op::Tanh => ar.call(MathFn::Tanh, &[x[0]]),
            Op::Relu => {
                let zero = ar.constant(0.0);
                ar.select_gt(zero, x[0], zero, x[0])
            }
            Op::Sigmoid => sigmoid(ar, x[0]),
            Op::Softplus => {
                // max(x, 0) + log1p(e^-|x|): e^-|x| <= 1 never overflows, and the log1p
                // term is below half an ULP of x from x = 33.3 on, so the sum is x there.
                let zero = ar.constant(0.0);
                let positive_part = ar.select_gt(x[0], zero, x[0], zero);
                let a = abs(ar, x[0]);
                let minus_a = ar.neg(a);
                let e = ar.call(MathFn::Exp, &[minus_a]);
                let log_term = ar.call(MathFn::Log1p, &[e]);
                ar.add(positive_part, log_term)
            }
            Op::Log1p => ar.call(MathFn::Log1p, &[x[0]]),
            Op::Abs => abs(ar, x[0]),
            Op::Sin => ar.call(MathFn::Sin, &[x[0]]),
            Op::Cos => ar.call(MathFn::Cos, &[x[0]]),
            Op::Sqrt => sqrt(ar, x[0]),
            Op::Max => ar.select_gt(x[1], x[0], x[1], x[0]),
            Op::Min => ar.select_gt(x[0], x[1], x[1], x[0]),
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
    /// Missing operands read as NaN, as in [`Op::forward`].
    pub fn local_grads<A: Arith>(
        self,
        ar: &mut A,
        x: &[A::V],
        out: A::V,
        g: A::V,
        local: &mut Vec<A::V>,
    ) {
        local.clear();
        self.local_grads_into(ar, x, out, g, local)
    }

    /// [`Op::local_grads`] handed to `sink` operand by operand, in operand order, as each is
    /// computed (a caller that adds them straight into gradients stores none).
    // (Inlined into every caller: a caller that knows the op, as the kernel tier's runs
    // do, [`Op::specialize`], keeps only its arm.)
    #[inline(always)]
    pub fn local_grads_into<A: Arith>(
        self,
        ar: &mut A,
        x: &[A::V],
        out: A::V,
        g: A::V,
        sink: &mut impl GradSink<A::V>,
    ) {
        if x.len() < self.min_operands() {
            return self.local_grads_padded(ar, x, out, g, sink);
        }
        self.local_grads_of(ar, x, out, g, sink)
    }

    /// [`Op::local_grads_into`] of too few operands: the missing ones NaN.
    #[inline(never)]
    #[cold]
    fn local_grads_padded<A: Arith>(
        self,
        ar: &mut A,
        x: &[A::V],
        out: A::V,
        g: A::V,
        sink: &mut impl GradSink<A::V>,
    ) {
        let x = padded_with_nan(ar, x, self.min_operands());
        self.local_grads_of(ar, &x, out, g, sink)
    }

    /// [`Op::local_grads_into`] of enough operands.
    #[inline(always)]
    fn local_grads_of<A: Arith>(
        self,
        ar: &mut A,
        x: &[A::V],
        out: A::V,
        g: A::V,
        local: &mut impl GradSink<A::V>,
    ) {
        match self {
            Op::Input(_) | Op::Param(_) | Op::Const(_) => {}
            Op::Add => {
                local.give(0, g);
                local.give(1, g);
            }
            Op::Sub => {
                let minus_g = ar.neg(g);
                local.give(0, g);
                local.give(1, minus_g);
            }
            Op::Mul => {
                // d(ab)/da = b, d(ab)/db = a
                let da = ar.mul(x[1], g);
                let db = ar.mul(x[0], g);
                local.give(0, da);
                local.give(1, db);
            }
            Op::Div => {
                // d(a/b)/da = 1/b, d(a/b)/db = -(a/b)/b
                let da = ar.div(g, x[1]);
                let out_over_b = ar.div(out, x[1]);
                let minus = ar.neg(out_over_b);
                let db = ar.mul(minus, g);
                local.give(0, da);
                local.give(1, db);
            }
            Op::Neg => {
                let minus_g = ar.neg(g);
                local.give(0, minus_g);
            }
            Op::Powf(c) => {
                // d(a^c)/da = c * a^(c-1), as micrograd writes it; for the square root
                // 0.5 / a^(1/2), from the value itself, as PyTorch writes it: pow's values
                // at every special point (a = +-0, +-inf), within 2 ULP of micrograd's
                // elsewhere, and a division instead of a second power.
                let d = if c == 0.5 {
                    sqrt_derivative(ar, out)
                } else if c == -1.5 {
                    // -1.5 a^-1.5 / a from the value, where a^-2.5 would be a general
                    // power, a log and an exp (a + 0: at -0 as at +0, pow's -inf).
                    let zero = ar.constant(0.0);
                    let a = ar.add(x[0], zero);
                    let q = ar.div(out, a);
                    let c_ = ar.constant(c);
                    ar.mul(c_, q)
                } else {
                    let c_ = ar.constant(c);
                    let a_pow = power(ar, x[0], c - 1.0);
                    ar.mul(c_, a_pow)
                };
                local.give(0, ar.mul(d, g));
            }
            Op::Exp => local.give(0, ar.mul(out, g)),
            Op::Log => local.give(0, ar.div(g, x[0])),
            Op::Tanh => {
                // d tanh = 1 - tanh^2
                let one = ar.constant(1.0);
                let t2 = ar.mul(out, out);
                let d = ar.sub(one, t2);
                local.give(0, ar.mul(d, g));
            }
            Op::Relu => {
                // micrograd: (out.data > 0) * out.grad
                let (zero, one) = (ar.constant(0.0), ar.constant(1.0));
                let d = ar.select_gt(out, zero, one, zero);
                local.give(0, ar.mul(d, g));
            }
            Op::Sigmoid => {
                // d sigmoid = s * (1 - s)
                let one = ar.constant(1.0);
                let one_minus = ar.sub(one, out);
                let d = ar.mul(out, one_minus);
                local.give(0, ar.mul(d, g));
            }
            Op::Softplus => {
                // d softplus = sigmoid(x), from x: finite at every x (1 - e^-out, from the
                // value, would lose every digit where softplus is tiny).
                let d = sigmoid(ar, x[0]);
                local.give(0, ar.mul(d, g));
            }
            Op::Log1p => {
                // d log(1 + x) = 1 / (1 + x)
                let one = ar.constant(1.0);
                let one_plus_x = ar.add(one, x[0]);
                local.give(0, ar.div(g, one_plus_x));
            }
            Op::Abs => {
                // sign(x): 1 above 0, -1 below, 0 at +-0 (and NaN), as PyTorch's sgn.
                let (zero, one, minus_one) =
                    (ar.constant(0.0), ar.constant(1.0), ar.constant(-1.0));
                let below = ar.select_gt(zero, x[0], minus_one, zero);
                let d = ar.select_gt(x[0], zero, one, below);
                local.give(0, ar.mul(d, g));
            }
            Op::Sin => {
                let d = ar.call(MathFn::Cos, &[x[0]]);
                local.give(0, ar.mul(d, g));
            }
            Op::Cos => {
                let sin = ar.call(MathFn::Sin, &[x[0]]);
                let d = ar.neg(sin);
                local.give(0, ar.mul(d, g));
            }
            Op::Sqrt => {
                let d = sqrt_derivative(ar, out);
                local.give(0, ar.mul(d, g));
            }
            Op::Max => {
                // the gradient goes to the operand max picked
                let (zero, one) = (ar.constant(0.0), ar.constant(1.0));
                let da = ar.select_gt(x[1], x[0], zero, one);
                let db = ar.select_gt(x[1], x[0], one, zero);
                let (da, db) = (ar.mul(da, g), ar.mul(db, g));
                local.give(0, da);
                local.give(1, db);
            }
            Op::Min => {
                // the gradient goes to the operand min picked (a on a tie, as max)
                let (zero, one) = (ar.constant(0.0), ar.constant(1.0));
                let da = ar.select_gt(x[0], x[1], zero, one);
                let db = ar.select_gt(x[0], x[1], one, zero);
                let (da, db) = (ar.mul(da, g), ar.mul(db, g));
                local.give(0, da);
                local.give(1, db);
            }
            Op::Sum => (0..x.len()).for_each(|i| local.give(i, g)),
        }
    }
}

/// Where [`Op::local_grads_into`] hands each operand's gradient contribution.
pub trait GradSink<V> {
    /// Operand `operand`'s contribution, operands in order.
    fn give(&mut self, operand: usize, d: V);
}

/// Collects the contributions in operand order ([`Op::local_grads`]).
impl<V> GradSink<V> for Vec<V> {
    #[inline(always)]
    fn give(&mut self, _operand: usize, d: V) {
        self.push(d)
    }
}

/// Code instantiated once per op ([`Op::specialize`]): `run` gets the op as a closure that
/// returns it, a type of its own per variant, so that after inlining the code knows which op
/// it computes and [`Op::forward`]'s and [`Op::local_grads`]' `match` folds away (a kernel
/// that loops over many nodes of one op then branches on nothing).
pub(crate) trait PerOp {
    type Out;
    fn run(self, op: impl Fn() -> Op + Copy) -> Self::Out;
}

impl Op {
    /// `per_op.run` specialized to this op's variant (its field, if any, a runtime value).
    /// The one `match` outside the formulas that lists every op: a new op adds its arm here.
    /// Inline in its caller's loop (the first tier's loop over runs): a call per run, its
    /// registers saved and restored, cost the irregular graphs of `examples/tier1_bench`
    /// 10-20% of their time, where most runs hold one or two operations.
    #[inline(always)]
    pub(crate) fn specialize<P: PerOp>(self, per_op: P) -> P::Out {
        match self {
            Op::Input(n) => per_op.run(move || Op::Input(n)),
            Op::Param(n) => per_op.run(move || Op::Param(n)),
            Op::Const(c) => per_op.run(move || Op::Const(c)),
            Op::Add => per_op.run(|| Op::Add),
            Op::Sub => per_op.run(|| Op::Sub),
            Op::Mul => per_op.run(|| Op::Mul),
            Op::Div => per_op.run(|| Op::Div),
            Op::Neg => per_op.run(|| Op::Neg),
            Op::Powf(c) => per_op.run(move || Op::Powf(c)),
            Op::Exp => per_op.run(|| Op::Exp),
            Op::Log => per_op.run(|| Op::Log),
            Op::Tanh => per_op.run(|| Op::Tanh),
            Op::Relu => per_op.run(|| Op::Relu),
            Op::Sigmoid => per_op.run(|| Op::Sigmoid),
            Op::Softplus => per_op.run(|| Op::Softplus),
            Op::Log1p => per_op.run(|| Op::Log1p),
            Op::Abs => per_op.run(|| Op::Abs),
            Op::Sin => per_op.run(|| Op::Sin),
            Op::Cos => per_op.run(|| Op::Cos),
            Op::Sqrt => per_op.run(|| Op::Sqrt),
            Op::Max => per_op.run(|| Op::Max),
            Op::Min => per_op.run(|| Op::Min),
            Op::Sum => per_op.run(|| Op::Sum),
        }
    }
}

/// `x` followed by NaNs up to `len` values: what a caller bug reads instead of a panic.
fn padded_with_nan<A: Arith>(ar: &mut A, x: &[A::V], len: usize) -> Vec<A::V> {
    let nan = ar.constant(f64::NAN);
    let mut padded = x.to_vec();
    padded.resize(len, nan);
    padded
}

/// Where an operand may lie for its op to be finite and smooth ([`Op::domain`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Domain {
    /// Any finite value.
    Real,
    /// Strictly positive: logarithms and fractional powers (square roots too).
    Positive,
    /// Either sign, away from 0: divisors, negative powers, relu's and abs's kinks.
    NonZero,
    /// Away from operand `k`'s value: `max` and `min` have a kink where their operands tie.
    ApartFrom(usize),
}

/// The math functions ops call. Both backends call these very functions: the interpreter
/// directly, the JIT by address under private symbol names ([`MathFn::symbol`]), so the two
/// agree bit for bit and LLVM cannot recognize and rewrite them (it would turn `pow(x, 2.0)`
/// into `x * x`, which can differ in the last bit; where an op wants `x * x` it says so
/// itself, for both backends: see `power`). Those that are [`Arith`] formulas of ours
/// ([`MathFn::formula`]: `tanh`, `exp`, `log`, `log1p`, `pow`, `sin`, `cos`) the JIT's vector code computes inline, every lane at once;
/// the others are libm's. A new function is one variant and one arm in each `match` below;
/// `MathFn::iter()` lists them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::EnumIter)]
pub enum MathFn {
    Exp,
    Log,
    Tanh,
    /// `x^c` for a positive finite `x` and a finite `c` (`Op::Powf`'s core: the special
    /// values are built around it).
    Pow,
    /// The IEEE square root.
    Sqrt,
    /// `log(1 + x)`.
    Log1p,
    Sin,
    Cos,
    /// libm's `sin`, which [`MathFn::Sin`] calls where its own reduction ends.
    LibmSin,
    /// libm's `cos`, likewise.
    LibmCos,
}

impl MathFn {
    /// The private name the JIT's IR calls it by.
    pub fn symbol(self) -> &'static str {
        match self {
            MathFn::Exp => "tapejit_exp",
            MathFn::Log => "tapejit_log",
            MathFn::Tanh => "tapejit_tanh",
            MathFn::Pow => "tapejit_pow",
            MathFn::Sqrt => "tapejit_sqrt",
            MathFn::Log1p => "tapejit_log1p",
            MathFn::Sin => "tapejit_sin",
            MathFn::Cos => "tapejit_cos",
            MathFn::LibmSin => "tapejit_libm_sin",
            MathFn::LibmCos => "tapejit_libm_cos",
        }
    }

    /// The LLVM intrinsic the JIT emits for it, if it is an instruction (the square root,
    /// the one `f64::sqrt` compiles to): LLVM inlines it and has a vector form, where a call
    /// costs a few nanoseconds and lanes would call it one by one.
    pub fn intrinsic(self) -> Option<&'static str> {
        match self {
            MathFn::Sqrt => Some("llvm.sqrt"),
            MathFn::Exp | MathFn::Log | MathFn::Tanh | MathFn::Pow => None,
            MathFn::Log1p | MathFn::Sin | MathFn::Cos => None,
            MathFn::LibmSin | MathFn::LibmCos => None,
        }
    }

    /// How many `f64` arguments it takes.
    pub fn arity(self) -> usize {
        match self {
            MathFn::Exp | MathFn::Log | MathFn::Tanh | MathFn::Sqrt => 1,
            MathFn::Log1p | MathFn::Sin | MathFn::Cos => 1,
            MathFn::LibmSin | MathFn::LibmCos => 1,
            MathFn::Pow => 2,
        }
    }

    /// The address of its `extern "C"` implementation, for the JIT to bind the symbol to.
    pub fn address(self) -> usize {
        match self {
            MathFn::Exp => math::exp as *const () as usize,
            MathFn::Log => math::log as *const () as usize,
            MathFn::Tanh => math::tanh as *const () as usize,
            MathFn::Pow => math::pow as *const () as usize,
            MathFn::Sqrt => math::sqrt as *const () as usize,
            MathFn::Log1p => math::log1p as *const () as usize,
            MathFn::Sin => math::sin as *const () as usize,
            MathFn::Cos => math::cos as *const () as usize,
            MathFn::LibmSin => math::libm_sin as *const () as usize,
            MathFn::LibmCos => math::libm_cos as *const () as usize,
        }
    }

    /// The C library function it is (`math` below calls it), if it is neither an
    /// intrinsic nor a formula of ours: what exported code calls.
    pub fn libm(self) -> Option<&'static str> {
        match self {
            MathFn::LibmSin => Some("sin"),
            MathFn::LibmCos => Some("cos"),
            MathFn::Exp | MathFn::Log | MathFn::Log1p | MathFn::Tanh | MathFn::Sqrt => None,
            MathFn::Sin | MathFn::Cos | MathFn::Pow => None,
        }
    }

    /// Its value on `args` computed by `ar`, if it is an [`Arith`] formula (the very
    /// operations its compiled function performs; `None` for libm's).
    #[inline(always)]
    pub fn formula<A: Arith>(self, ar: &mut A, args: &[A::V]) -> Option<A::V> {
        match (self, args) {
            (MathFn::Tanh, &[x]) => Some(formulas::tanh(ar, x)),
            (MathFn::Exp, &[x]) => Some(formulas::exp(ar, x)),
            (MathFn::Log, &[x]) => Some(formulas::log(ar, x)),
            (MathFn::Log1p, &[x]) => Some(formulas::log1p(ar, x)),
            (MathFn::Pow, &[x, y]) => Some(formulas::pow(ar, x, y)),
            (MathFn::Sin, &[x]) => Some(trig::sin(ar, x)),
            (MathFn::Cos, &[x]) => Some(trig::cos(ar, x)),
            _ => None,
        }
    }

    /// Calls it on `args` ([`MathFn::arity`] of them; missing ones read as NaN). Out of line:
    /// inlined into the interpreter's loop, every formula made its every op 10-20% slower
    /// (MNIST's interpreter 590 -> 670 us per sample).
    #[inline(never)]
    pub fn eval(self, args: &[f64]) -> f64 {
        let arg = |i: usize| args.get(i).copied().unwrap_or(f64::NAN);
        match self {
            MathFn::Exp => math::exp(arg(0)),
            MathFn::Log => math::log(arg(0)),
            MathFn::Tanh => math::tanh(arg(0)),
            MathFn::Pow => math::pow(arg(0), arg(1)),
            MathFn::Sqrt => math::sqrt(arg(0)),
            MathFn::Log1p => math::log1p(arg(0)),
            MathFn::Sin => math::sin(arg(0)),
            MathFn::Cos => math::cos(arg(0)),
            MathFn::LibmSin => math::libm_sin(arg(0)),
            MathFn::LibmCos => math::libm_cos(arg(0)),
        }
    }
}

/// `tanh(x)` as [`Op::Tanh`] computes it on every backend (a fitted odd polynomial below
/// 0.625, `1 - 2 / (e^(2x) + 1)` above, written once over [`Arith`]; within 1.3 ULP of the
/// true value): for code that wants the very same numbers, such as hand-written yardsticks.
pub fn tanh(x: f64) -> f64 {
    formulas::tanh(&mut F64, x)
}

/// `log(x)` as [`Op::Log`] computes it on every backend (a formula of ours, written once over
/// [`Arith`], docs/numerics.md), for code that wants the very same numbers.
pub fn log(x: f64) -> f64 {
    formulas::log(&mut F64, x)
}

/// `log(1 + x)` as [`Op::Log1p`] (and `softplus`) computes it on every backend (a formula of
/// ours, written once over [`Arith`], docs/numerics.md), for code that wants the very same
/// numbers.
pub fn log1p(x: f64) -> f64 {
    formulas::log1p(&mut F64, x)
}

/// `e^x` as [`Op::Exp`] computes it on every backend (a formula of ours, written once over
/// [`Arith`]; within 0.81 ULP of the true value, docs/numerics.md), for code that wants the
/// very same numbers, such as hand-written yardsticks.
pub fn exp(x: f64) -> f64 {
    formulas::exp(&mut F64, x)
}

/// `a^c` as [`Op::Powf`]`(c)` computes it on every backend (exact where IEEE arithmetic is,
/// formulas of ours elsewhere, C's special values; docs/numerics.md), for code that wants
/// the very same numbers, such as hand-written yardsticks.
pub fn powf(a: f64, c: f64) -> f64 {
    power(&mut F64, a, c)
}

/// `a^-1.5` as [`Op::Powf`]`(-1.5)` computes it on every backend (a formula of ours,
/// correctly rounded but for some subnormal results, docs/numerics.md), for code that wants
/// the very same numbers, such as hand-written yardsticks.
pub fn pow_minus_three_halves(a: f64) -> f64 {
    formulas::pow_minus_three_halves(&mut F64, a)
}

/// `sin(x)` as [`Op::Sin`] computes it on every backend (a formula of ours below `|x| <
/// 2^20`, libm's beyond; docs/numerics.md), for code that wants the very same numbers.
pub fn sin(x: f64) -> f64 {
    trig::sin(&mut F64, x)
}

/// `cos(x)` as [`Op::Cos`] computes it on every backend, like [`sin`].
pub fn cos(x: f64) -> f64 {
    trig::cos(&mut F64, x)
}

/// The implementations behind [`MathFn`], with the C ABI the JIT calls them through.
mod math {
    pub extern "C" fn exp(x: f64) -> f64 {
        super::exp(x)
    }
    pub extern "C" fn log(x: f64) -> f64 {
        super::log(x)
    }
    pub extern "C" fn tanh(x: f64) -> f64 {
        super::tanh(x)
    }
    pub extern "C" fn pow(x: f64, c: f64) -> f64 {
        super::formulas::pow(&mut super::F64, x, c)
    }
    pub extern "C" fn sqrt(x: f64) -> f64 {
        x.sqrt()
    }
    pub extern "C" fn log1p(x: f64) -> f64 {
        super::log1p(x)
    }
    pub extern "C" fn sin(x: f64) -> f64 {
        super::sin(x)
    }
    pub extern "C" fn cos(x: f64) -> f64 {
        super::cos(x)
    }
    pub extern "C" fn libm_sin(x: f64) -> f64 {
        x.sin()
    }
    pub extern "C" fn libm_cos(x: f64) -> f64 {
        x.cos()
    }
}

/// `1 / (1 + e^-x)`: [`Op::Sigmoid`], and [`Op::Softplus`]'s derivative.
#[inline(always)]
fn sigmoid<A: Arith>(ar: &mut A, x: A::V) -> A::V {
    let minus_x = ar.neg(x);
    let e = ar.call(MathFn::Exp, &[minus_x]);
    let one = ar.constant(1.0);
    let denom = ar.add(one, e);
    ar.div(one, denom)
}

/// `|x|` from selects, never a call: `x` above 0, `-x` below, and `x + 0` at the zeros
/// (`+0` for both) and at NaN (the very NaN). Not `x > 0 ? x : 0 - x`, though it is `+0` at
/// both zeros too: LLVM rewrites that to `fabs`, which clears a NaN's sign where `0 - x`
/// keeps it, and the JIT's NaN would not be the interpreter's.
fn abs<A: Arith>(ar: &mut A, x: A::V) -> A::V {
    let zero = ar.constant(0.0);
    let minus_x = ar.neg(x);
    let x_plus_zero = ar.add(x, zero);
    let not_above = ar.select_gt(zero, x, minus_x, x_plus_zero);
    ar.select_gt(x, zero, x, not_above)
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
    fn call(&mut self, f: MathFn, args: &[f64]) -> f64 {
        // (The square root is an instruction: inline, where `eval` is a call. Adam's update
        // takes one per param.)
        match (f, args) {
            (MathFn::Sqrt, &[x]) => math::sqrt(x),
            _ => f.eval(args),
        }
    }
    fn select_gt(&mut self, a: f64, b: f64, then: f64, otherwise: f64) -> f64 {
        if a > b {
            then
        } else {
            otherwise
        }
    }
    #[inline(always)]
    fn select_gt_with(
        &mut self,
        a: f64,
        b: f64,
        then: impl FnOnce(&mut Self) -> f64,
        otherwise: impl FnOnce(&mut Self) -> f64,
    ) -> f64 {
        if a > b {
            then(self)
        } else {
            otherwise(self)
        }
    }
    fn mul_add(&mut self, a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
    fn pow2(&mut self, k: f64) -> f64 {
        formulas::pow2(k)
    }
    fn log_split(&mut self, x: f64) -> [f64; 3] {
        log_split(x)
    }
    fn lookup(&mut self, table: &'static Table, i: f64) -> f64 {
        table.value(i as usize)
    }
}
