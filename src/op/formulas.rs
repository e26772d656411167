//! Math functions written as [`Arith`] formulas, so that every backend computes them with
//! the same IEEE operations: the interpreter on `f64`s, the JIT's scalar code by calling the
//! interpreter's compiled copy, its vector code inline, eight lanes at a time (a libm call
//! is one lane at a time). Branches are selects ([`Arith::select_gt_with`]): every lane
//! computes every case, the interpreter only the one it takes.

use super::Arith;

/// `tanh(x)`, fdlibm's algorithm (`s_tanh.c`; `s_expm1.c` below, some steps fused where that
/// shortens its chain of dependent operations): `x` itself where `|x| < 2^-28` (the true
/// value rounds to it; this keeps -0 and subnormals as they are) and for NaN (the very NaN);
/// `sign(x) * (1 - 2 / (t + 2))` with `t = expm1(2|x|)` for `1 <= |x| < 22`, `-sign(x) * t /
/// (t + 2)` with `t = expm1(-2|x|)` below 1; `sign(x)` from 22 (where the true value rounds
/// to +-1) to infinity. Within 2 ULP of the true value, as glibc's `tanh` is: the two agree
/// on 98.6% of random inputs and are at most 3 ULP apart.
pub fn tanh<A: Arith>(ar: &mut A, x: A::V) -> A::V {
    let zero = ar.constant(0.0);
    let minus_x = ar.neg(x);
    let a = ar.select_gt(x, zero, x, minus_x);
    let tiny = ar.constant(1.0 / (1u64 << 28) as f64);
    let large = ar.constant(22.0);
    // x itself where |x| is tiny, and where it is NaN: the very NaN, whatever the operand
    // order of the operations on it would do to its copies.
    ar.select_gt_with(
        a,
        tiny,
        |ar| {
            let z = ar.select_gt_with(
                a,
                large,
                |ar| ar.constant(1.0),
                |ar| tanh_of_magnitude(ar, a),
            );
            let minus_z = ar.neg(z);
            ar.select_gt(zero, x, minus_z, z)
        },
        |_| x,
    )
}

/// `tanh(a)` for `2^-28 <= a < 22`: `1 - 2 / (t + 2)` with `t = expm1(2a)` from 1, `-t / (t +
/// 2)` with `t = expm1(-2a)` below (one expm1 and one division, their operands picked).
fn tanh_of_magnitude<A: Arith>(ar: &mut A, a: A::V) -> A::V {
    let (one, two) = (ar.constant(1.0), ar.constant(2.0));
    let two_a = ar.mul(two, a);
    let minus_two_a = ar.neg(two_a);
    let below_one = |ar: &mut A, then, otherwise| ar.select_gt(one, a, then, otherwise);
    let y = below_one(ar, minus_two_a, two_a);
    let t = expm1(ar, y);
    let t_plus_two = ar.add(t, two);
    let minus_t = ar.neg(t);
    let numerator = below_one(ar, minus_t, two);
    let q = ar.div(numerator, t_plus_two);
    let from_one = ar.sub(one, q);
    below_one(ar, q, from_one)
}

/// `e^y - 1` for `|y| < 709` (beyond: some number), fdlibm's algorithm (`s_expm1.c`, which
/// bounds its error below 1 ULP; here `k`, `hi`, the polynomial, `t`, its denominator and
/// the corrected `e` each round once where fdlibm rounds twice): `y = k ln2 + r` with `k` the integer nearest `y / ln2` and `|r| <= ln2 / 2`
/// (`r` as a high part and a correction `c`, ln2 in two pieces so that `k * ln2_hi` is
/// exact), `expm1(r)` by a rational approximation, then rebuilt for each range of `k` as
/// fdlibm does (`k = 0, -1, 1`, `k <= -2` or `> 56`, `2..20`, `20..=56`).
fn expm1<A: Arith>(ar: &mut A, y: A::V) -> A::V {
    // fdlibm's constants, by their bits (its decimals round to these).
    const LN2_HI: u64 = 0x3fe6_2e42_fee0_0000; // low 21 bits 0
    const LN2_LO: u64 = 0x3dea_39ef_3579_3c76;
    const INV_LN2: u64 = 0x3ff7_1547_652b_82fe;
    const Q: [u64; 5] = [
        0xbfa1_1111_1111_10f4, // -3.33333333333331316428e-02
        0x3f5a_01a0_19fe_5585, // 1.58730158725481460165e-03
        0xbf14_ce19_9eaa_dbb7, // -7.93650757867487942473e-05
        0x3ed0_cfca_86e6_5239, // 4.00821782732936239552e-06
        0xbe8a_fdb7_6e09_c32d, // -2.01099218183624371326e-07
    ];
    let bits = |ar: &mut A, b: u64| ar.constant(f64::from_bits(b));
    let c = |ar: &mut A, v: f64| ar.constant(v);
    let one = c(ar, 1.0);
    // k: adding 1.5 * 2^52 rounds to an integer (ties to even), subtracting it is exact.
    let rounder = c(ar, ROUNDER);
    let inv_ln2 = bits(ar, INV_LN2);
    let shifted = ar.mul_add(y, inv_ln2, rounder);
    let k = ar.sub(shifted, rounder);
    let (ln2_hi, ln2_lo) = (bits(ar, LN2_HI), bits(ar, LN2_LO));
    let minus_k = ar.neg(k);
    let hi = ar.mul_add(minus_k, ln2_hi, y);
    let lo = ar.mul(k, ln2_lo);
    let r = ar.sub(hi, lo);
    let hi_minus_r = ar.sub(hi, r);
    let corr = ar.sub(hi_minus_r, lo);
    // expm1(r) = r + r^2/2 + r^3/6 * ... : fdlibm's rational form, in its order.
    let half = c(ar, 0.5);
    let hfx = ar.mul(half, r);
    let hxs = ar.mul(r, hfx);
    let mut poly = bits(ar, Q[4]);
    for &q in Q[..4].iter().rev() {
        let q = bits(ar, q);
        poly = ar.mul_add(hxs, poly, q);
    }
    let r1 = ar.mul_add(hxs, poly, one);
    let (three, six) = (c(ar, 3.0), c(ar, 6.0));
    let minus_hfx = ar.neg(hfx);
    let t = ar.mul_add(r1, minus_hfx, three);
    let r1_minus_t = ar.sub(r1, t);
    let minus_r = ar.neg(r);
    let denom = ar.mul_add(minus_r, t, six);
    let ratio = ar.div(r1_minus_t, denom);
    let e = ar.mul(hxs, ratio);
    // k = 0: r - (r e - hxs); otherwise with e = (r (e - c) - c) - hxs:
    let at_zero = move |ar: &mut A| {
        let r_e = ar.mul(r, e);
        let r_e_minus_hxs = ar.sub(r_e, hxs);
        ar.sub(r, r_e_minus_hxs)
    };
    let e_minus_c = ar.sub(e, corr);
    let minus_c = ar.neg(corr);
    let e = ar.mul_add(r, e_minus_c, minus_c);
    let e = ar.sub(e, hxs);
    // k = -1: 0.5 (r - e) - 0.5.
    let at_minus_one = move |ar: &mut A| {
        let r_minus_e = ar.sub(r, e);
        let h = ar.mul(half, r_minus_e);
        ar.sub(h, half)
    };
    // k = 1: -2 (e - (r + 0.5)) below r = -0.25, else 1 + 2 (r - e).
    let at_one = move |ar: &mut A| {
        let (minus_two, quarter) = (ar.constant(-2.0), ar.constant(-0.25));
        let r_half = ar.add(r, half);
        let d = ar.sub(e, r_half);
        let low = ar.mul(minus_two, d);
        let two = ar.constant(2.0);
        let r_minus_e = ar.sub(r, e);
        let twice = ar.mul(two, r_minus_e);
        let high = ar.add(one, twice);
        ar.select_gt(quarter, r, low, high)
    };
    // (1 - (e - r)) 2^k - 1 far out (k <= -2, k > 56).
    let far = move |ar: &mut A| {
        let two_k = ar.pow2(k);
        let e_minus_r = ar.sub(e, r);
        let m = ar.sub(one, e_minus_r);
        let m = ar.mul(m, two_k);
        ar.sub(m, one)
    };
    // ((1 - 2^-k) - (e - r)) 2^k for 2 <= k < 20.
    let near = move |ar: &mut A| {
        let two_k = ar.pow2(k);
        let minus_k = ar.neg(k);
        let two_minus_k = ar.pow2(minus_k);
        let e_minus_r = ar.sub(e, r);
        let m = ar.sub(one, two_minus_k);
        let m = ar.sub(m, e_minus_r);
        ar.mul(m, two_k)
    };
    // ((r - (e + 2^-k)) + 1) 2^k for 20 <= k <= 56.
    let mid = move |ar: &mut A| {
        let two_k = ar.pow2(k);
        let minus_k = ar.neg(k);
        let two_minus_k = ar.pow2(minus_k);
        let m = ar.add(e, two_minus_k);
        let m = ar.sub(r, m);
        let m = ar.add(m, one);
        ar.mul(m, two_k)
    };
    // Pick by k (NaN: none of the tests holds, so `mid`, a NaN).
    below(ar, k, -1.5, far, |ar: &mut A| {
        below(ar, k, -0.5, at_minus_one, |ar: &mut A| {
            below(ar, k, 0.5, at_zero, |ar: &mut A| {
                below(ar, k, 1.5, at_one, |ar: &mut A| {
                    below(ar, k, 20.0, near, |ar: &mut A| {
                        let bound = ar.constant(56.0);
                        ar.select_gt_with(k, bound, far, mid)
                    })
                })
            })
        })
    })
}

/// `then` where `k < bound`, else `otherwise`.
fn below<A: Arith>(
    ar: &mut A,
    k: A::V,
    bound: f64,
    then: impl FnOnce(&mut A) -> A::V,
    otherwise: impl FnOnce(&mut A) -> A::V,
) -> A::V {
    let bound = ar.constant(bound);
    ar.select_gt_with(bound, k, then, otherwise)
}

/// 1.5 * 2^52: `(x + ROUNDER) - ROUNDER` is `x` rounded to an integer (ties to even) for
/// `|x| < 2^51`; [`Arith::pow2`] reads an integer's bits off `x + ROUNDER`.
pub const ROUNDER: f64 = 6755399441055744.0;

/// The interpreter's [`Arith::pow2`]: `(bits(k + 1.5 * 2^52) + 1023) << 52` as an `f64`, in
/// wrapping integer arithmetic. The sum's low bits hold `k` (two's complement) for an
/// integral `|k| < 2^51`; the shift drops the rest.
pub fn pow2(k: f64) -> f64 {
    f64::from_bits((k + ROUNDER).to_bits().wrapping_add(1023) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::F64;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn tanh(x: f64) -> f64 {
        super::tanh(&mut F64, x)
    }

    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64).abs_diff(b.to_bits() as i64)
    }

    #[test]
    fn pow2_is_two_to_every_normal_exponent() {
        for k in -1022..=1023 {
            assert_eq!(pow2(k as f64), 2f64.powi(k), "2^{k}");
        }
    }

    #[test]
    fn tanh_is_libms_to_a_few_ulp_odd_and_monotone() {
        let mut rng = StdRng::seed_from_u64(5);
        let mut differ = 0;
        for i in 0..400_000 {
            let x: f64 = match i % 4 {
                0 => rng.gen_range(-1.0..1.0),
                1 => rng.gen_range(-25.0..25.0),
                2 => rng.gen_range(-0.3..0.3),
                _ => rng.gen_range(-60.0..5.0f64).exp2(),
            };
            let t = tanh(x);
            assert!(
                ulps(t, x.tanh()) <= 3,
                "tanh({x:e}) = {t:e}, libm {:e}",
                x.tanh()
            );
            differ += usize::from(t != x.tanh());
            assert_eq!(tanh(-x).to_bits(), (-t).to_bits(), "tanh(-{x:e})");
            assert!(t.abs() <= 1.0);
        }
        assert!(differ < 400_000 / 20, "{differ} of 400000 differ from libm");
        let mut last = -1.0;
        for i in -30_000..=30_000 {
            let t = tanh(i as f64 * 1e-3);
            assert!(t >= last, "tanh decreases at {}", i as f64 * 1e-3);
            last = t;
        }
    }

    #[test]
    fn tanh_of_special_values() {
        let same = |x: f64, want: f64| {
            assert_eq!(
                tanh(x).to_bits(),
                want.to_bits(),
                "tanh({x:e}) = {:e}",
                tanh(x)
            );
        };
        for x in [
            0.0,
            -0.0,
            1e-300,
            -5e-324,
            f64::MIN_POSITIVE,
            2f64.powi(-29),
        ] {
            same(x, x);
        }
        for x in [22.0, 30.0, 710.0, f64::MAX, f64::INFINITY] {
            same(x, 1.0);
            same(-x, -1.0);
        }
        // The very NaN, sign and payload.
        for bits in [
            f64::NAN.to_bits(),
            (-f64::NAN).to_bits(),
            0x7ff0_0000_dead_beef,
        ] {
            same(f64::from_bits(bits), f64::from_bits(bits));
        }
        same(1.0, 1f64.tanh());
    }
}
