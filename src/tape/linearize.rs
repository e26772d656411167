//! Linearization: a graph's arena as a tape's nodes, a batch's copies stored once
//! ([`super::copies`]).
//!
//! Two sweeps. Backward from the outputs and the loss, which nodes are kept and which need
//! a gradient (the arena is topologically ordered). Forward, each node's slot: params, then
//! inputs (each created in index order: param `k` is the `k`-th), then the rest in build
//! order, every node's operands already placed.

use super::copies::{self, Copies, MIN_COPIES};
use super::slot_of::SlotOf;
use super::{Grad, Slot, TapeNode, DROPPED};
use crate::graph::GraphData;
use crate::op::Op;
use std::ops::Range;

/// A node is kept.
pub(super) const LIVE: u8 = 1;
/// Backward reaches it from the loss.
pub(super) const GRAD: u8 = 2;
/// An output or the loss: its gradient is shown.
pub(super) const SHOWN: u8 = 4;

/// Per node of `g`: [`LIVE`], [`GRAD`], [`SHOWN`].
pub(super) fn liveness(g: &GraphData) -> Vec<u8> {
    let mut flags = vec![0u8; g.nodes.len()];
    flag_ends(g, &mut flags, |_| {});
    flag_operands(g, &mut flags, 0..g.nodes.len(), |_| {});
    flags
}

/// The outputs and the loss flagged; `flagged` is told of each.
fn flag_ends(g: &GraphData, flags: &mut [u8], mut flagged: impl FnMut(u32)) {
    for &o in &g.outputs {
        flags[o as usize] |= LIVE | SHOWN;
        flagged(o);
    }
    if let Some(l) = g.loss {
        flags[l as usize] |= LIVE | GRAD | SHOWN;
        flagged(l);
    }
}

/// The operands of nodes `nodes` flagged from them, walked backward (the arena is
/// topologically ordered, so one sweep propagates both): kept if a kept node reads them,
/// needing a gradient if one that needs it does. `flagged` is told of each.
fn flag_operands(
    g: &GraphData,
    flags: &mut [u8],
    nodes: Range<usize>,
    mut flagged: impl FnMut(u32),
) {
    for i in nodes.rev() {
        let (node, f) = (&g.nodes[i], flags[i]);
        if f & LIVE != 0 && !node.op.is_leaf() {
            for &a in g.args_of(node) {
                flags[a as usize] |= LIVE | (f & GRAD);
                flagged(a);
            }
        }
    }
}

/// [`liveness`] where copies `1..count` of the `period` graph nodes at `start` are the first
/// moved ([`crate::graph::CopyRuns`]): if the nodes after the copies (and the outputs, and the
/// loss) flag every copy alike, every copy's flags are the first's. So the first copy is
/// flagged and its flags given to the second, and the others' left 0 (but where a node after
/// them reads them). `None` if the copies are not flagged alike, or a copy reads another or
/// (the last copy) a node past the copies' start.
fn liveness_over_copies(g: &GraphData, start: usize, period: usize, count: u32) -> Option<Vec<u8>> {
    let n = g.nodes.len();
    let copies = start..start + count as usize * period;
    let mut flags = vec![0u8; n];
    // The copies' nodes flagged from outside them.
    let mut roots = Vec::new();
    let mut root = |a: u32| {
        if copies.contains(&(a as usize)) {
            roots.push(a);
        }
    };
    flag_ends(g, &mut flags, &mut root);
    flag_operands(g, &mut flags, copies.end..n, &mut root);
    roots.sort_unstable();
    roots.dedup();
    let in_first = roots.partition_point(|&a| (a as usize) < start + period);
    if roots.len() != in_first * count as usize {
        return None;
    }
    if in_first > 0 {
        let (first, _) = roots.split_at(in_first);
        for (b, copy) in roots.chunks(in_first).enumerate() {
            let moved = (b * period) as u32;
            let alike = |(&a, &a_first): (&u32, &u32)| {
                a == a_first + moved && flags[a as usize] == flags[a_first as usize]
            };
            if !copy.iter().zip(first).all(alike) {
                return None;
            }
        }
    }
    // The first copy, whose reads before the copies stand for every copy's.
    for i in (start..start + period).rev() {
        let (node, f) = (&g.nodes[i], flags[i]);
        if f & LIVE == 0 || node.op.is_leaf() {
            continue;
        }
        for (a, a_second) in operands_and_second(g, i, period) {
            let by = a_second as i64 - a as i64;
            let own = a as usize >= start;
            let last = a as i64 + by * (count as i64 - 1);
            if own && by != period as i64 || !own && !(0..start as i64).contains(&last) {
                return None;
            }
            let reads = if own || by == 0 { 1 } else { count as i64 };
            for b in 0..reads {
                flags[(a as i64 + b * by) as usize] |= LIVE | (f & GRAD);
            }
        }
    }
    flags.copy_within(start..start + period, start + period);
    flag_operands(g, &mut flags, 0..start, |_| {});
    Some(flags)
}

/// What the forward sweep makes of the arena.
pub(super) struct Linear {
    /// The stored nodes: every slot's but those of copies past the first.
    pub nodes: Vec<TapeNode>,
    /// Every slot's operands, in slot order.
    pub args: Vec<Slot>,
    /// Graph node -> slot, [`DROPPED`] for nodes not kept.
    pub slot_of: SlotOf,
    pub copies: Option<Copies>,
}

/// `g` linearized: liveness, then the forward sweep, a batch's copies stored once where
/// [`copies::hint`] finds them and they check out: on the first two copies only where the
/// graph proved the others ([`crate::graph::CopyRuns`]).
pub(super) fn linearize(g: &GraphData) -> Linear {
    let Some((start, period, count)) = copies::hint(g) else {
        return sweep_storing_all(g, &liveness(g));
    };
    if let Some(linear) = proven_copies(g, start, period, count) {
        return linear;
    }
    let flags = liveness(g);
    (Sweep::new(g, &flags, SlotOf::new(g.nodes.len())).with_copies(start, period, count))
        .unwrap_or_else(|| sweep_storing_all(g, &flags))
}

/// The sweep with graph nodes `start + b * period..` (for `b < count`) as copies of the
/// first, as far as the graph proved them the first moved as far as the second is
/// ([`crate::graph::CopyRuns`]): only the first two copies are read. `None` if it proved
/// fewer than [`MIN_COPIES`], or they are not copies the tape can store once (or the copies
/// make params of their own).
pub(super) fn proven_copies(
    g: &GraphData,
    start: usize,
    period: usize,
    count: u32,
) -> Option<Linear> {
    let count = (g.copy_runs).copies_from(g.arena(), start as u32, period as u32, count);
    if count < MIN_COPIES {
        return None;
    }
    let first_copy = &g.nodes[start..start + period];
    if first_copy
        .iter()
        .any(|node| matches!(node.op, Op::Param(_)))
    {
        return None;
    }
    let flags = liveness_over_copies(g, start, period, count)?;
    let n = g.nodes.len();
    let slot_of = SlotOf::with_copies(n, start as u32, period as u32, count);
    let mut sweep = Sweep::new(g, &flags, slot_of);
    if !sweep.first_copy(start, period) {
        return None;
    }
    for i in start + period..start + 2 * period {
        if !sweep.place_copy(i, i - period, 1, count - 1) {
            return None;
        }
    }
    sweep.slot_of.rule();
    sweep.place_proven_copies(start, period, count)?;
    (start + count as usize * period..n).for_each(|i| sweep.place(i));
    Some(sweep.finish())
}

/// The forward sweep storing every node: what a tape with copies must read back as.
pub(super) fn sweep_storing_all(g: &GraphData, flags: &[u8]) -> Linear {
    let mut sweep = Sweep::new(g, flags, SlotOf::new(g.nodes.len()));
    (0..g.nodes.len()).for_each(|i| sweep.place(i));
    sweep.finish()
}

struct Sweep<'g> {
    g: &'g GraphData,
    flags: &'g [u8],
    nodes: Vec<TapeNode>,
    args: Vec<Slot>,
    slot_of: SlotOf,
    /// The copies so far: `count` of them checked.
    copies: Option<Copies>,
    reads: Reads,
}

/// How copy 1 read each of the first copy's operands: from copy 2 on, a read of the copy's
/// own (the first copy's node moved by whole copies, as graph nodes) or of the node the first
/// copy reads is checked as just that.
struct Reads {
    /// The first copy's graph nodes: (start, how many).
    span: (usize, usize),
    /// Per operand of the first copy, in slot order.
    kinds: Vec<Read>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Read {
    Unseen,
    Own,
    Shared,
    Other,
}

impl<'g> Sweep<'g> {
    fn new(g: &'g GraphData, flags: &'g [u8], slot_of: SlotOf) -> Sweep<'g> {
        let leaves = g.param_init.len() + g.num_inputs as usize;
        let mut nodes = vec![leaf(Op::Const(0.0), Grad::NONE); leaves];
        nodes.reserve(g.nodes.len() - leaves);
        Sweep {
            g,
            flags,
            nodes,
            args: Vec::with_capacity(g.args.len()),
            slot_of,
            copies: None,
            reads: Reads {
                span: (0, 0),
                kinds: Vec::new(),
            },
        }
    }

    fn finish(mut self) -> Linear {
        if let Some(c) = &mut self.copies {
            let start = c.first_args as usize;
            let first_copy = &self.nodes[c.first as usize..(c.first + c.period) as usize];
            let len: u32 = first_copy.iter().map(|n| n.args_len()).sum();
            c.record_moves(&self.args[start..start + len as usize]);
        }
        Linear {
            nodes: self.nodes,
            args: self.args,
            slot_of: self.slot_of,
            copies: self.copies,
        }
    }

    /// Places node `i` and stores it.
    fn place(&mut self, i: usize) {
        let slot = self.slot(i, self.flags[i]);
        self.slot_of.set(i as u32, slot);
    }

    /// Node `i`'s slot, its flags `flags`; stores it where it takes one past the leaves.
    fn slot(&mut self, i: usize, flags: u8) -> u32 {
        let (g, node) = (self.g, self.g.nodes[i]);
        let needs_grad = flags & GRAD != 0;
        let num_params = g.param_init.len();
        match node.op {
            Op::Param(k) => {
                self.nodes[k as usize] = leaf(node.op, Grad::both(needs_grad));
                k
            }
            Op::Input(k) => {
                // An input without a gradient takes none from its users (it may still be
                // the loss itself).
                let differentiable = g.input_grad[k as usize] || g.loss == Some(i as u32);
                let grad = Grad::both(needs_grad && differentiable);
                self.nodes[num_params + k as usize] = leaf(node.op, grad);
                num_params as u32 + k
            }
            _ if flags & LIVE == 0 => DROPPED,
            op => {
                let args_start = self.args.len() as u32;
                let slot_of = &self.slot_of;
                (self.args).extend(g.args_of(&node).iter().map(|&a| Slot(slot_of.get(a))));
                // A constant's gradient feeds nothing: compiled code adds into it only where
                // it is shown.
                let shown = flags & SHOWN != 0;
                let takes = needs_grad && (!matches!(op, Op::Const(_)) || shown);
                let grad = Grad {
                    needs: needs_grad,
                    takes,
                };
                let slot =
                    self.nodes.len() as u32 + self.copies.as_ref().map_or(0, Copies::unstored);
                self.nodes
                    .push(TapeNode::new(op, args_start, node.args_len, grad));
                slot
            }
        }
    }

    /// Places the nodes before the copies at `start` and the first copy, storing them, and
    /// starts the copies: false (no copies) if a copy takes too few slots to store once.
    fn first_copy(&mut self, start: usize, period: usize) -> bool {
        (0..start).for_each(|i| self.place(i));
        let (first, first_args) = (self.nodes.len() as u32, self.args.len());
        (start..start + period).for_each(|i| self.place(i));
        let slots = self.nodes.len() as u32 - first;
        if slots < copies::MIN_COPY_SLOTS {
            // Copies of a few nodes (a loss's terms) are no copies worth storing once: the
            // tape's accessors would ask where every node is stored for nothing.
            return false;
        }
        self.copies = Some(Copies::new(first, slots, first_args as u32));
        self.reads = Reads {
            span: (start, period),
            kinds: vec![Read::Unseen; self.args.len() - first_args],
        };
        true
    }

    /// The sweep with graph nodes `start + b * period..` (for `b < count`) as copies of the
    /// first: `None` if fewer than [`MIN_COPIES`] of them check out.
    fn with_copies(mut self, start: usize, period: usize, count: u32) -> Option<Linear> {
        let n = self.g.nodes.len();
        if !self.first_copy(start, period) {
            (start + period..n).for_each(|i| self.place(i));
            return Some(self.finish());
        }
        let mut end = n;
        'copies: for b in 1..count {
            let copy = start + b as usize * period;
            for i in copy..copy + period {
                if !self.place_copy(i, i - b as usize * period, b, count - 1) {
                    if b < MIN_COPIES {
                        return None;
                    }
                    self.store_copy_until(copy, i, b, period);
                    end = i;
                    break 'copies;
                }
            }
            self.copies.as_mut().expect("copies").count = b + 1;
        }
        let rest = end.min(start + count as usize * period);
        (rest..n).for_each(|i| self.place(i));
        Some(self.finish())
    }

    /// Copies `2..count` of the `period` graph nodes at `start`, which the graph proved the
    /// first moved as far as the second is, once the first two are placed: their inputs
    /// placed (taking a gradient as the first copy's do) and their reads of nodes before the
    /// copies checked to move by their slots' strides, their own nodes left to the rule
    /// ([`SlotOf::rule`]). `None` if a read or an input does not.
    fn place_proven_copies(&mut self, start: usize, period: usize, count: u32) -> Option<()> {
        let g = self.g;
        let first_copy = start..start + period;
        let inputs: Vec<usize> = (first_copy.clone())
            .filter(|&i| matches!(g.nodes[i].op, Op::Input(_)))
            .collect();
        // (graph node, how far it moves per copy, its slot's stride)
        let mut strided = Vec::new();
        let copies = self.copies.as_ref().expect("copies");
        for i in first_copy.filter(|&i| self.flags[i] & LIVE != 0) {
            for (a, a_second) in operands_and_second(g, i, period) {
                if (a as usize) < start && a != a_second {
                    let stride = copies.stride(Slot(self.slot_of.get(a)))?;
                    strided.push((a, a_second as i64 - a as i64, stride));
                }
            }
        }
        let takes_grad = |s: u32| self.nodes[s as usize].takes_grad();
        for b in 2..count as i64 {
            for &(a, by, stride) in &strided {
                let (slot, moved) = (
                    self.slot_of.get(a),
                    self.slot_of.get((a as i64 + b * by) as u32),
                );
                if moved as i64 != slot as i64 + b * stride || takes_grad(slot) != takes_grad(moved)
                {
                    return None;
                }
            }
        }
        for b in 2..count as usize {
            for &like in &inputs {
                let i = like + b * period;
                let (Op::Input(k), Op::Input(k_first)) = (g.nodes[i].op, g.nodes[like].op) else {
                    unreachable!("the graph proved node {i} an input as node {like} is");
                };
                if g.input_grad[k as usize] != g.input_grad[k_first as usize] {
                    return None;
                }
                let slot = self.slot(i, self.flags[like]);
                debug_assert_eq!(slot, self.slot_of.get(i as u32));
            }
        }
        self.copies.as_mut().expect("copies").count = count;
        Some(())
    }

    /// Places node `i` of copy `b` as node `like` of the first copy moved, without storing
    /// it; false (nothing placed) if it is not that.
    fn place_copy(&mut self, i: usize, like: usize, b: u32, last_copy: u32) -> bool {
        let (g, node, first) = (self.g, self.g.nodes[i], self.g.nodes[like]);
        if !copies::alike(node.op, first.op, self.flags[i], self.flags[like]) {
            return false;
        }
        if let (Op::Input(k), Op::Input(k_first)) = (node.op, first.op) {
            // (Whether an input takes a gradient is the user's to say, input by input.)
            if g.input_grad[k as usize] != g.input_grad[k_first as usize] {
                return false;
            }
        }
        if node.op.is_leaf() && !matches!(node.op, Op::Const(_)) || self.flags[i] & LIVE == 0 {
            self.place(i);
            return true;
        }
        let Sweep {
            nodes,
            args,
            slot_of,
            copies,
            reads,
            ..
        } = self;
        let copies = copies.as_mut().expect("copies");
        let (copy_start, copy_nodes) = reads.span;
        let first_slot = slot_of.get(like as u32);
        let first_node = nodes[first_slot as usize];
        let position = (first_node.args_start - copies.first_args) as usize;
        let operands = g.args_of(&node).iter().zip(g.args_of(&first));
        for (k, (&a, &a_first)) in operands.enumerate() {
            let read = &mut reads.kinds[position + k];
            // Most reads are checked as graph nodes: of the copy's own (the first copy's
            // moved by whole copies) or the very node the first copy reads.
            let own = a_first as usize >= copy_start;
            match *read {
                Read::Own if a as usize == a_first as usize + b as usize * copy_nodes => continue,
                Read::Shared if a == a_first => continue,
                Read::Own | Read::Shared => return false,
                Read::Unseen | Read::Other => {}
            }
            let moved = Slot(slot_of.get(a));
            let of_first = args[first_node.args_start as usize + k];
            let takes_grad = |s: Slot| nodes[s.index()].takes_grad();
            if !copies.moves(of_first, moved, b, last_copy, takes_grad) {
                return false;
            }
            if *read == Read::Unseen {
                *read = match (own, a as i64 - a_first as i64) {
                    (true, by) if by == copy_nodes as i64 => Read::Own,
                    (false, 0) => Read::Shared,
                    _ => Read::Other,
                };
            }
        }
        slot_of.set(i as u32, first_slot + b * copies.period);
        true
    }

    /// Stores the nodes of copy `b` (graph nodes `copy..end`, placed but not stored) that
    /// take slots, and their operands: the copies end before it.
    fn store_copy_until(&mut self, copy: usize, end: usize, b: u32, period: usize) {
        let unstored = self.copies.as_ref().expect("copies").unstored();
        for i in copy..end {
            let taken = self.slot_of.get(i as u32);
            let node = self.g.nodes[i];
            if taken == DROPPED || node.op.is_leaf() && !matches!(node.op, Op::Const(_)) {
                continue;
            }
            let first_slot = self.slot_of.get((i - b as usize * period) as u32);
            let mut stored = self.nodes[first_slot as usize];
            stored.args_start = self.args.len() as u32;
            let slot_of = &self.slot_of;
            (self.args).extend(self.g.args_of(&node).iter().map(|&a| Slot(slot_of.get(a))));
            debug_assert_eq!(self.nodes.len() as u32 + unstored, taken);
            self.nodes.push(stored);
        }
    }
}

/// Node `i`'s operands, each with the same operand of the node a copy (`period`) later.
fn operands_and_second(
    g: &GraphData,
    i: usize,
    period: usize,
) -> impl Iterator<Item = (u32, u32)> + '_ {
    let second = g.args_of(&g.nodes[i + period]);
    g.args_of(&g.nodes[i])
        .iter()
        .copied()
        .zip(second.iter().copied())
}

fn leaf(op: Op, grad: Grad) -> TapeNode {
    TapeNode::new(op, 0, 0, grad)
}
