//! The passes: each run one loop of its op's formula ([`crate::op::Op::forward`] and
//! [`crate::op::Op::local_grads_into`] over [`F64`], which adds each operand's contribution
//! straight into its destination). The run's op is fixed through the loop, so
//! the branch inside the formula that picks it goes the same way every time; operands are
//! gathered into a small array by the arity the op has (in backward, only where the op's
//! derivative reads them: not a sum's).

use std::array::from_fn;
use std::ops::Range;

use super::lanes::{self, Lanes, LANES};
use super::{fused, Body, Kernels};
use crate::op::{GradSink, Op, PerOp, F64};

/// Operands gathered on the stack up to this many (a longer `sum` uses a scratch vector).
const INLINE: usize = 8;

/// Every operation's value into `values` (the buffer order), run by run.
pub(super) fn forward(k: &Kernels, values: &mut [f64]) {
    let mut wide = Vec::new();
    for run in &k.runs {
        let ops = run.start as usize..run.end as usize;
        match run.body {
            Body::Op(op) => op.specialize(Forward {
                k,
                values: &mut *values,
                ops,
                wide: &mut wide,
            }),
            Body::Fused(pattern) => fused::forward(k, values, pattern, ops),
        }
    }
}

/// One run of forward, specialized to its op ([`Op::specialize`]).
struct Forward<'a> {
    k: &'a Kernels,
    values: &'a mut [f64],
    ops: Range<usize>,
    wide: &'a mut Vec<f64>,
}

impl PerOp for Forward<'_> {
    type Out = ();
    #[inline(always)]
    fn run(self, op: impl Fn() -> Op + Copy) {
        let Forward {
            k,
            values,
            ops,
            wide,
        } = self;
        // (A run of fixed arity has its operands side by side: `arity` per operation.)
        let outputs = k.first_op + ops.start..k.first_op + ops.end;
        match op().arity() {
            Some(1) => in_lanes::<1>(op, values, outputs, &k.args[fixed(k, &ops, 1)]),
            Some(2) => in_lanes::<2>(op, values, outputs, &k.args[fixed(k, &ops, 2)]),
            _ => {
                let mut inline = [0.0; INLINE];
                for j in ops {
                    let x = gather(k, values, j, &mut inline, wide);
                    values[k.first_op + j] = op().forward(&mut F64, x);
                }
            }
        }
    }
}

/// A fixed-arity run's values: where its op computes a formula of ours ([`lanes::pays`]),
/// [`LANES`] operations at a time ([`Lanes`]) where none of them reads another's value (a
/// run may hold a chain: an operation ready only once an earlier one of the run is done);
/// the others one by one. `args` holds `ARITY` operand entries per operation, side by side.
#[inline(always)]
fn in_lanes<const ARITY: usize>(
    op: impl Fn() -> Op + Copy,
    values: &mut [f64],
    outputs: Range<usize>,
    args: &[u32],
) {
    let one_by_one = |values: &mut [f64], o: usize, args: &[u32]| {
        for (o, a) in (o..).zip(args.chunks_exact(ARITY)) {
            let x: [f64; ARITY] = from_fn(|p| values[a[p] as usize]);
            values[o] = op().forward(&mut F64, &x);
        }
    };
    if !lanes::pays(op()) {
        return one_by_one(values, outputs.start, args);
    }
    let chunks = args.chunks_exact(ARITY * LANES);
    let rest = chunks.remainder();
    let mut o = outputs.start;
    for chunk in chunks {
        // (Entries below `o` are done: leaves, earlier runs, earlier lanes of this one.)
        if chunk.iter().all(|&a| (a as usize) < o) {
            let x: [[f64; LANES]; ARITY] =
                from_fn(|p| from_fn(|i| values[chunk[i * ARITY + p] as usize]));
            let y = op().forward(&mut Lanes, &x);
            values[o..o + LANES].copy_from_slice(&y);
        } else {
            one_by_one(values, o, chunk);
        }
        o += LANES;
    }
    one_by_one(values, o, rest);
}

/// Gradients into `grads` (the buffer order, then the contributions area and the sink): every
/// one but the params' from 0, the loss's 1, then each backward run from the last.
pub(super) fn backward(k: &Kernels, values: &[f64], grads: &mut [f64]) {
    let Some(loss) = k.loss else {
        return;
    };
    grads[k.num_params..].fill(0.0);
    grads[loss] = 1.0;
    let mut wide = Vec::new();
    for run in k.runs[..k.backward_runs].iter().rev() {
        let ops = run.start as usize..run.end as usize;
        // (Most runs pull nothing: their loops skip the pull ranges.)
        let pulls_any = k.pull[ops.start] != k.pull[ops.end];
        match run.body {
            Body::Op(op) if pulls_any => op.specialize(Backward::<true> {
                k,
                values,
                grads: &mut *grads,
                ops,
                wide: &mut wide,
            }),
            Body::Op(op) => op.specialize(Backward::<false> {
                k,
                values,
                grads: &mut *grads,
                ops,
                wide: &mut wide,
            }),
            Body::Fused(pattern) => fused::backward(k, values, grads, pattern, ops),
        }
    }
    for &(x, lo, hi) in &k.leaf_pulls {
        finished_grad(grads, x as usize, lo as usize..hi as usize);
    }
}

/// One run of backward, last operation first, specialized to its op and to whether any of
/// its gradients has pulled contributions (`PULLS`).
struct Backward<'a, const PULLS: bool> {
    k: &'a Kernels,
    values: &'a [f64],
    grads: &'a mut [f64],
    ops: Range<usize>,
    wide: &'a mut Vec<f64>,
}

impl<const PULLS: bool> PerOp for Backward<'_, PULLS> {
    type Out = ();
    #[inline(always)]
    fn run(self, op: impl Fn() -> Op + Copy) {
        let Backward {
            k,
            values,
            grads,
            ops,
            wide,
        } = self;
        // (Operands by the op's arity, as in forward: a sum's gathered. Only where the
        // derivative reads them: a sum's, a difference's is `g` or `-g` alone.)
        let reads = !op().derivative_ignores_operands();
        let at = |j: usize| j - ops.start;
        let grad = |grads: &mut [f64], j: usize| op_grad::<PULLS>(k, grads, j);
        match op().arity() {
            Some(1) => {
                let args = &k.args[fixed(k, &ops, 1)];
                let dst = &k.dst[fixed(k, &ops, 1)];
                for j in ops.clone().rev() {
                    let g = grad(grads, j);
                    let x = match reads {
                        true => [values[args[at(j)] as usize]],
                        false => [0.0],
                    };
                    let out = values[k.first_op + j];
                    let dst = &dst[at(j)..][..1];
                    op().local_grads_into(&mut F64, &x, out, g, &mut AddInto { grads, dst });
                }
            }
            Some(2) => {
                let args = &k.args[fixed(k, &ops, 2)];
                let dst = &k.dst[fixed(k, &ops, 2)];
                for j in ops.clone().rev() {
                    let g = grad(grads, j);
                    let (a, d) = (&args[2 * at(j)..][..2], &dst[2 * at(j)..][..2]);
                    let x = match reads {
                        true => [values[a[0] as usize], values[a[1] as usize]],
                        false => [0.0; 2],
                    };
                    let out = values[k.first_op + j];
                    op().local_grads_into(&mut F64, &x, out, g, &mut AddInto { grads, dst: d });
                }
            }
            _ => wide_backward::<PULLS>(op, k, values, grads, ops, wide),
        }
    }
}

/// [`Backward`]'s run of an op of no fixed arity (a sum's), out of line: its loop over each
/// operation's operands keeps its numbers in registers, where inside the loop over runs
/// (which holds every op's loops) it reloaded them from the stack at every operand (the
/// RNN's first tier, `examples/tier1_bench`: 148 against 164 us per iteration).
#[inline(never)]
fn wide_backward<const PULLS: bool>(
    op: impl Fn() -> Op + Copy,
    k: &Kernels,
    values: &[f64],
    grads: &mut [f64],
    ops: Range<usize>,
    wide: &mut Vec<f64>,
) {
    let reads = !op().derivative_ignores_operands();
    let mut inline = [0.0; INLINE];
    for j in ops.rev() {
        let g = op_grad::<PULLS>(k, grads, j);
        let x = match reads {
            true => gather(k, values, j, &mut inline, wide),
            false => unread(k, j, &inline, wide),
        };
        let dst = &k.dst[k.arg_start[j] as usize..k.arg_start[j + 1] as usize];
        let out = values[k.first_op + j];
        op().local_grads_into(&mut F64, x, out, g, &mut AddInto { grads, dst });
    }
}

/// Operation `j`'s gradient, finished: with its pulled contributions where it has any
/// (`PULLS`, as its run does).
#[inline(always)]
pub(super) fn op_grad<const PULLS: bool>(k: &Kernels, grads: &mut [f64], j: usize) -> f64 {
    match PULLS {
        true => {
            let pulled = k.pull[j] as usize..k.pull[j + 1] as usize;
            finished_grad(grads, k.first_op + j, pulled)
        }
        false => grads[k.first_op + j],
    }
}

/// Adds operand `i`'s contribution into `grads[dst[i]]` (its gradient, or its pulled entry).
pub(super) struct AddInto<'a> {
    pub grads: &'a mut [f64],
    pub dst: &'a [u32],
}

impl GradSink<f64> for AddInto<'_> {
    #[inline(always)]
    fn give(&mut self, operand: usize, d: f64) {
        self.grads[self.dst[operand] as usize] += d;
    }
}

/// Where the operands of the fixed-arity run `ops` lie in `args` (and their gradient
/// entries in `dst`): `arity` per operation, side by side.
#[inline(always)]
fn fixed(k: &Kernels, ops: &Range<usize>, arity: usize) -> Range<usize> {
    let start = k.arg_start[ops.start] as usize;
    start..start + arity * ops.len()
}

/// Slot `o`'s gradient: what was pushed into it, then its pulled contributions in order.
#[inline(always)]
pub(super) fn finished_grad(grads: &mut [f64], o: usize, pulled: std::ops::Range<usize>) -> f64 {
    let mut g = grads[o];
    for c in pulled {
        g += grads[c];
    }
    grads[o] = g;
    g
}

/// Operation `j`'s operand values: in `inline` up to its length, else in `wide`.
#[inline(always)]
fn gather<'w>(
    k: &Kernels,
    values: &[f64],
    j: usize,
    inline: &'w mut [f64; INLINE],
    wide: &'w mut Vec<f64>,
) -> &'w [f64] {
    let args = &k.args[k.arg_start[j] as usize..k.arg_start[j + 1] as usize];
    if args.len() <= INLINE {
        for (xi, &a) in inline.iter_mut().zip(args) {
            *xi = values[a as usize];
        }
        &inline[..args.len()]
    } else {
        wide.clear();
        wide.extend(args.iter().map(|&a| values[a as usize]));
        wide
    }
}

/// Operation `j`'s operands where its derivative does not read them: as many numbers,
/// whatever they hold (`inline`'s zeros, or what `wide` last held, grown with zeros).
#[inline(always)]
fn unread<'w>(
    k: &Kernels,
    j: usize,
    inline: &'w [f64; INLINE],
    wide: &'w mut Vec<f64>,
) -> &'w [f64] {
    let n = (k.arg_start[j + 1] - k.arg_start[j]) as usize;
    if n <= INLINE {
        return &inline[..n];
    }
    if wide.len() < n {
        wide.resize(n, 0.0);
    }
    &wide[..n]
}

#[cfg(test)]
mod tests {
    use crate::graph::Graph;
    use crate::kernels::assert_steps_like_the_interpreter;

    /// A graph whose gradients need pulling (a node read by consumers that backward meets
    /// out of slot order), wide sums, repeated operands and every kind of op: the kernel
    /// tier's values and gradients are the interpreter's, bit for bit, over a few steps.
    #[test]
    fn runs_compute_the_interpreters_bits() {
        let g = Graph::new();
        let x = g.inputs(3);
        let w: Vec<_> = (0..4).map(|i| g.param(0.3 * i as f64 - 0.4)).collect();
        let a = (x[0] * w[0]).tanh();
        let b = (x[1] + w[1]).exp() * a;
        let c = g.sum((0..12).map(|i| if i % 2 == 0 { a } else { x[2] * w[i % 4] }));
        let d = (b.max(c) - a.min(w[2])).softplus() + (a * a).powf(1.5) / c.abs();
        let e = d.sigmoid() + b.abs().log1p().sqrt() + c.relu() - w[3].powf(-2.0);
        g.set_loss(e * e + d).unwrap();
        let kernels = assert_steps_like_the_interpreter(&g, &[0.7, -0.2, 1.3]);
        assert!(kernels.stats().pulled_edges > 0, "{:?}", kernels.stats());
    }

    /// Long runs of an op computed in lanes (`tanh`), on both sides of its branches, and
    /// chains within a run (an operation reading another of its run, computed after it).
    #[test]
    fn lanes_compute_the_interpreters_bits() {
        let g = Graph::new();
        let x = g.inputs(2);
        let w: Vec<_> = (0..3).map(|i| g.param(0.5 * i as f64 - 0.3)).collect();
        let mut pool = vec![x[0] * w[0], x[1] * w[1], x[0] + w[2]];
        // (One run, operands ready: lanes; some below the series' bound, some above.)
        pool.extend((0..26).map(|i| (x[i % 2] * w[i % 3] * (0.25 * i as f64 - 3.0)).tanh()));
        for i in 0..60 {
            let t = pool[pool.len() - 1 - i % 3];
            pool.push((t * (0.4 + 0.3 * i as f64)).tanh());
            if i % 7 == 0 {
                let t = pool[pool.len() - 1];
                pool.push(t.tanh().tanh());
            }
        }
        g.set_loss(g.sum(&pool)).unwrap();
        assert_steps_like_the_interpreter(&g, &[0.9, -1.7]);
    }
}
