//! The run order: the tape's operations in greedy runs of one op, a fused pattern instance
//! ([`super::fused`]) scheduled as one unit.

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

/// Backward's operations first, then the others; each phase in greedy runs of units, an
/// instance's nodes in its pattern's order.
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
    let mut scratch = (vec![0u32; n], vec![0u32; n + 1], Vec::new());
    let mut backward_units = 0;
    for phase_needs in [true, false] {
        let in_phase =
            |s: usize| units.is_unit(s) && tape.needs_grad(Slot(s as u32)) == phase_needs;
        greedy_runs(&units, &in_phase, &mut scratch, &mut order);
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

/// Appends the units `in_phase` accepts to `order` in greedy runs: of the units whose
/// operands are ready (computed, or outside the phase), the queue with most, all of them
/// and those they make ready (first in, first out). Scratch buffers are the caller's.
fn greedy_runs(
    units: &Units,
    in_phase: &dyn Fn(usize) -> bool,
    (pending, user_start, users): &mut (Vec<u32>, Vec<u32>, Vec<u32>),
    order: &mut Vec<u32>,
) {
    let n = pending.len();
    // Users within the phase (CSR), and each unit's operands not yet computed.
    user_start.fill(0);
    let mut count = 0;
    for s in (0..n).filter(|&s| in_phase(s)) {
        count += 1;
        pending[s] = 0;
        units.operands(s, |a| {
            if in_phase(a) {
                pending[s] += 1;
                user_start[a + 1] += 1;
            }
        });
    }
    for i in 1..=n {
        user_start[i] += user_start[i - 1];
    }
    users.clear();
    users.resize(user_start[n] as usize, 0);
    let mut fill = user_start.to_vec();
    for s in (0..n).filter(|&s| in_phase(s)) {
        units.operands(s, |a| {
            if in_phase(a) {
                users[fill[a] as usize] = s as u32;
                fill[a] += 1;
            }
        });
    }
    let queues = units.queues();
    let mut ready: Vec<Vec<u32>> = vec![Vec::new(); queues];
    let mut head = vec![0usize; queues];
    for s in (0..n).filter(|&s| in_phase(s) && pending[s] == 0) {
        ready[units.queue(s)].push(s as u32);
    }
    let mut left = count;
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
                for &u in &users[user_start[s] as usize..user_start[s + 1] as usize] {
                    pending[u as usize] -= 1;
                    if pending[u as usize] == 0 {
                        ready[units.queue(u as usize)].push(u);
                    }
                }
            }
        }
    }
}
