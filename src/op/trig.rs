//! `sin` and `cos` as [`Arith`] formulas (see [`super::formulas`] for why formulas): `x`
//! reduced to `r = x - n pi/2` in two doubles, `|r| <= pi/4`, then `sin(r)` and `cos(r)` by
//! fdlibm's polynomials (Sun's `k_sin.c`, `k_cos.c`: within 2^-58 of the functions there) and
//! the quadrant `n mod 4` choosing one and its sign. Every lane computes both polynomials and
//! selects, where a branch per quadrant would split lanes.
//!
//! The reduction is Cody and Waite's, pi/2 in four pieces (three of 28-32 bits, so `n` times
//! each is exact, and the rest), for `|x| < 2^20` ([`REDUCED_BELOW`]). Beyond, where `n pi/2`
//! would need more pieces, libm's `sin` and `cos` ([`MathFn::LibmSin`], `LibmCos`), as a
//! branch: vector code calls them only for lanes that have such an `x` (and NaN, infinities).

use super::formulas::{estrin, fast_two_sum, two_sum, ROUNDER};
use super::{Arith, MathFn};

/// `|x|` below which the formulas reduce `x` themselves: `n < 2^20`, so `n` times each piece
/// of pi/2 is exact.
pub const REDUCED_BELOW: f64 = 1048576.0;

/// `sin(x)`: `x` itself where `|x| < 2^-27` (the true value rounds to it: this keeps -0 and
/// subnormals as they are), libm's beyond [`REDUCED_BELOW`] (and at NaN, the infinities),
/// else `+-sin(r)` or `+-cos(r)` by the quadrant. Within 1 ULP of the true value
/// (docs/numerics.md).
#[inline(always)]
pub fn sin<A: Arith>(ar: &mut A, x: A::V) -> A::V {
    in_range(ar, x, MathFn::LibmSin, |ar| {
        let s = reduced(ar, x, 0.0);
        let tiny = ar.constant(f64::from_bits(TWO_MINUS_27));
        let minus_tiny = ar.neg(tiny);
        let not_below = ar.select_gt(x, minus_tiny, x, s);
        ar.select_gt(tiny, x, not_below, s)
    })
}

/// `cos(x)`: `sin(x + pi/2)`, one quadrant on (libm's beyond [`REDUCED_BELOW`]). Within 1
/// ULP of the true value (docs/numerics.md).
#[inline(always)]
pub fn cos<A: Arith>(ar: &mut A, x: A::V) -> A::V {
    in_range(ar, x, MathFn::LibmCos, |ar| reduced(ar, x, 1.0))
}

/// `near(ar)` for `|x| <` [`REDUCED_BELOW`], libm's `far` elsewhere (NaN included: it
/// compares false).
#[inline(always)]
fn in_range<A: Arith>(ar: &mut A, x: A::V, far: MathFn, near: impl Fn(&mut A) -> A::V) -> A::V {
    let (limit, minus_limit) = (ar.constant(REDUCED_BELOW), ar.constant(-REDUCED_BELOW));
    let libm = |ar: &mut A| ar.call(far, &[x]);
    ar.branch_gt_with(
        limit,
        x,
        |ar| ar.branch_gt_with(x, minus_limit, &near, libm),
        libm,
    )
}

/// `sin(x + quarter pi/2)` for `|x| <` [`REDUCED_BELOW`]: `x = n pi/2 + r`, the quadrant
/// `q = (n + quarter) mod 4` picking `sin(r)`, `cos(r)`, `-sin(r)` or `-cos(r)`.
#[inline(always)]
fn reduced<A: Arith>(ar: &mut A, x: A::V, quarter: f64) -> A::V {
    let bits = |ar: &mut A, b: u64| ar.constant(f64::from_bits(b));
    let rounder = ar.constant(ROUNDER);
    let round = |ar: &mut A, y: A::V| {
        let shifted = ar.add(y, rounder);
        ar.sub(shifted, rounder)
    };
    // n: the integer nearest x 2/pi.
    let inv = bits(ar, INV_PIO2);
    let shifted = ar.mul_add(x, inv, rounder);
    let n = ar.sub(shifted, rounder);
    // r = x - n (P1 + P2 + P3 + P3T) as hi + lo: the first difference is exact (x and n P1
    // lie within a factor of 2, or n = 0), each product n Pi exact (n < 2^20), each later
    // difference kept with its rounding error (two-sum), the last piece's product rounded.
    let minus_n = ar.neg(n);
    let p1 = bits(ar, PIO2_1);
    let r1 = ar.mul_add(minus_n, p1, x);
    let p2 = bits(ar, PIO2_2);
    let a = ar.mul(minus_n, p2);
    let (s, e) = two_sum(ar, r1, a);
    let p3 = bits(ar, PIO2_3);
    let b = ar.mul(minus_n, p3);
    let (s, e2) = two_sum(ar, s, b);
    let p3t = bits(ar, PIO2_3T);
    let c = ar.mul(minus_n, p3t);
    let lo = ar.add(e, e2);
    let lo = ar.add(lo, c);
    let (r_hi, r_lo) = fast_two_sum(ar, s, lo);
    // q = m mod 4 for m = n + quarter: m - 4 floor(m/4), the floor the nearest integer to
    // m/4 - 3/8 (m/4's fraction is a multiple of 1/4: no ties); odd = q mod 2 alike.
    let quarter = ar.constant(quarter);
    let m = ar.add(n, quarter);
    let (fourth, three_eighths) = (ar.constant(0.25), ar.constant(0.375));
    let y = ar.mul(m, fourth);
    let y = ar.sub(y, three_eighths);
    let floor = round(ar, y);
    let minus_four = ar.constant(-4.0);
    let q = ar.mul_add(minus_four, floor, m);
    let (half, quarter_) = (ar.constant(0.5), ar.constant(0.25));
    let y = ar.mul(q, half);
    let y = ar.sub(y, quarter_);
    let floor = round(ar, y);
    let minus_two = ar.constant(-2.0);
    let odd = ar.mul_add(minus_two, floor, q);
    // (One kernel where a value is computed alone; vector lanes compute both and select.)
    let v = ar.select_gt_with(
        odd,
        half,
        |ar| cos_kernel(ar, r_hi, r_lo),
        |ar| sin_kernel(ar, r_hi, r_lo),
    );
    let minus_v = ar.neg(v);
    let one_and_half = ar.constant(1.5);
    ar.select_gt(q, one_and_half, minus_v, v)
}

/// `sin(hi + lo)` for `|hi| <= pi/4`, `|lo|` below half an ULP of `hi`: `hi + (hi^3 S(hi^2)
/// + lo (1 - hi^2/2))`, `S` fdlibm's, so one rounding counts, the last.
#[inline(always)]
fn sin_kernel<A: Arith>(ar: &mut A, hi: A::V, lo: A::V) -> A::V {
    const S: [u64; 5] = [
        0x3f81_1111_1110_f8a6,
        0xbf2a_01a0_19c1_61d5,
        0x3ec7_1de3_57b1_fe7d,
        0xbe5a_e5e6_8a2b_9ceb,
        0x3de5_d93a_5acf_d57c,
    ];
    let z = ar.mul(hi, hi);
    let v = ar.mul(z, hi);
    let p = estrin(ar, z, &S);
    let s1 = ar.constant(f64::from_bits(S1));
    let t = ar.mul_add(z, p, s1);
    let minus_half = ar.constant(-0.5);
    let minus_half_z = ar.mul(z, minus_half);
    let lo_term = ar.mul_add(minus_half_z, lo, lo);
    let tail = ar.mul_add(v, t, lo_term);
    ar.add(hi, tail)
}

/// `cos(hi + lo)` for `|hi| <= pi/4`, `|lo|` below half an ULP of `hi`: `w = 1 - hi^2/2`
/// with its rounding error and `hi^2`'s kept, plus `hi^4 C(hi^2) - hi lo`, `C` fdlibm's.
#[inline(always)]
fn cos_kernel<A: Arith>(ar: &mut A, hi: A::V, lo: A::V) -> A::V {
    const C: [u64; 6] = [
        0x3fa5_5555_5555_554c,
        0xbf56_c16c_16c1_5177,
        0x3efa_01a0_19cb_1590,
        0xbe92_7e4f_809c_52ad,
        0x3e21_ee9e_bdb4_b1c4,
        0xbda8_fae9_be88_38d4,
    ];
    let z = ar.mul(hi, hi);
    let minus_z = ar.neg(z);
    let z_err = ar.mul_add(hi, hi, minus_z);
    let half = ar.constant(0.5);
    let hz = ar.mul(z, half);
    let one = ar.constant(1.0);
    let w = ar.sub(one, hz);
    // (1 - w) - hz: w's rounding error, exactly (hz <= 0.31).
    let e = ar.sub(one, w);
    let e = ar.sub(e, hz);
    let c = estrin(ar, z, &C);
    let zz = ar.mul(z, z);
    let hi_lo = ar.mul(hi, lo);
    let correction = ar.mul_add(z_err, half, hi_lo);
    let minus_correction = ar.neg(correction);
    let tail = ar.mul_add(zz, c, minus_correction);
    let tail = ar.add(e, tail);
    ar.add(w, tail)
}

/// 2/pi rounded, and pi/2 as `PIO2_1 + PIO2_2 + PIO2_3 + PIO2_3T` (fdlibm's pieces: the
/// first three pi/2's leading 33-bit pieces truncated, the last the rest rounded).
const INV_PIO2: u64 = 0x3fe4_5f30_6dc9_c883;
const PIO2_1: u64 = 0x3ff9_21fb_5440_0000;
const PIO2_2: u64 = 0x3dd0_b461_1a60_0000;
const PIO2_3: u64 = 0x3ba3_198a_2e00_0000;
const PIO2_3T: u64 = 0x397b_839a_2520_49c1;

/// fdlibm's `S1`, about -1/6.
const S1: u64 = 0xbfc5_5555_5555_5549;

/// 2^-27.
const TWO_MINUS_27: u64 = 0x3e40_0000_0000_0000;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::F64;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn sin_(x: f64) -> f64 {
        sin(&mut F64, x)
    }

    fn cos_(x: f64) -> f64 {
        cos(&mut F64, x)
    }

    fn ulps(a: f64, b: f64) -> u64 {
        (a.to_bits() as i64).abs_diff(b.to_bits() as i64)
    }

    #[test]
    fn the_pieces_of_pi_over_two_times_n_are_exact() {
        // Each piece's significant bits, times n < 2^20, fit in a double's 53.
        for piece in [PIO2_1, PIO2_2, PIO2_3] {
            let trailing_zeros = piece.trailing_zeros();
            assert!(52 - trailing_zeros + 1 + 20 <= 53, "{piece:x}");
        }
        let sum = f64::from_bits(PIO2_1) + f64::from_bits(PIO2_2);
        assert_eq!(sum, std::f64::consts::FRAC_PI_2);
    }

    #[test]
    fn sin_and_cos_are_libms_to_1_ulp() {
        let mut rng = StdRng::seed_from_u64(7);
        for i in 0..400_000 {
            let x: f64 = match i % 5 {
                0 => rng.gen_range(-4.0..4.0),
                1 => rng.gen_range(-1e6..1e6),
                2 => rng.gen_range(-0.8..0.8),
                3 => rng.gen_range(-60.0..20.0f64).exp2() * if i % 2 == 0 { 1.0 } else { -1.0 },
                // Near multiples of pi/2, where the reduction cancels.
                _ => {
                    let n = rng.gen_range(-600_000i32..600_000) as f64;
                    n * std::f64::consts::FRAC_PI_2 * (1.0 + rng.gen_range(-1e-15..1e-15))
                }
            };
            let (s, c) = (sin_(x), cos_(x));
            assert!(
                ulps(s, x.sin()) <= 1,
                "sin({x:e}) = {s:e}, libm {:e}",
                x.sin()
            );
            assert!(
                ulps(c, x.cos()) <= 1,
                "cos({x:e}) = {c:e}, libm {:e}",
                x.cos()
            );
            assert_eq!(sin_(-x).to_bits(), (-s).to_bits(), "sin(-{x:e})");
            assert_eq!(cos_(-x).to_bits(), c.to_bits(), "cos(-{x:e})");
        }
    }

    #[test]
    fn sin_and_cos_of_special_values() {
        let same = |a: f64, b: f64| a.to_bits() == b.to_bits();
        assert!(same(sin_(0.0), 0.0) && same(sin_(-0.0), -0.0));
        assert!(same(sin_(5e-324), 5e-324) && same(sin_(-5e-324), -5e-324));
        assert!(same(cos_(0.0), 1.0) && same(cos_(-0.0), 1.0));
        assert!(same(cos_(5e-324), 1.0));
        for x in [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -f64::NAN] {
            assert!(same(sin_(x), x.sin()) && same(cos_(x), x.cos()), "{x}");
        }
        // Beyond the reduction's range: libm's very bits.
        for x in [REDUCED_BELOW, -REDUCED_BELOW, 1e22, 1e300, f64::MAX] {
            assert!(same(sin_(x), x.sin()) && same(cos_(x), x.cos()), "{x:e}");
        }
    }
}
