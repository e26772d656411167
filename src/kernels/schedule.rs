//! The run order: the tape's operations in greedy runs of one op, within windows of the
//! tape, a fused pattern instance ([`super::fused`]) scheduled as one unit.

use super::fused::{Instances, Pattern};
use super::Body;
use crate::op::{Op, OpKind};
use crate::tape::{Slot, Tape};

/// The operations in the order the passes run them.
pub(super) struct Order {
    /// Slots, backward's operations (those that need a gradient) first.
    pub nodes: Vec<u32>,
    /// What each unit computes and its operations, in order: they tile `nodes`.
    pub bodies: Vec<(Body, u32)>,
    /// Operations backward runs: the first ones.
    pub backward_ops: usize,
}

/// Backward's operations first, then the others; each phase in windows of [`WINDOW`] units,
/// each window in greedy runs, an instance's nodes in its pattern's order.
pub(super) fn run_order(tape: &Tape, fusions: &Instances) -> Order {
    let units = Units {
        tape,
        fusions,
        op_queues: {
            use strum::IntoEnumIterator;
            Op::iter().count()
        },
    };
    let n = tape.len();
    let mut order: Vec<u32> = Vec::with_capacity(n);
    let mut scratch = Scratch {
        window_of: vec![u32::MAX; n],
        local: vec![0; n],
        ..Scratch::default()
    };
    let mut backward_units = 0;
    let mut windows = 0;
    for phase_needs in [true, false] {
        // The phase's units in the order of their last nodes (an operand's last node comes
        // before its reader's), cut into windows, each scheduled after the one before.
        let mut phase: Vec<u32> = (0..n)
            .filter(|&s| units.is_unit(s) && tape.needs_grad(Slot(s as u32)) == phase_needs)
            .map(|s| s as u32)
            .collect();
        phase.sort_by_key(|&u| units.last_node(u as usize));
        for window in phase.chunks(WINDOW) {
            greedy_runs(&units, window, windows, &mut scratch, &mut order);
            windows += 1;
        }
        if phase_needs {
            backward_units = order.len();
        }
    }
    let mut nodes: Vec<u32> = Vec::with_capacity(n);
    let mut bodies: Vec<(Body, u32)> = Vec::with_capacity(order.len());
    let mut backward_ops = 0;
    for (i, &u) in order.iter().enumerate() {
        if i == backward_units {
            backward_ops = nodes.len();
        }
        match units.instance(u as usize) {
            Some((pattern, instance)) => {
                bodies.push((Body::Fused(pattern), instance.len() as u32));
                nodes.extend(instance);
            }
            None => {
                bodies.push((Body::Op(tape.stored(Slot(u)).op()), 1));
                nodes.push(u);
            }
        }
    }
    if backward_units == order.len() {
        backward_ops = nodes.len();
    }
    Order {
        nodes,
        bodies,
        backward_ops,
    }
}

/// The tape's operations as units of scheduling: an operation, or a pattern instance (named
/// by its first node; its other nodes are not units).
struct Units<'t> {
    tape: &'t Tape,
    fusions: &'t Instances,
    /// Ready queues for ops: one per op kind (derived, so a new op gets its own).
    op_queues: usize,
}

impl Units<'_> {
    /// The instance slot `s` belongs to, if any.
    fn instance(&self, s: usize) -> Option<(Pattern, &[u32])> {
        let i = self.fusions.of[s];
        (i != u32::MAX).then(|| {
            let (pattern, nodes) = &self.fusions.found[i as usize];
            (*pattern, nodes.as_slice())
        })
    }

    fn unit_of(&self, s: usize) -> usize {
        self.instance(s).map_or(s, |(_, nodes)| nodes[0] as usize)
    }

    /// Unit `u`'s last node (its own slot for an operation).
    fn last_node(&self, u: usize) -> u32 {
        self.instance(u)
            .map_or(u as u32, |(_, nodes)| *nodes.iter().max().expect("a node"))
    }

    fn is_unit(&self, s: usize) -> bool {
        !self.tape.stored(Slot(s as u32)).op().is_leaf() && self.unit_of(s) == s
    }

    /// `f` of each operand of unit `u` (as units), an instance's from outside it.
    fn operands(&self, u: usize, mut f: impl FnMut(usize)) {
        let args = |s: usize| self.tape.stored(Slot(s as u32)).args();
        match self.instance(u) {
            Some((_, nodes)) => {
                for &s in nodes {
                    for a in args(s as usize) {
                        let a = self.unit_of(a.index());
                        if a != u {
                            f(a);
                        }
                    }
                }
            }
            None => args(u).iter().for_each(|a| f(self.unit_of(a.index()))),
        }
    }

    /// Ready queues: the ops', then the patterns'.
    fn queues(&self) -> usize {
        self.op_queues + Pattern::QUEUES
    }

    fn queue(&self, u: usize) -> usize {
        match self.instance(u) {
            Some((pattern, _)) => self.op_queues + pattern.queue(),
            None => OpKind::from(self.tape.stored(Slot(u as u32)).op()) as usize,
        }
    }
}

/// How many units a window of greedy scheduling holds: the runs reorder the tape within a
/// window, not across the whole phase, so values are read sooner after they are written
/// (and fewer gradients are pulled). `examples/tier1_bench`, first tier per iteration, two
/// alternations: 2,048 against the whole phase took the 60k DAG from 758-782 to 699-708 us
/// and the springs from 168 to 144, the 20k DAG from 165-168 to 171-172, the others level;
/// 512 and 4,096 did less well.
const WINDOW: usize = 2048;

/// Per-slot and per-window buffers of [`greedy_runs`], the caller's.
#[derive(Default)]
struct Scratch {
    /// Per slot: the window its unit is in (`u32::MAX`: none yet).
    window_of: Vec<u32>,
    /// Per slot: its unit's position in its window.
    local: Vec<u32>,
    /// Per position: operands in the window not yet computed.
    pending: Vec<u32>,
    /// Users within the window (CSR by position).
    user_start: Vec<u32>,
    users: Vec<u32>,
}

/// Appends the units of `window` (number `w`) to `order` in greedy runs: of the units whose
/// operands are ready (computed, or outside the window: in earlier windows or phases), the
/// queue with most, all of them and those they make ready (first in, first out).
fn greedy_runs(units: &Units, window: &[u32], w: u32, scratch: &mut Scratch, order: &mut Vec<u32>) {
    let Scratch {
        window_of,
        local,
        pending,
        user_start,
        users,
    } = scratch;
    let n = window.len();
    for (i, &s) in window.iter().enumerate() {
        window_of[s as usize] = w;
        local[s as usize] = i as u32;
    }
    let inside = |a: usize| window_of[a] == w;
    pending.clear();
    pending.resize(n, 0);
    user_start.clear();
    user_start.resize(n + 1, 0);
    for (i, &s) in window.iter().enumerate() {
        units.operands(s as usize, |a| {
            if inside(a) {
                pending[i] += 1;
                user_start[local[a] as usize + 1] += 1;
            }
        });
    }
    for i in 1..=n {
        user_start[i] += user_start[i - 1];
    }
    users.clear();
    users.resize(user_start[n] as usize, 0);
    let mut fill = user_start.to_vec();
    for &s in window {
        units.operands(s as usize, |a| {
            if inside(a) {
                let at = &mut fill[local[a] as usize];
                users[*at as usize] = s;
                *at += 1;
            }
        });
    }
    let queues = units.queues();
    let mut ready: Vec<Vec<u32>> = vec![Vec::new(); queues];
    let mut head = vec![0usize; queues];
    for (i, &s) in window.iter().enumerate() {
        if pending[i] == 0 {
            ready[units.queue(s as usize)].push(s);
        }
    }
    let mut left = n;
    while left > 0 {
        let k = (0..queues)
            .max_by_key(|&k| (ready[k].len() - head[k], usize::MAX - k))
            .expect("a queue");
        while head[k] < ready[k].len() {
            // A batch: the units ready now (none reads another), in the tape's order, so that
            // backward's additions into one gradient interleave with others' as the tape's
            // do (not one dependent chain of them), and more of them are pushed.
            let batch = head[k]..ready[k].len();
            ready[k][batch.clone()].sort_unstable();
            head[k] = batch.end;
            for i in batch {
                let s = ready[k][i] as usize;
                order.push(s as u32);
                left -= 1;
                let i = local[s] as usize;
                for &u in &users[user_start[i] as usize..user_start[i + 1] as usize] {
                    let p = &mut pending[local[u as usize] as usize];
                    *p -= 1;
                    if *p == 0 {
                        ready[units.queue(u as usize)].push(u);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WINDOW;
    use crate::graph::{Graph, Value};
    use crate::kernels::assert_steps_like_the_interpreter;

    /// Windows one after another: chains across their boundaries, and softmaxes whose first
    /// nodes lie windows before their operands (an instance is scheduled where its last node
    /// lies, after every operand): the interpreter's bits.
    #[test]
    fn windows_keep_operands_before_their_readers() {
        let g = Graph::new();
        let x = g.inputs(3);
        let w: Vec<_> = (0..4).map(|i| g.param(0.3 * i as f64 - 0.5)).collect();
        let mut pool: Vec<Value> = x.iter().chain(&w).copied().collect();
        let mut softmaxes = 0;
        while g.len() < 3 * WINDOW + 500 {
            let n = pool.len();
            // The maxes of a softmax now, its last operand a window of other nodes later.
            let (a, b) = (pool[n - 1], pool[n / 2]);
            let m = a.max(b);
            for i in 0..WINDOW / 3 {
                let v = pool[pool.len() - 1 - i % 5] * w[i % 4] + pool[i % 7];
                pool.push(v.tanh());
            }
            let c = pool[pool.len() - 1];
            let m = m.max(c);
            let e: Vec<_> = [a, b, c].iter().map(|&v| (v - m).exp()).collect();
            let t = g.sum(&e);
            pool.extend(e.iter().map(|&ei| ei / t));
            softmaxes += 1;
        }
        let loss = g.sum(pool.iter().rev().take(200).copied());
        g.set_loss(loss).unwrap();
        let stats = assert_steps_like_the_interpreter(&g, &[0.4, -0.8, 0.25]).stats();
        assert_eq!(stats.fused, softmaxes, "{stats:?}");
    }
}
