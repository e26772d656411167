//! [`Lanes`]: [`Arith`] on `LANES` operations of one run at once, each lane the very IEEE
//! operations [`F64`](crate::op::F64) performs on one, so the bits are the interpreter's.
//! What it buys is the math formulas of ours ([`MathFn::formula`]: `tanh`, `exp`, `log`, `log1p`, `pow`, `sin`, `cos`), which become
//! vector instructions (target-cpu=native: four or eight `f64` per instruction) where one
//! value at a time they are a long chain of dependent fused multiply-adds; libm's functions
//! are still called one lane at a time.

use std::array::from_fn;

use crate::op::{Arith, MathFn, Op, Table, F64};

/// How many operations of a run [`Lanes`] computes at once: one AVX2 register. (Eight, two
/// registers, measured no faster on the random DAGs and the RNN of `examples/tier1_bench`:
/// a formula's dozen coefficients then spill out of AVX2's sixteen registers.)
pub(super) const LANES: usize = 4;

/// Whether computing `op` in lanes pays: whether its value calls a formula of ours (the
/// others are a few instructions, or libm's calls, which lanes make one at a time, no
/// faster: on the rollouts gathering lanes of those made runs slower). Asked of the op
/// itself, so that it holds for a new op or formula: its value computed on no numbers.
#[inline(always)]
pub(super) fn pays(op: Op) -> bool {
    let mut probe = Probe(false);
    op.forward(&mut probe, &[(), ()]);
    probe.0
}

/// `op`'s value of each of `x` (a unary op), [`LANES`] at a time where it [`pays`], the last
/// lanes padded with copies of their chunk's first value (so that lanes agree on branches
/// where the real ones do); one by one otherwise. For units that hold a few independent
/// operations of one op, such as a fused softmax's exps.
#[inline(always)]
pub(super) fn each<const N: usize>(op: Op, x: [f64; N]) -> [f64; N] {
    if !pays(op) {
        return x.map(|x| op.forward(&mut F64, &[x]));
    }
    let mut y = [0.0; N];
    for (c, out) in y.chunks_mut(LANES).enumerate() {
        let first = c * LANES;
        let v: V = from_fn(|i| x[if first + i < N { first + i } else { first }]);
        let v = op.forward(&mut Lanes, &[v]);
        out.copy_from_slice(&v[..out.len()]);
    }
    y
}

/// Computes nothing; notes whether a formula of ours is called.
struct Probe(bool);

impl Arith for Probe {
    type V = ();
    fn constant(&mut self, _: f64) {}
    fn add(&mut self, _: (), _: ()) {}
    fn sub(&mut self, _: (), _: ()) {}
    fn mul(&mut self, _: (), _: ()) {}
    fn div(&mut self, _: (), _: ()) {}
    fn neg(&mut self, _: ()) {}
    fn call(&mut self, f: MathFn, args: &[()]) {
        self.0 |= f.formula(&mut Probe(false), args).is_some();
    }
    fn select_gt(&mut self, _: (), _: (), _: (), _: ()) {}
    fn mul_add(&mut self, _: (), _: (), _: ()) {}
    fn pow2(&mut self, _: ()) {}
    fn log_split(&mut self, _: ()) -> [(); 3] {
        [(); 3]
    }
    fn lookup(&mut self, _: &'static Table, _: ()) {}
}

/// `LANES` values at once, lane by lane.
pub(super) struct Lanes;

type V = [f64; LANES];

impl Arith for Lanes {
    type V = V;
    #[inline(always)]
    fn constant(&mut self, c: f64) -> V {
        [c; LANES]
    }
    #[inline(always)]
    fn add(&mut self, a: V, b: V) -> V {
        from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    fn sub(&mut self, a: V, b: V) -> V {
        from_fn(|i| a[i] - b[i])
    }
    #[inline(always)]
    fn mul(&mut self, a: V, b: V) -> V {
        from_fn(|i| a[i] * b[i])
    }
    #[inline(always)]
    fn div(&mut self, a: V, b: V) -> V {
        from_fn(|i| a[i] / b[i])
    }
    #[inline(always)]
    fn neg(&mut self, a: V) -> V {
        from_fn(|i| -a[i])
    }
    #[inline(always)]
    fn call(&mut self, f: MathFn, args: &[V]) -> V {
        if let Some(inline) = f.formula(self, args) {
            return inline;
        }
        let arg = |j: usize, i: usize| args.get(j).map_or(f64::NAN, |a| a[i]);
        from_fn(|i| f.eval(&[arg(0, i), arg(1, i)][..f.arity()]))
    }
    #[inline(always)]
    fn select_gt(&mut self, a: V, b: V, then: V, otherwise: V) -> V {
        from_fn(|i| if a[i] > b[i] { then[i] } else { otherwise[i] })
    }
    #[inline(always)]
    fn mul_add(&mut self, a: V, b: V, c: V) -> V {
        from_fn(|i| a[i].mul_add(b[i], c[i]))
    }
    /// The case every lane takes, alone, where they agree (as the JIT's vector code does).
    #[inline(always)]
    fn branch_gt_with(
        &mut self,
        a: V,
        b: V,
        then: impl Fn(&mut Self) -> V,
        otherwise: impl Fn(&mut Self) -> V,
    ) -> V {
        let taken = (0..LANES).filter(|&i| a[i] > b[i]).count();
        // (Each case called in one place: LLVM then inlines it, where three calls of a long
        // case were left calls, three times as slow.)
        let t = (taken > 0).then(|| then(self));
        let o = (taken < LANES).then(|| otherwise(self));
        match (t, o) {
            (Some(t), Some(o)) => self.select_gt(a, b, t, o),
            (Some(t), None) => t,
            (None, o) => o.expect("a case some lane takes"),
        }
    }
    #[inline(always)]
    fn pow2(&mut self, k: V) -> V {
        from_fn(|i| crate::op::pow2(k[i]))
    }
    #[inline(always)]
    fn log_split(&mut self, x: V) -> [V; 3] {
        let split = x.map(crate::op::log_split);
        from_fn(|j| from_fn(|i| split[i][j]))
    }
    #[inline(always)]
    fn lookup(&mut self, table: &'static Table, i: V) -> V {
        i.map(|i| F64.lookup(table, i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use strum::IntoEnumIterator;

    /// Every unary and binary op on lanes gives, lane by lane, the bits `F64` gives one value
    /// at a time: on special values and on random ones, lanes that agree on a branch and
    /// lanes that do not.
    #[test]
    fn lanes_pay_for_formulas_of_ours() {
        let paying: Vec<Op> = Op::iter().filter(|&op| pays(op)).collect();
        assert_eq!(
            paying,
            [
                Op::Exp,
                Op::Log,
                Op::Tanh,
                Op::Sigmoid,
                Op::Softplus,
                Op::Log1p,
                Op::Sin,
                Op::Cos
            ]
        );
    }

    /// `each` over every length up to two chunks, padded lanes included: the bits of `F64`
    /// one value at a time, where lanes agree on a branch and where they do not.
    #[test]
    fn each_computes_f64s_bits() {
        fn check<const N: usize>(op: Op, x: [f64; N]) {
            let y = each(op, x);
            for i in 0..N {
                let one = op.forward(&mut F64, &[x[i]]);
                assert_eq!(y[i].to_bits(), one.to_bits(), "{op:?}({}) of {N}", x[i]);
            }
        }
        let points = [
            -800.0,
            -30.0,
            -0.5,
            0.0,
            0.3,
            1.0,
            40.0,
            709.9,
            f64::NAN,
            -1e-9,
        ];
        for op in [Op::Exp, Op::Tanh, Op::Log, Op::Relu] {
            for start in 0..points.len() - 8 {
                let x = &points[start..];
                check::<1>(op, from_fn(|i| x[i]));
                check::<2>(op, from_fn(|i| x[i]));
                check::<3>(op, from_fn(|i| x[i]));
                check::<4>(op, from_fn(|i| x[i]));
                check::<5>(op, from_fn(|i| x[i]));
                check::<8>(op, from_fn(|i| x[i]));
            }
        }
    }

    #[test]
    fn lanes_compute_f64s_bits() {
        let mut rng = StdRng::seed_from_u64(7);
        let special = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            0.625,
            22.0,
            -30.0,
            1e-300,
            f64::INFINITY,
        ];
        let special = special
            .into_iter()
            .chain([f64::NEG_INFINITY, f64::NAN, 3e-9]);
        let mut points: Vec<f64> = special.collect();
        points.extend((0..4000).map(|i| match i % 4 {
            0 => rng.gen_range(-1.0..1.0),
            1 => rng.gen_range(-30.0..30.0),
            2 => rng.gen_range(0.5..0.75),
            _ => rng.gen_range(-1e-6..1e-6),
        }));
        let ops = Op::iter().map(|op| match op {
            Op::Powf(_) => Op::Powf(-1.5),
            op => op,
        });
        for op in ops.filter(|op| matches!(op.arity(), Some(1) | Some(2))) {
            for (n, chunk) in points.chunks_exact(LANES).enumerate() {
                let a: V = from_fn(|i| chunk[i]);
                let b: V = from_fn(|i| chunk[(i + n) % LANES] * 0.75);
                let lanes = op.forward(&mut Lanes, &[a, b]);
                for i in 0..LANES {
                    let one = op.forward(&mut F64, &[a[i], b[i]]);
                    assert_eq!(
                        lanes[i].to_bits(),
                        one.to_bits(),
                        "{op:?}({}, {})",
                        a[i],
                        b[i]
                    );
                }
            }
        }
    }
}
