//! Fused records: a pattern users write in scalars, run as one unit of the kernel tier.
//!
//! A softmax written in scalars, `m = max(max(x0, x1), ...)`, `e_i = exp(x_i - m)`,
//! `t = sum(e)`, `y_i = e_i / t`, is `4n` nodes that the greedy runs split into runs of a
//! few nodes each: most of its time goes to picking the next run. Found in the tape
//! ([`find`]), an instance is scheduled as one unit whose nodes take consecutive entries
//! in a fixed order (the maxes, the subtractions, the exps, the sum, the divisions), and
//! one routine computes them all: the same [`Op::forward`] and [`Op::local_grads_into`]
//! calls on the same operands as the nodes' own runs would make, the intermediate values
//! and gradients held in registers (and stored, every value and gradient being readable).
//! Outputs nothing reads are not in the tape; an instance has the divisions it has.
//!
//! **Bit for bit** the runs' numbers: a node inside an instance is read only by the
//! instance (its use count says so), so its gradient's contributions all come from the
//! instance, in an order [`find`] checks is the interpreter's (the divisions' slots ascend,
//! and so do the subtractions'); the other edges (into the `x_i`, from the outputs `y_i`)
//! are the tables' like any node's, pushed or pulled as prepare decided.
//! [`check`] proves the tables hold the layout the routines assume.

use std::array::from_fn;
use std::ops::Range;

use super::lanes;
use super::run::{op_grad, AddInto};
use super::Kernels;
use crate::op::{GradSink, Op, F64};
use crate::tape::{Slot, Tape};

/// The most operands a fused softmax has (a wider one runs node by node).
const WIDEST: usize = 8;

/// A pattern the kernel tier runs as one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pattern {
    /// A softmax of `width` operands, with the divisions `outputs` has bits for (bit `i`:
    /// `y_i`).
    Softmax { width: u8, outputs: u8 },
}

impl Pattern {
    /// Ready queues the patterns take in greedy scheduling ([`Pattern::queue`] below it).
    pub const QUEUES: usize = WIDEST + 1;

    /// This pattern's ready queue (one per width).
    pub fn queue(self) -> usize {
        match self {
            Pattern::Softmax { width, .. } => width as usize,
        }
    }

    /// Nodes in an instance.
    pub fn len(self) -> usize {
        match self {
            Pattern::Softmax { width, outputs } => {
                3 * width as usize + outputs.count_ones() as usize
            }
        }
    }

    /// Operands of an instance's nodes, in their order.
    fn args_len(self) -> usize {
        match self {
            // 2 per max, 2 per subtraction, 1 per exp, n for the sum, 2 per division.
            Pattern::Softmax { width, outputs } => {
                6 * width as usize - 2 + 2 * outputs.count_ones() as usize
            }
        }
    }
}

/// The instances found in a tape.
pub(super) struct Instances {
    /// Per instance: its pattern and its nodes (slots) in the unit's order.
    pub found: Vec<(Pattern, Vec<u32>)>,
    /// Per slot: the instance it belongs to, or `u32::MAX`.
    pub of: Vec<u32>,
}

/// The softmaxes of `tape` that can run fused (see the module's doc).
pub(super) fn find(tape: &Tape) -> Instances {
    let n = tape.len();
    let mut of = vec![u32::MAX; n];
    let mut found = Vec::new();
    let node = |s: Slot| tape.stored(s);
    // Per exp: the division that reads it first (`u32::MAX` for none).
    let mut division_of = vec![u32::MAX; n];
    for s in tape.slots() {
        let d = node(s);
        if d.op() == Op::Div && d.args().len() == 2 {
            let e = d.args()[0].index();
            if division_of[e] == u32::MAX {
                division_of[e] = s.0;
            }
        }
    }
    for t in tape.slots() {
        let sum = node(t);
        if sum.op() != Op::Sum || !(2..=WIDEST).contains(&sum.args().len()) {
            continue;
        }
        if let Some((pattern, nodes)) = softmax_at(tape, t, &division_of) {
            let i = found.len() as u32;
            if nodes.iter().all(|&s| of[s as usize] == u32::MAX) {
                for &s in &nodes {
                    of[s as usize] = i;
                }
                found.push((pattern, nodes));
            }
        }
    }
    Instances { found, of }
}

/// The softmax whose sum is `t`, its nodes in the unit's order, if every node of it is read
/// only inside it and the orders its gradients rely on hold.
fn softmax_at(tape: &Tape, t: Slot, division_of: &[u32]) -> Option<(Pattern, Vec<u32>)> {
    let node = |s: Slot| tape.stored(s);
    let consumers = tape.consumers();
    let uses = |s: Slot| consumers.uses(s) as usize;
    let is = |s: Slot, op: Op, arity: usize| node(s).op() == op && node(s).args().len() == arity;
    let exps = node(t).args();
    let n = exps.len();
    let (mut subs, mut divisions, mut outputs) = (Vec::with_capacity(n), Vec::new(), 0u8);
    for (i, &e) in exps.iter().enumerate() {
        // (An exp read by the sum only, or by the sum and its division.)
        let y = Slot(division_of[e.index()]);
        let divided = y.0 != u32::MAX && is(y, Op::Div, 2) && node(y).args() == [e, t];
        if !is(e, Op::Exp, 1) || uses(e) != 1 + divided as usize {
            return None;
        }
        if divided {
            divisions.push(y);
            outputs |= 1 << i;
        }
        let s = node(e).args()[0];
        if !is(s, Op::Sub, 2) || uses(s) != 1 {
            return None;
        }
        subs.push(s);
    }
    // (The orders the gradients of `t` and `m` are summed in: consumers' slots descending.)
    let ascending = |v: &[Slot]| v.windows(2).all(|w| w[0] < w[1]);
    if divisions.is_empty() || uses(t) != divisions.len() {
        return None;
    }
    if !ascending(&subs) || !ascending(&divisions) {
        return None;
    }
    let m = node(subs[0]).args()[1];
    let xs: Vec<Slot> = subs.iter().map(|&s| node(s).args()[0]).collect();
    if subs.iter().any(|&s| node(s).args()[1] != m) || !is(m, Op::Max, 2) || uses(m) != n {
        return None;
    }
    // The maxes, a left fold of the x's: m_k = max(m_{k-1}, x_k), m_1 = max(x_0, x_1).
    let mut maxes = vec![m];
    let mut at = m;
    for k in (1..n).rev() {
        let args = node(at).args();
        if args[1] != xs[k] {
            return None;
        }
        if k == 1 {
            if args[0] != xs[0] {
                return None;
            }
        } else {
            at = args[0];
            if !is(at, Op::Max, 2) || uses(at) != 1 {
                return None;
            }
            maxes.push(at);
        }
    }
    maxes.reverse();
    let nodes: Vec<u32> = maxes
        .iter()
        .chain(&subs)
        .chain(exps)
        .chain([&t])
        .chain(&divisions)
        .map(|s| s.0)
        .collect();
    let phase = tape.needs_grad(t);
    let pattern = Pattern::Softmax {
        width: n as u8,
        outputs,
    };
    nodes
        .iter()
        .all(|&s| tape.needs_grad(Slot(s)) == phase)
        .then_some((pattern, nodes))
}

/// Where a softmax instance's nodes and operands lie in the run order: node `j` writes
/// entry `first_op + j`; its operands start at `arg_start[j]`. The one place that says so,
/// for the routines (whose `n` is a constant) and for [`check`].
#[derive(Clone, Copy)]
struct Layout {
    /// The instance's first node, its first operand, its width and its divisions.
    j: usize,
    a: usize,
    n: usize,
    outputs: u8,
}

impl Layout {
    // Nodes: maxes m_1..m_{n-1}, subtractions, exps, the sum, the divisions there are.
    #[inline(always)]
    fn max(self, k: usize) -> usize {
        self.j + k - 1
    }
    #[inline(always)]
    fn sub(self, i: usize) -> usize {
        self.j + self.n - 1 + i
    }
    #[inline(always)]
    fn exp(self, i: usize) -> usize {
        self.j + 2 * self.n - 1 + i
    }
    #[inline(always)]
    fn sum(self) -> usize {
        self.j + 3 * self.n - 1
    }
    /// `y_i`, if the instance has it.
    #[inline(always)]
    fn division(self, i: usize) -> Option<usize> {
        let below = (self.outputs & ((1u8 << i) - 1)).count_ones() as usize;
        (self.outputs & (1 << i) != 0).then_some(self.j + 3 * self.n + below)
    }
    /// One past its last node.
    fn end(self) -> usize {
        self.j + 3 * self.n + self.outputs.count_ones() as usize
    }
    // Operands: m_k reads (a + 2(k-1), +1), subtraction i (a + 2(n-1) + 2i, +1).
    #[inline(always)]
    fn max_args(self, k: usize) -> usize {
        self.a + 2 * (k - 1)
    }
    #[inline(always)]
    fn sub_args(self, i: usize) -> usize {
        self.a + 2 * (self.n - 1) + 2 * i
    }
}

/// The layouts of the instances of width `n` and divisions `outputs` in the fused run `ops`,
/// first to last.
#[inline(always)]
fn layouts(
    k: &Kernels,
    n: usize,
    outputs: u8,
    ops: Range<usize>,
) -> impl DoubleEndedIterator<Item = Layout> + '_ {
    let len = 3 * n + outputs.count_ones() as usize;
    ops.step_by(len).map(move |j| Layout {
        j,
        a: k.arg_start[j] as usize,
        n,
        outputs,
    })
}

/// What the routines below assume of the tables, for the fused run `ops`: each instance's
/// operands laid out as [`Layout`] says, each inside operand the node the pattern says, and
/// (for a backward run) each inside gradient pushed, not pulled. Panics otherwise (a bug of
/// [`find`] or of prepare's, caught before any pass runs).
pub(super) fn check(k: &Kernels, pattern: Pattern, ops: Range<usize>, backward: bool) {
    let Pattern::Softmax { width, outputs } = pattern;
    let n = width as usize;
    assert_eq!(
        ops.len() % pattern.len(),
        0,
        "a fused run holds whole instances"
    );
    for l in layouts(k, n, outputs, ops) {
        assert_eq!(k.arg_start[l.end()] as usize, l.a + pattern.args_len());
        for i in 1..n {
            assert_eq!(
                k.arg_start[l.max(i)] as usize,
                l.max_args(i),
                "a max's operands"
            );
        }
        for i in 0..n {
            let at = k.arg_start[l.sub(i)] as usize;
            assert_eq!(at, l.sub_args(i), "a subtraction's operands");
        }
        // (The x's: a max's second operand is the subtraction's of the same x.)
        assert_eq!(
            k.args[l.max_args(1)],
            k.args[l.sub_args(0)],
            "x_0 read once"
        );
        for i in 1..n {
            assert_eq!(k.args[l.max_args(i) + 1], k.args[l.sub_args(i)], "x_i");
        }
        // (node, operand, the node it must read): the edges inside the instance.
        let mut inside = Vec::new();
        for i in 2..n {
            inside.push((l.max(i), 0, l.max(i - 1)));
        }
        for i in 0..n {
            inside.push((l.sub(i), 1, l.max(n - 1)));
            inside.push((l.exp(i), 0, l.sub(i)));
            inside.push((l.sum(), i, l.exp(i)));
            if let Some(y) = l.division(i) {
                inside.push((y, 0, l.exp(i)));
                inside.push((y, 1, l.sum()));
            }
        }
        for (node, operand, from) in inside {
            let at = k.arg_start[node] as usize + operand;
            let entry = (k.first_op + from) as u32;
            assert_eq!(k.args[at], entry, "a fused instance's inside operand");
            if backward {
                assert_eq!(
                    k.dst[at], entry,
                    "a fused instance's inside gradient, pushed"
                );
            }
        }
        if backward {
            for node in l.j..=l.sum() {
                assert_eq!(k.pull[node], k.pull[node + 1], "nothing pulled inside");
            }
        }
    }
}

/// Every instance of the fused run `ops` (consecutive operations of the run order).
pub(super) fn forward(k: &Kernels, values: &mut [f64], pattern: Pattern, ops: Range<usize>) {
    let Pattern::Softmax { width, outputs } = pattern;
    match width {
        2 => softmax_forward::<2>(k, values, outputs, ops),
        3 => softmax_forward::<3>(k, values, outputs, ops),
        4 => softmax_forward::<4>(k, values, outputs, ops),
        5 => softmax_forward::<5>(k, values, outputs, ops),
        6 => softmax_forward::<6>(k, values, outputs, ops),
        7 => softmax_forward::<7>(k, values, outputs, ops),
        8 => softmax_forward::<8>(k, values, outputs, ops),
        _ => unreachable!("find fuses 2 to {WIDEST} operands"),
    }
}

/// Backward of every instance of the fused run `ops`, the last first.
pub(super) fn backward(
    k: &Kernels,
    values: &[f64],
    grads: &mut [f64],
    pattern: Pattern,
    ops: Range<usize>,
) {
    let Pattern::Softmax { width, outputs } = pattern;
    match width {
        2 => softmax_backward::<2>(k, values, grads, outputs, ops),
        3 => softmax_backward::<3>(k, values, grads, outputs, ops),
        4 => softmax_backward::<4>(k, values, grads, outputs, ops),
        5 => softmax_backward::<5>(k, values, grads, outputs, ops),
        6 => softmax_backward::<6>(k, values, grads, outputs, ops),
        7 => softmax_backward::<7>(k, values, grads, outputs, ops),
        8 => softmax_backward::<8>(k, values, grads, outputs, ops),
        _ => unreachable!("find fuses 2 to {WIDEST} operands"),
    }
}

/// The operands `x_i` (`x_0` is the first max's first, the others the subtractions').
#[inline(always)]
fn operands<const N: usize>(k: &Kernels, values: &[f64], l: Layout) -> [f64; N] {
    std::array::from_fn(|i| {
        let a = if i == 0 { l.max_args(1) } else { l.sub_args(i) };
        values[k.args[a] as usize]
    })
}

fn softmax_forward<const N: usize>(
    k: &Kernels,
    values: &mut [f64],
    outputs: u8,
    ops: Range<usize>,
) {
    let f = k.first_op;
    for l in layouts(k, N, outputs, ops) {
        let x = operands::<N>(k, values, l);
        let mut m = x[0];
        for (i, &xi) in x.iter().enumerate().skip(1) {
            m = Op::Max.forward(&mut F64, &[m, xi]);
            values[f + l.max(i)] = m;
        }
        let s: [f64; N] = from_fn(|i| Op::Sub.forward(&mut F64, &[x[i], m]));
        // (The exps side by side: in vector lanes, where exp is a formula of ours.)
        let e = lanes::each(Op::Exp, s);
        for i in 0..N {
            values[f + l.sub(i)] = s[i];
            values[f + l.exp(i)] = e[i];
        }
        let t = Op::Sum.forward(&mut F64, &e);
        values[f + l.sum()] = t;
        for (i, &ei) in e.iter().enumerate() {
            if let Some(y) = l.division(i) {
                values[f + y] = Op::Div.forward(&mut F64, &[ei, t]);
            }
        }
        debug_assert!(l.end() <= values.len() - f);
    }
}

/// Collects what each operand's gradient receives from one node inside an instance.
struct Local<const K: usize>([f64; K]);

impl<const K: usize> GradSink<f64> for Local<K> {
    #[inline(always)]
    fn give(&mut self, operand: usize, d: f64) {
        self.0[operand] = d;
    }
}

fn softmax_backward<const N: usize>(
    k: &Kernels,
    values: &[f64],
    grads: &mut [f64],
    outputs: u8,
    ops: Range<usize>,
) {
    let f = k.first_op;
    for l in layouts(k, N, outputs, ops).rev() {
        let v = |node: usize| values[f + node];
        let x = operands::<N>(k, values, l);
        let t = v(l.sum());
        let e: [f64; N] = std::array::from_fn(|i| v(l.exp(i)));
        // The divisions, last first: each output's gradient finished, then e_i's and t's
        // contributions (each exp's first, then the sum's, in the divisions' order).
        let (mut ge, mut gt) = ([0.0; N], 0.0);
        for i in (0..N).rev() {
            let Some(y) = l.division(i) else { continue };
            let g = op_grad::<true>(k, grads, y);
            let mut d = Local([0.0; 2]);
            Op::Div.local_grads_into(&mut F64, &[e[i], t], v(y), g, &mut d);
            ge[i] += d.0[0];
            gt += d.0[1];
        }
        grads[f + l.sum()] = gt;
        let mut from_sum = Local([0.0; N]);
        Op::Sum.local_grads_into(&mut F64, &e, t, gt, &mut from_sum);
        // Each exp, then its subtraction, last first: each inside gradient finished where it
        // is used, one value at a time. (Loops over the exps and then the subtractions kept
        // the gradients in memory, stored one lane at a time and loaded four: the processor
        // stalled on every such load. The outside effects, the additions into the `x_i`'s
        // gradients and into `m`'s, come in the same order.)
        let m = v(l.max(N - 1));
        let mut gm = 0.0;
        for i in (0..N).rev() {
            let ge = ge[i] + from_sum.0[i];
            grads[f + l.exp(i)] = ge;
            let s = l.sub(i);
            let mut d = Local([0.0; 1]);
            Op::Exp.local_grads_into(&mut F64, &[v(s)], e[i], ge, &mut d);
            let gs = 0.0 + d.0[0];
            grads[f + s] = gs;
            let dst = &k.dst[l.sub_args(i)..][..1];
            let mut d = Local([0.0; 2]);
            Op::Sub.local_grads_into(&mut F64, &[x[i], m], v(s), gs, &mut d);
            AddInto { grads, dst }.give(0, d.0[0]);
            gm += d.0[1];
        }
        // The maxes, last first: m_k's first operand is m_{k-1} (x_0 for m_1).
        for i in (1..N).rev() {
            let mi = l.max(i);
            grads[f + mi] = gm;
            let first = if i == 1 { x[0] } else { v(l.max(i - 1)) };
            let mut d = Local([0.0; 2]);
            Op::Max.local_grads_into(&mut F64, &[first, x[i]], v(mi), gm, &mut d);
            let dst = &k.dst[l.max_args(i)..][..2];
            let mut add = AddInto { grads, dst };
            if i == 1 {
                add.give(0, d.0[0]);
            } else {
                gm = 0.0 + d.0[0];
            }
            add.give(1, d.0[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::{Graph, Value};
    use crate::kernels::assert_steps_like_the_interpreter;

    fn softmax<'g>(g: &'g Graph, x: &[Value<'g>]) -> Vec<Value<'g>> {
        let m = x[1..].iter().fold(x[0], |m, &xi| m.max(xi));
        let e: Vec<_> = x.iter().map(|&xi| (xi - m).exp()).collect();
        let t = g.sum(&e);
        e.iter().map(|&ei| ei / t).collect()
    }

    /// Softmaxes of every width fused, and beside them ones that must not be (an inside node
    /// read elsewhere, subtractions built out of order, too wide): values and gradients are
    /// the interpreter's, bit for bit, over a few steps, whatever reads the outputs, with
    /// repeated operands and operands without a gradient.
    #[test]
    fn fused_softmaxes_compute_the_interpreters_bits() {
        let g = Graph::new();
        let x = g.inputs(4);
        let w: Vec<_> = (0..6).map(|i| g.param(0.37 * i as f64 - 0.9)).collect();
        let mut pool: Vec<Value> = x.iter().chain(&w).copied().collect();
        for n in 2..=9 {
            let operands: Vec<_> = (0..n).map(|i| pool[(i * 7 + n) % pool.len()]).collect();
            pool.extend(softmax(&g, &operands));
        }
        // Outputs nothing reads (so not in the tape).
        let partial = softmax(&g, &[pool[20], pool[9], pool[31], w[4]]);
        pool.extend([partial[0], partial[2]]);
        pool.push(softmax(&g, &[pool[40], pool[12], pool[3]])[2]);
        // Repeated operands; only inputs (no gradient); outputs read twice.
        pool.extend(softmax(&g, &[w[1], w[1], x[0], w[1]]));
        let y = softmax(&g, &[x[0], x[1], x[2]]);
        pool.extend(y.iter().map(|&yi| yi * w[2] + yi));
        // An exp read outside: not fused.
        let (a, b) = (pool[pool.len() - 1], pool[pool.len() - 5]);
        let m = a.max(b);
        let (ea, eb) = ((a - m).exp(), (b - m).exp());
        let t = ea + eb;
        pool.extend([ea / t, eb / t, ea * w[3]]);
        // Subtractions built last first: not fused (their gradients would sum out of order).
        let (c, d) = (pool[pool.len() - 2], pool[pool.len() - 7]);
        let m = c.max(d);
        let (sd, sc) = (d - m, c - m);
        let (ec, ed) = (sc.exp(), sd.exp());
        let t = g.sum([ec, ed]);
        pool.extend([ec / t, ed / t]);
        let loss = g.sum(
            pool.iter()
                .skip(4)
                .enumerate()
                .map(|(i, &v)| v * (i % 5) as f64),
        );
        g.set_loss(loss).unwrap();

        let stats = assert_steps_like_the_interpreter(&g, &[0.7, -0.2, 1.3, 0.1]).stats();
        // (Widths 2 to 8, the partial ones, the repeated operands, the inputs only.)
        assert_eq!(stats.fused, 11, "{stats:?}");
    }
}
