//! A batch's copies, noticed as nodes are pushed: stretches of the arena that repeat the
//! stretch before them ([`CopyRun`]).
//!
//! A batch written as copies (micrograd's demo builds its MLP once per point) pushes the same
//! nodes again and again. Linearization stores such copies once, but only after checking that
//! each is the first moved ([`crate::tape`]'s copies); checking that on the finished arena
//! reads every copy again, which for a minibatch of 128 copies of MNIST's MLP (5 million
//! nodes) took twice as long as compiling one copy. When a node is pushed, the node a copy
//! back was pushed a copy ago and its operands are at hand: comparing the two there costs a
//! few nanoseconds on top of the push. So the graph keeps [`CopyRun`]s, and linearization
//! checks the first two copies only ([`CopyRuns::copies_from`]).
//!
//! The period comes from the params the copies share: a copy reads each of them once, so
//! the distance between two reads of one param is a candidate, tried on the node that reads
//! it, kept while the nodes that follow repeat the nodes a period back, dropped (and the next
//! param read tried) at the first that does not. Each node is compared by at most one
//! candidate, and a run that ends looks back at most one period for its start, once, and
//! only if it lasted that long: pushing stays linear in the nodes.

use super::{Node, NodeId};
use crate::op::Op;

/// The shortest period a run is looked for at (a copy of fewer nodes saves nothing).
const MIN_PERIOD: u32 = 8;
/// No read yet.
const NONE: u32 = u32::MAX;

/// Nodes `start..end`, each repeating the node `period` before it: the same op (to the bit;
/// any input for an input and any param for a param) with as many operands; and each from
/// `start + period` on continuing the two before it: every operand, and an input's or a
/// param's index, moved from the node a period back as far as that one moved from the node
/// a period before it. So node `i + b * period` of the run (for `i` in its first period,
/// `i - period` its base) is the base moved by `b + 1` times the move from the base to `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CopyRun {
    pub start: u32,
    pub period: u32,
    pub end: u32,
}

/// The copy runs of a graph's arena, found as it is built.
#[derive(Clone, Debug, Default)]
pub(crate) struct CopyRuns {
    /// Per param (by number): the last node that read it, while no run is under way.
    last_read: Vec<u32>,
    /// The run the last node continued.
    current: Option<CopyRun>,
    /// Runs that ended, of at least two periods.
    ended: Vec<CopyRun>,
}

/// The arena as pushing sees it.
#[derive(Clone, Copy)]
pub(crate) struct Arena<'a> {
    pub nodes: &'a [Node],
    pub args: &'a [NodeId],
}

impl Arena<'_> {
    fn args(&self, i: u32) -> &[NodeId] {
        self.nodes[i as usize].args(self.args)
    }

    /// Whether node `i` repeats node `i - period` ([`CopyRun`]).
    fn repeats(&self, i: u32, period: u32) -> bool {
        let (node, before) = (&self.nodes[i as usize], &self.nodes[(i - period) as usize]);
        node.args_len == before.args_len && node.op.repeated_as(before.op)
    }

    /// Whether node `i` continues the nodes one and two periods before it ([`CopyRun`]).
    fn continues(&self, i: u32, period: u32) -> bool {
        let [a, b, c] = [i - 2 * period, i - period, i];
        let moves = |x: i64, y: i64, z: i64| z - y == y - x;
        let index = |op: Op| match op {
            Op::Input(k) | Op::Param(k) => k as i64,
            _ => 0,
        };
        let op = |i: u32| self.nodes[i as usize].op;
        moves(index(op(a)), index(op(b)), index(op(c)))
            && (self.args(a).iter().zip(self.args(b)).zip(self.args(c)))
                .all(|((&x, &y), &z)| moves(x as i64, y as i64, z as i64))
    }
}

impl CopyRun {
    /// Whether node `i` (the next) continues this run.
    fn takes(&self, arena: Arena<'_>, i: u32) -> bool {
        arena.repeats(i, self.period)
            && (i < self.start + self.period || arena.continues(i, self.period))
    }

    /// This run started as early as it can: nodes found when it started (before its first
    /// param read) may repeat too. At most a period back.
    fn started_early(mut self, arena: Arena<'_>) -> CopyRun {
        let p = self.period;
        for _ in 0..p {
            let Some(j) = self.start.checked_sub(1).filter(|&j| j >= p) else {
                break;
            };
            // Node `j + period` must now continue the two before it.
            if !arena.repeats(j, p) || j + p < self.end && !arena.continues(j + p, p) {
                break;
            }
            self.start = j;
        }
        self
    }
}

impl CopyRuns {
    /// Node `i`, just pushed: continues the current run, or ends it; a read of a param may
    /// start one.
    pub fn push(&mut self, arena: Arena<'_>, i: u32) {
        if let Some(run) = &mut self.current {
            if run.takes(arena, i) {
                run.end = i + 1;
                return;
            }
            let run = *run;
            self.current = None;
            if run.end - run.start >= run.period {
                let run = run.started_early(arena);
                if run.end - run.start >= 2 * run.period {
                    self.ended.push(run);
                }
            }
        }
        for &a in arena.args(i) {
            let Op::Param(k) = arena.nodes[a as usize].op else {
                continue;
            };
            let k = k as usize;
            if k >= self.last_read.len() {
                self.last_read.resize(k + 1, NONE);
            }
            let last = std::mem::replace(&mut self.last_read[k], i);
            let period = i.wrapping_sub(last);
            let candidate = last != NONE && period >= MIN_PERIOD && self.current.is_none();
            if candidate && arena.repeats(i, period) {
                self.current = Some(CopyRun {
                    start: i,
                    period,
                    end: i + 1,
                });
            }
        }
    }

    /// How many copies of nodes `start..start + period`, from the first, the runs prove to be
    /// the first moved (each copy `b` the first moved by `b` times the move from the first
    /// to the second, [`CopyRun`]): up to `count`, 0 if no run has that period there.
    pub fn copies_from(&self, arena: Arena<'_>, start: u32, period: u32, count: u32) -> u32 {
        let current = self.current.map(|run| run.started_early(arena));
        (self.ended.iter().copied().chain(current))
            .filter(|run| run.period == period && run.start <= start + period)
            .map(|run| (run.end.saturating_sub(start) / period).min(count))
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Graph, Value};
    use crate::nn::{Activation, Layer};
    use rand::{Rng, SeedableRng};

    /// Every run of `g` checked node by node against what [`CopyRun`] claims.
    fn runs_hold(g: &Graph) -> Vec<CopyRun> {
        let d = g.data.borrow();
        let arena = d.arena();
        let runs: Vec<CopyRun> = (d.copy_runs.ended.iter().copied())
            .chain(d.copy_runs.current.map(|run| run.started_early(arena)))
            .collect();
        for run in &runs {
            let (p, op) = (run.period as usize, |i: usize| d.nodes[i].op);
            for i in run.start as usize..run.end as usize {
                let args = |i: usize| d.args_of(&d.nodes[i]).to_vec();
                assert!(op(i).repeated_as(op(i - p)), "{run:?}: node {i}");
                assert_eq!(args(i).len(), args(i - p).len(), "{run:?}: node {i}");
                if i < run.start as usize + p {
                    continue;
                }
                let index = |i: usize| match op(i) {
                    Op::Input(k) | Op::Param(k) => k as i64,
                    _ => 0,
                };
                let at = |i: usize| {
                    let mut xs: Vec<i64> = args(i).iter().map(|&a| a as i64).collect();
                    xs.push(index(i));
                    xs
                };
                let (x, y, z) = (at(i - 2 * p), at(i - p), at(i));
                for k in 0..x.len() {
                    assert_eq!(z[k] - y[k], y[k] - x[k], "{run:?}: node {i}, operand {k}");
                }
            }
        }
        runs
    }

    /// `copies` copies of a 4-6-1 MLP on inputs of their own, copy `odd` (if any) with a
    /// different constant; returns where each copy starts.
    fn batch(g: &Graph, copies: usize, odd: Option<usize>) -> Vec<u32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let hidden = Layer::new(g, 4, 6, Activation::Tanh, &mut rng);
        let readout = Layer::new(g, 6, 1, Activation::Linear, &mut rng);
        let mut starts = Vec::new();
        let outs: Vec<Value<'_>> = (0..copies)
            .map(|b| {
                starts.push(g.len() as u32);
                let x = g.inputs_without_grad(4);
                let y = readout.call(&hidden.call(&x).unwrap()).unwrap()[0];
                (y - if odd == Some(b) { 0.25 } else { 0.5 }).powf(2.0)
            })
            .collect();
        g.set_loss(g.sum(&outs)).unwrap();
        starts
    }

    #[test]
    fn a_batch_of_copies_is_one_run_that_ends_at_a_copy_that_differs() {
        let copies_from = |g: &Graph, starts: &[u32], count| {
            let d = g.data.borrow();
            let period = starts[1] - starts[0];
            (d.copy_runs).copies_from(d.arena(), starts[0], period, count)
        };
        let g = Graph::new();
        let starts = batch(&g, 9, None);
        assert_eq!(runs_hold(&g).len(), 1);
        assert_eq!(copies_from(&g, &starts, 9), 9);
        assert_eq!(copies_from(&g, &starts, 4), 4);
        let g = Graph::new();
        let starts = batch(&g, 9, Some(5));
        runs_hold(&g);
        assert_eq!(copies_from(&g, &starts, 9), 5);
    }

    /// Runs claim only what holds, whatever the graph: copies, steps that read the step
    /// before, random graphs over a few params (whose reads suggest periods that fail).
    #[test]
    fn runs_hold_what_they_claim() {
        let g = Graph::new();
        batch(&g, 7, Some(3));
        runs_hold(&g);
        // Steps: h = tanh(w h + u x + v x x) over 40 steps.
        let g = Graph::new();
        let (w, u, v) = (g.param(0.5), g.param(-0.25), g.param(0.125));
        let mut h = g.constant(0.0);
        for _ in 0..40 {
            let x = g.input();
            h = (w * h + u * x + v * x * x).tanh();
        }
        g.set_loss(h).unwrap();
        assert!(!runs_hold(&g).is_empty(), "the steps repeat");
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..20 {
            let g = Graph::new();
            let mut values: Vec<Value<'_>> = (0..3).map(|k| g.param(k as f64)).collect();
            for _ in 0..400 {
                let pick = |rng: &mut rand::rngs::StdRng| values[rng.gen_range(0..values.len())];
                let (a, b) = (pick(&mut rng), pick(&mut rng));
                let v = match rng.gen_range(0..4) {
                    0 => a + b,
                    1 => a * b,
                    2 => a.tanh(),
                    _ => a * 0.5,
                };
                values.push(v);
            }
            runs_hold(&g);
        }
    }
}
