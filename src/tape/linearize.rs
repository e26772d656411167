//! Linearization: a graph's arena as a tape's nodes, a batch's copies stored once
//! ([`super::copies`]).
//!
//! Two sweeps. Backward from the outputs and the loss, which nodes are kept and which need
//! a gradient (the arena is topologically ordered). Forward, each node's slot: params, then
//! inputs (each created in index order: param `k` is the `k`-th), then the rest in build
//! order, every node's operands already placed.

use super::copies::{self, Copies, MIN_COPIES};
use super::{Grad, Slot, TapeNode, DROPPED};
use crate::graph::GraphData;
use crate::op::Op;

/// A node is kept.
pub(super) const LIVE: u8 = 1;
/// Backward reaches it from the loss.
pub(super) const GRAD: u8 = 2;
/// An output or the loss: its gradient is shown.
pub(super) const SHOWN: u8 = 4;

/// Per node of `g`: [`LIVE`], [`GRAD`], [`SHOWN`].
pub(super) fn liveness(g: &GraphData) -> Vec<u8> {
    let mut flags = vec![0u8; g.nodes.len()];
    for &o in &g.outputs {
        flags[o as usize] |= LIVE | SHOWN;
    }
    if let Some(l) = g.loss {
        flags[l as usize] |= LIVE | GRAD | SHOWN;
    }
    // The arena is topologically ordered, so one reverse sweep propagates both.
    for (i, node) in g.nodes.iter().enumerate().rev() {
        let f = flags[i];
        if f & LIVE != 0 && !node.op.is_leaf() {
            for &a in g.args_of(node) {
                flags[a as usize] |= LIVE | (f & GRAD);
            }
        }
    }
    flags
}

/// What the forward sweep makes of the arena.
pub(super) struct Linear {
    /// The stored nodes: every slot's but those of copies past the first.
    pub nodes: Vec<TapeNode>,
    /// Every slot's operands, in slot order.
    pub args: Vec<Slot>,
    /// Graph node -> slot, [`DROPPED`] for nodes not kept.
    pub slot_of: Vec<u32>,
    pub copies: Option<Copies>,
}

/// The forward sweep over `g` (with `flags` from [`liveness`]), its copies stored once where
/// [`copies::hint`] finds them and they check out.
pub(super) fn sweep(g: &GraphData, flags: &[u8]) -> Linear {
    if let Some((start, period, count)) = copies::hint(g) {
        if let Some(linear) = Sweep::new(g, flags).with_copies(start, period, count) {
            return linear;
        }
    }
    let mut sweep = Sweep::new(g, flags);
    (0..g.nodes.len()).for_each(|i| sweep.place(i));
    sweep.finish()
}

/// [`sweep`] storing every node: what a tape with copies must read back as.
#[cfg(test)]
pub(super) fn sweep_storing_all(g: &GraphData, flags: &[u8]) -> Linear {
    let mut sweep = Sweep::new(g, flags);
    (0..g.nodes.len()).for_each(|i| sweep.place(i));
    sweep.finish()
}

struct Sweep<'g> {
    g: &'g GraphData,
    flags: &'g [u8],
    nodes: Vec<TapeNode>,
    args: Vec<Slot>,
    slot_of: Vec<u32>,
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
    fn new(g: &'g GraphData, flags: &'g [u8]) -> Sweep<'g> {
        let leaves = g.param_init.len() + g.num_inputs as usize;
        let mut nodes = vec![leaf(Op::Const(0.0), Grad::NONE); leaves];
        nodes.reserve(g.nodes.len() - leaves);
        Sweep {
            g,
            flags,
            nodes,
            args: Vec::with_capacity(g.args.len()),
            slot_of: vec![DROPPED; g.nodes.len()],
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
        let (g, node) = (self.g, self.g.nodes[i]);
        let needs_grad = self.flags[i] & GRAD != 0;
        let num_params = g.param_init.len();
        self.slot_of[i] = match node.op {
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
            _ if self.flags[i] & LIVE == 0 => DROPPED,
            op => {
                let args_start = self.args.len() as u32;
                let slot_of = &self.slot_of;
                (self.args).extend(g.args_of(&node).iter().map(|&a| Slot(slot_of[a as usize])));
                // A constant's gradient feeds nothing: compiled code adds into it only where
                // it is shown.
                let shown = self.flags[i] & SHOWN != 0;
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
        };
    }

    /// The sweep with graph nodes `start + b * period..` (for `b < count`) as copies of the
    /// first: `None` if fewer than [`MIN_COPIES`] of them check out.
    fn with_copies(mut self, start: usize, period: usize, count: u32) -> Option<Linear> {
        let n = self.g.nodes.len();
        (0..start).for_each(|i| self.place(i));
        let (first, first_args) = (self.nodes.len() as u32, self.args.len());
        (start..start + period).for_each(|i| self.place(i));
        let slots = self.nodes.len() as u32 - first;
        if slots < copies::MIN_COPY_SLOTS {
            // Copies of a few nodes (a loss's terms) are no copies worth storing once: the
            // tape's accessors would ask where every node is stored for nothing.
            (start + period..n).for_each(|i| self.place(i));
            return Some(self.finish());
        }
        self.copies = Some(Copies::new(first, slots, first_args as u32));
        self.reads = Reads {
            span: (start, period),
            kinds: vec![Read::Unseen; self.args.len() - first_args],
        };
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
        let first_slot = slot_of[like];
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
            let moved = Slot(slot_of[a as usize]);
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
        slot_of[i] = first_slot + b * copies.period;
        true
    }

    /// Stores the nodes of copy `b` (graph nodes `copy..end`, placed but not stored) that
    /// take slots, and their operands: the copies end before it.
    fn store_copy_until(&mut self, copy: usize, end: usize, b: u32, period: usize) {
        let unstored = self.copies.as_ref().expect("copies").unstored();
        for i in copy..end {
            let taken = self.slot_of[i];
            let node = self.g.nodes[i];
            if taken == DROPPED || node.op.is_leaf() && !matches!(node.op, Op::Const(_)) {
                continue;
            }
            let first_slot = self.slot_of[i - b as usize * period];
            let mut stored = self.nodes[first_slot as usize];
            stored.args_start = self.args.len() as u32;
            let slot_of = &self.slot_of;
            (self.args).extend(
                self.g
                    .args_of(&node)
                    .iter()
                    .map(|&a| Slot(slot_of[a as usize])),
            );
            debug_assert_eq!(self.nodes.len() as u32 + unstored, taken);
            self.nodes.push(stored);
        }
    }
}

fn leaf(op: Op, grad: Grad) -> TapeNode {
    TapeNode::new(op, 0, 0, grad)
}
