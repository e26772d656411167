//! `a^c` for a constant `c` ([`Op::Powf`](super::Op::Powf)): the exponents IEEE arithmetic
//! computes exactly, ours for `-3/2` (gravity's), and every other exponent as
//! [`MathFn::Pow`] (`e^(c log a)`, a formula of ours) with C's special values around it
//! (C99 Annex F). What depends on `c` alone (its sign, whether it is an odd integer) is
//! decided here, once, where the op is built: the code holds only the selects it needs.

use super::formulas;
use super::{abs, Arith, MathFn};

/// `a^c` for a constant `c`: the correctly rounded power, as IEEE arithmetic computes it
/// exactly where it can (`c` = 0, 1, 2, -1, 1/2: a constant, `a`, `a * a`, `1 / a`, the
/// square root); at `c = -3/2` a formula of ours within 1 ULP
/// ([`formulas::pow_minus_three_halves`]); any other `c` by [`finite`] or [`non_finite`],
/// within 1 ULP (docs/numerics.md). Every one inline in vector lanes. On the special values
/// the results are C's `pow`'s (C99 Annex F): `a^0 = 1` for every `a`, `(-0)^(1/2) = +0`,
/// `(-inf)^(1/2) = +inf`, a negative `a` to a non-integral `c` NaN. (Where a NaN is the
/// result of a NaN `a`, it is `a` itself.) Both backends compute it through this function.
pub(super) fn power<A: Arith>(ar: &mut A, a: A::V, c: f64) -> A::V {
    if c == 0.0 {
        ar.constant(1.0)
    } else if c == 1.0 {
        a
    } else if c == 2.0 {
        ar.mul(a, a)
    } else if c == -1.0 {
        let one = ar.constant(1.0);
        ar.div(one, a)
    } else if c == 0.5 {
        sqrt(ar, a)
    } else if c == -1.5 {
        formulas::pow_minus_three_halves(ar, a)
    } else if c.is_finite() {
        finite(ar, a, c)
    } else {
        non_finite(ar, a, c)
    }
}

/// `a^c` for a finite `c`: `|a|^c` by [`MathFn::Pow`] for a positive finite `|a|`; at `|a|`
/// 0 or infinite the limit (`+inf` where the power grows, `+0` where it vanishes); then the
/// sign of a negative `a` (an odd `c` keeps it, an even one drops it, any other gives NaN but
/// at `-inf`).
fn finite<A: Arith>(ar: &mut A, a: A::V, c: f64) -> A::V {
    let (integral, odd) = integral_and_odd(c);
    let (zero, inf) = (ar.constant(0.0), ar.constant(f64::INFINITY));
    let magnitude = abs(ar, a);
    let c_ = ar.constant(c);
    let power = ar.call(MathFn::Pow, &[magnitude, c_]);
    let (at_zero, at_inf) = if c > 0.0 { (zero, inf) } else { (inf, zero) };
    let largest = ar.constant(f64::MAX);
    let p = ar.select_gt(magnitude, largest, at_inf, power);
    // At +-0 an odd power keeps the zero's sign: `a` itself, or `1 / a` (+-inf).
    let at_zero = match (odd, c > 0.0) {
        (true, true) => a,
        (true, false) => {
            let one = ar.constant(1.0);
            ar.div(one, a)
        }
        (false, _) => at_zero,
    };
    let p = ar.select_gt(magnitude, zero, p, at_zero);
    let signed = if odd {
        let minus_p = ar.neg(p);
        ar.select_gt(zero, a, minus_p, p)
    } else if integral {
        p
    } else {
        // (-inf keeps the limit: C's pow(-inf, c) for a non-integral c.)
        let (lowest, nan) = (ar.constant(f64::MIN), ar.constant(f64::NAN));
        let below = ar.select_gt(lowest, a, p, nan);
        ar.select_gt(zero, a, below, p)
    };
    // A NaN `a` (its magnitude compares false) is its own power.
    let minus_one = ar.constant(-1.0);
    ar.select_gt(magnitude, minus_one, signed, a)
}

/// Whether a finite `c` is an integer, and an odd one: without `%` (a call of `fmod`, which
/// would cost the interpreter more than the power's formula).
fn integral_and_odd(c: f64) -> (bool, bool) {
    // (From 2^53 on every double is an even integer.)
    if c.abs() >= 9007199254740992.0 {
        return (true, false);
    }
    let i = c as i64;
    let integral = i as f64 == c;
    (integral, integral && i & 1 == 1)
}

/// `a^c` for an infinite or NaN `c`, as C gives it: for `+-inf`, `+inf` or `+0` by whether
/// `|a|` lies above or below 1, and 1 at `|a| = 1`; for NaN, 1 at `a = 1` and `c` elsewhere.
/// A NaN `a` is its own power.
fn non_finite<A: Arith>(ar: &mut A, a: A::V, c: f64) -> A::V {
    let (zero, one, c_) = (ar.constant(0.0), ar.constant(1.0), ar.constant(c));
    if c.is_nan() {
        // 1 at a = 1, which is neither above nor below 1 and compares above 0.
        let at_one = ar.select_gt(a, zero, one, c_);
        let not_above = ar.select_gt(one, a, c_, at_one);
        return ar.select_gt(a, one, c_, not_above);
    }
    let inf = ar.constant(f64::INFINITY);
    let (above, below) = if c > 0.0 { (inf, zero) } else { (zero, inf) };
    let magnitude = abs(ar, a);
    // Neither above nor below 1: 1 itself, or NaN (`a`).
    let at_one = ar.select_gt(magnitude, zero, one, a);
    let not_above = ar.select_gt(one, magnitude, below, at_one);
    ar.select_gt(magnitude, one, above, not_above)
}

/// `a^(1/2)` as `pow` gives it: the IEEE square root but at `-0` and `-inf`. [`Op::Sqrt`]
/// and [`Op::Powf`]`(0.5)` both compute it.
///
/// [`Op::Sqrt`]: super::Op::Sqrt
/// [`Op::Powf`]: super::Op::Powf
pub(super) fn sqrt<A: Arith>(ar: &mut A, a: A::V) -> A::V {
    // sqrt(-0) is -0 where pow gives +0: adding +0 turns -0 into +0 and leaves every other
    // result (a NaN's payload too) as it is. sqrt(-inf) is NaN where pow gives +inf: only
    // -inf lies below -f64::MAX.
    let root = ar.call(MathFn::Sqrt, &[a]);
    let zero = ar.constant(0.0);
    let root = ar.add(root, zero);
    let lowest = ar.constant(f64::MIN);
    let inf = ar.constant(f64::INFINITY);
    ar.select_gt(lowest, a, inf, root)
}

/// The derivative of [`sqrt`] from its value `out`: `0.5 / out`, as PyTorch writes it (see
/// [`Op::local_grads`](super::Op::local_grads) of `Powf`).
pub(super) fn sqrt_derivative<A: Arith>(ar: &mut A, out: A::V) -> A::V {
    let half = ar.constant(0.5);
    ar.div(half, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::F64;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn power_(a: f64, c: f64) -> f64 {
        power(&mut F64, a, c)
    }

    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64).abs_diff(b.to_bits() as i64)
    }

    /// Exponents of every kind `finite` tells apart: odd, even, non-integral, either sign,
    /// small and large.
    const EXPONENTS: [f64; 14] = [
        3.0,
        -3.0,
        4.0,
        -2.0,
        2.5,
        -0.75,
        1.0 / 3.0,
        0.25,
        7.0,
        1.1,
        -5.0,
        1e-3,
        151.0,
        -40.5,
    ];

    #[test]
    fn powers_are_libms_to_1_ulp() {
        let mut rng = StdRng::seed_from_u64(11);
        for i in 0..200_000 {
            let c = EXPONENTS[i % EXPONENTS.len()];
            // Within the range where the power is a normal number or a subnormal, of either
            // sign where c is an integer.
            let bound = (1000.0 / c.abs()).min(1000.0);
            let mut a: f64 = rng.gen_range(-bound..bound).exp2();
            if i % 3 == 0 {
                a = rng.gen_range(0.9..1.1);
            }
            if c.fract() == 0.0 && rng.gen() {
                a = -a;
            }
            let (p, want) = (power_(a, c), a.powf(c));
            assert!(ulps(p, want) <= 1, "{a:e} ** {c} = {p:e}, libm {want:e}");
        }
    }

    #[test]
    fn powers_are_exact_where_the_power_is_a_double() {
        for a in 1..200 {
            let a = a as f64;
            assert_eq!(power_(a, 3.0), a * a * a, "{a} ** 3");
            assert_eq!(power_(a * a, 1.5), a * a * a, "{a}^2 ** 1.5");
        }
        for k in -300..300 {
            assert_eq!(power_(2.0, k as f64 + 0.0), 2f64.powi(k), "2 ** {k}");
        }
    }

    #[test]
    fn special_values_are_cs() {
        let specials = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            -0.5,
            2.0,
            -2.0,
            5e-324,
            -5e-324,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        let exponents = EXPONENTS.iter().copied().chain([
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            1e300,
            -1e300,
            2f64.powi(53) + 2.0,
            2f64.powi(52) + 1.0,
            -(2f64.powi(52) + 1.0),
            0.0,
            -0.0,
        ]);
        for c in exponents {
            for a in specials {
                let (p, want) = (power_(a, c), a.powf(c));
                // Where the power is a finite non-zero number of a finite non-zero base, within
                // 1 ULP; elsewhere C's very value (any NaN for a NaN).
                let close = want.is_finite() && want != 0.0 && ulps(p, want) <= 1;
                let same = p.to_bits() == want.to_bits() || (p.is_nan() && want.is_nan());
                assert!(same || close, "{a:e} ** {c:e} = {p:e}, libm {want:e}");
            }
        }
        // A NaN base is its own power.
        let nan = f64::from_bits(0x7ff8_0000_dead_beef);
        assert_eq!(power_(nan, 3.0).to_bits(), nan.to_bits());
    }
}
