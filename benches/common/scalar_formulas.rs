//! The scalar formulas the bench interpreters (`tape_interp.rs`, `tier1.rs`) share, each
//! what `src/op.rs` computes over `F64`, bit for bit, written for inlining.
//!
//! Included with `#[path]` by those files.

/// Max's and min's local gradients: `(0 * g, 1 * g)` if `b` is picked, else `(1 * g, 0 * g)`.
#[inline(always)]
pub fn picked(b: bool, g: f64) -> (f64, f64) {
    let (da, db) = if b { (0.0, 1.0) } else { (1.0, 0.0) };
    (da * g, db * g)
}

/// `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + tapejit::op::exp(-x))
}

/// `|x|` from selects: `x` above 0, `-x` below, `x + 0` at the zeros and NaN.
#[inline(always)]
pub fn abs(x: f64) -> f64 {
    if x > 0.0 {
        x
    } else if 0.0 > x {
        -x
    } else {
        x + 0.0
    }
}

/// `pow`'s square root: `+0` at `-0`, `+inf` at `-inf`.
#[inline(always)]
pub fn sqrt(x: f64) -> f64 {
    let root = x.sqrt() + 0.0;
    if f64::MIN > x {
        f64::INFINITY
    } else {
        root
    }
}

/// `a^c` as `op.rs`'s `power` computes it (tapejit's own function: exact where IEEE
/// arithmetic is, formulas of ours elsewhere).
#[inline(always)]
pub fn power(a: f64, c: f64) -> f64 {
    tapejit::op::powf(a, c)
}

/// `d(a^c)/da` as `op.rs` computes it from `a` and the value `out`: `c * a^(c-1)`, but
/// `0.5 / out` for the square root and `-1.5 * (out / (a + 0))` at -1.5.
#[inline(always)]
pub fn power_derivative(a: f64, c: f64, out: f64) -> f64 {
    if c == 0.5 {
        0.5 / out
    } else if c == -1.5 {
        c * (out / (a + 0.0))
    } else {
        c * power(a, c - 1.0)
    }
}
