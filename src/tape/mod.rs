//! The tape: a graph linearized once into flat, slot-indexed form.
//!
//! Every node of the tape owns one slot, its index, in two flat `f64` buffers (values and
//! gradients). The invariants, checked by [`Tape::verify`]:
//!
//! - **Operands precede users**: every operand slot is smaller than the slot that uses it, so
//!   a forward walk in slot order and a backward walk in reverse slot order are correct.
//! - **Leaves first, params contiguous**: slots `0..P` hold the params, param `k` in slot
//!   `param_slots()[k]` (creation order unless a layout pass moved them), and slots `P..P+I`
//!   hold `Input(0)..Input(I-1)`, in order; no other slot holds a param or an input.
//!   Every param and input of the graph is on the tape, used or not, so the parameter vector
//!   and the input slice keep the graph's numbering.
//! - **Arity**: each node has the operands its op takes; a `Sum` has at least one.
//! - **Nothing dead**: every other node is needed by an output or the loss. (Linearization's
//!   liveness sweep makes it so; `verify` does not check it.)
//! - **Gradient cone closed**: the loss needs a gradient, and the operands of a non-leaf
//!   node that needs one need one too, except inputs made without gradient
//!   ([`Graph::input_without_grad`]). Backward visits exactly these nodes and adds local
//!   gradients only into operands that need one.
//! - **Only constants' gradients dropped**: compiled code adds into a node's gradient
//!   (`Tape::takes_grad`) exactly where it needs one, but for a constant that is neither an
//!   output nor the loss (`Tape::drops_grad`).

mod args;
mod consumers;
mod copies;
mod linearize;
mod slot_of;
mod structure;

use crate::error::{Error, Result};
use crate::graph::{Graph, Value};
use crate::op::Op;
use std::sync::OnceLock;

pub(crate) use args::Args;
pub(crate) use consumers::Consumers;
pub(crate) use copies::Copies;

/// A position in the tape and in its value and gradient buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u32);

impl Slot {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One slot of a tape, as [`Tape::node`] shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct TapeNodeView {
    pub op: Op,
    /// The operands' slots, in operand order.
    pub args: Vec<Slot>,
    /// Whether backward computes a gradient for this slot (the loss depends on it).
    pub needs_grad: bool,
}

/// A node of a tape that stores every node ([`Tape::stored`]).
pub(crate) struct Stored<'t> {
    tape: &'t Tape,
    node: TapeNode,
}

impl<'t> Stored<'t> {
    #[inline]
    pub fn op(&self) -> Op {
        self.node.op
    }

    #[inline]
    pub fn needs_grad(&self) -> bool {
        self.node.needs_grad()
    }

    #[inline]
    pub fn args(&self) -> &'t [Slot] {
        let start = self.node.args_start as usize;
        &self.tape.args[start..start + self.node.args_len() as usize]
    }
}

/// A node of the tape in 24 bytes (a compile streams millions of them): its op, where its
/// operands start in [`Tape::args`], and their count with, in the top two bits, whether it
/// needs a gradient and whether compiled code adds into it ([`Tape::takes_grad`]; a node of
/// 2^30 operands would take 4 GB of them).
#[derive(Clone, Copy, Debug)]
struct TapeNode {
    op: Op,
    args_start: u32,
    args_len_and_grad: u32,
}

const NEEDS_GRAD_BIT: u32 = 1 << 31;
const TAKES_GRAD_BIT: u32 = 1 << 30;
const GRAD_BITS: u32 = NEEDS_GRAD_BIT | TAKES_GRAD_BIT;

/// Whether a node needs a gradient, and whether compiled code adds into it.
#[derive(Clone, Copy)]
struct Grad {
    needs: bool,
    takes: bool,
}

impl Grad {
    const NONE: Grad = Grad {
        needs: false,
        takes: false,
    };

    fn both(needs: bool) -> Grad {
        Grad {
            needs,
            takes: needs,
        }
    }
}

impl TapeNode {
    fn new(op: Op, args_start: u32, args_len: u32, grad: Grad) -> TapeNode {
        debug_assert!(args_len & GRAD_BITS == 0);
        let bits = (grad.needs as u32 * NEEDS_GRAD_BIT) | (grad.takes as u32 * TAKES_GRAD_BIT);
        TapeNode {
            op,
            args_start,
            args_len_and_grad: args_len | bits,
        }
    }

    fn args_len(self) -> u32 {
        self.args_len_and_grad & !GRAD_BITS
    }

    fn needs_grad(self) -> bool {
        self.args_len_and_grad & NEEDS_GRAD_BIT != 0
    }

    fn takes_grad(self) -> bool {
        self.args_len_and_grad & TAKES_GRAD_BIT != 0
    }
}

/// A linearized graph. Build it with [`Tape::from_graph`]; backends run it.
#[derive(Clone, Debug)]
pub struct Tape {
    graph_id: u64,
    nodes: Vec<TapeNode>,
    args: Vec<Slot>,
    num_params: usize,
    num_inputs: usize,
    param_init: Vec<f64>,
    /// Param `k` (in creation order) lives in slot `param_slots[k]`.
    param_slots: Vec<Slot>,
    outputs: Vec<Slot>,
    loss: Option<Slot>,
    /// Graph node id -> slot, `u32::MAX` for nodes that were dropped.
    slot_of: slot_of::SlotOf,
    /// Counted on first use ([`Tape::consumers`]).
    consumers: OnceLock<Consumers>,
    /// A batch's copies, whose nodes past the first copy's are not stored.
    copies: Option<Copies>,
}

const DROPPED: u32 = u32::MAX;

/// Moves the per-slot entries of the params as a param layout moves them: the one in slot
/// `from[s]` to slot `s`.
fn move_params<T: Copy>(per_slot: &mut [T], from: &[u32]) {
    let params = per_slot[..from.len()].to_vec();
    for (s, &f) in from.iter().enumerate() {
        per_slot[s] = params[f as usize];
    }
}

impl Tape {
    /// Linearizes `graph`: keeps what an output or the loss depends on (and every param and
    /// input), lays out params, then inputs, then the rest in build order.
    pub fn from_graph(graph: &Graph) -> Result<Tape> {
        let g = graph.data.borrow();
        if let Some(e) = &g.poison {
            return Err(e.clone());
        }
        let linear = linearize::linearize(&g);
        let slot_of = linear.slot_of;
        let num_params = g.param_init.len();
        let tape = Tape {
            graph_id: graph.id(),
            nodes: linear.nodes,
            args: linear.args,
            num_params,
            num_inputs: g.num_inputs as usize,
            param_init: g.param_init.clone(),
            param_slots: (0..num_params as u32).map(Slot).collect(),
            outputs: g.outputs.iter().map(|&o| Slot(slot_of.get(o))).collect(),
            loss: g.loss.map(|l| Slot(slot_of.get(l))),
            slot_of,
            consumers: OnceLock::new(),
            copies: linear.copies,
        };
        tape.verify()?;
        Ok(tape)
    }

    /// Checks the invariants listed in the module docs.
    pub fn verify(&self) -> Result<()> {
        let bad = |slot: usize, what: String| Error::InvalidTape {
            slot: slot as u32,
            what,
        };
        let p = self.num_params;
        let i = self.num_inputs;
        if self.param_init.len() != p {
            return Err(bad(
                0,
                format!("{} initial values for {p} params", self.param_init.len()),
            ));
        }
        if self.len() < p + i {
            return Err(bad(0, "fewer slots than params and inputs".into()));
        }
        if self.param_slots.len() != p {
            return Err(bad(
                0,
                format!("{} param slots for {p} params", self.param_slots.len()),
            ));
        }
        // The copies past the first are the first's moved: checked as that, below.
        let unstored = (self.copies.as_ref()).map_or(0..0, |c| c.first + c.period..c.range().end);
        let stored = (0..unstored.start).chain(unstored.end..self.len() as u32);
        for s in stored.map(|s| s as usize) {
            let node = self.entry(Slot(s as u32));
            match node.op {
                Op::Param(k)
                    if s < p && self.param_slots.get(k as usize) == Some(&Slot(s as u32)) => {}
                Op::Input(k) if (p..p + i).contains(&s) && k as usize == s - p => {}
                Op::Param(_) | Op::Input(_) => {
                    return Err(bad(s, format!("{:?} out of place", node.op)))
                }
                _ if s < p + i => {
                    return Err(bad(s, "a param or input slot holds another op".into()))
                }
                _ => {}
            }
            if node.takes_grad() != node.needs_grad()
                && !(node.needs_grad() && matches!(node.op, Op::Const(_)))
            {
                return Err(bad(
                    s,
                    "takes a gradient it does not need, or drops one".into(),
                ));
            }
            let args = self.args(Slot(s as u32));
            match node.op.arity() {
                Some(k) if k != args.len() => {
                    return Err(bad(
                        s,
                        format!("{} takes {k} operands, has {}", node.op.name(), args.len()),
                    ))
                }
                None if args.is_empty() => return Err(bad(s, "sum of no operands".into())),
                _ => {}
            }
            for a in args {
                if a.index() >= s {
                    return Err(bad(
                        s,
                        format!("operand slot {} does not precede its user", a.0),
                    ));
                }
                let operand = self.entry(a);
                let exempt = matches!(operand.op, Op::Input(_));
                if node.needs_grad() && !operand.needs_grad() && !exempt {
                    return Err(bad(
                        s,
                        format!("operand slot {} is outside the gradient cone", a.0),
                    ));
                }
            }
        }
        if let Some(c) = &self.copies {
            self.verify_copies(c)?;
        }
        for &o in self.outputs.iter().chain(&self.loss) {
            if o.index() >= self.len() {
                return Err(bad(o.index(), "output or loss beyond the tape".into()));
            }
            if self.drops_grad(o) {
                return Err(bad(
                    o.index(),
                    "an output's or the loss's gradient dropped".into(),
                ));
            }
        }
        if let Some(l) = self.loss {
            if !self.entry(l).needs_grad() {
                return Err(bad(
                    l.index(),
                    "the loss is outside the gradient cone".into(),
                ));
            }
        }
        Ok(())
    }

    /// That every copy past the first is the first moved, and so keeps the invariants the
    /// first copy keeps: each of its operands in its own copy (moved by `period`, still
    /// before its user) or before the copies in every copy, needing a gradient as the first
    /// copy's operand does.
    fn verify_copies(&self, c: &Copies) -> Result<()> {
        let bad = |slot: u32, what: &str| Error::InvalidTape {
            slot,
            what: format!("copies: {what}"),
        };
        let range = c.range();
        if c.first < (self.num_params + self.num_inputs) as u32
            || c.period < copies::MIN_COPY_SLOTS
            || c.count < copies::MIN_COPIES
            || range.end as usize > self.len()
        {
            return Err(bad(c.first, "not a run of copies after the leaves"));
        }
        let first_copy = (c.first..c.first + c.period).map(Slot);
        let args: Vec<Slot> = first_copy.clone().flat_map(|s| self.args(s)).collect();
        if args.len() != c.moves.len() {
            return Err(bad(c.first, "a move per operand of the first copy"));
        }
        // Each operand moves by its slot's stride: the copy's own by `period`.
        if (args.iter().zip(&c.moves)).any(|(&a, &by)| c.stride(a) != Some(by)) {
            return Err(bad(
                c.first,
                "an operand does not move by its slot's stride",
            ));
        }
        // A slot read at a stride stays before the copies in every copy, and needs a
        // gradient there as in the first.
        for (a, stride) in c.strided_reads() {
            let needs = self.entry(a).needs_grad();
            for b in 1..c.count as i64 {
                let moved = a.0 as i64 + b * stride;
                if !(0..c.first as i64).contains(&moved) {
                    return Err(bad(a.0, "a read moves into the copies"));
                }
                if self.entry(Slot(moved as u32)).needs_grad() != needs {
                    return Err(bad(
                        moved as u32,
                        "a read needs a gradient in one copy only",
                    ));
                }
            }
        }
        Ok(())
    }

    /// Number of slots (= nodes).
    pub fn len(&self) -> usize {
        self.nodes.len() + self.copies.as_ref().map_or(0, |c| c.unstored() as usize)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many slots hold an operation (not a param, an input or a constant): the stored
    /// nodes', and the first copy's once per other copy.
    pub fn op_nodes(&self) -> usize {
        let ops = |nodes: &[TapeNode]| nodes.iter().filter(|n| !n.op.is_leaf()).count();
        let copies = self.copies.as_ref().map_or(0, |c| {
            let first = c.first as usize..(c.first + c.period) as usize;
            ops(&self.nodes[first]) * (c.count as usize - 1)
        });
        ops(&self.nodes) + copies
    }

    /// What slot `s` holds, or [`Error::NoSuchSlot`] past the end of the tape.
    pub fn node(&self, s: Slot) -> Result<TapeNodeView> {
        if s.index() >= self.len() {
            return Err(Error::NoSuchSlot {
                slot: s.0,
                len: self.len(),
            });
        }
        Ok(TapeNodeView {
            op: self.op(s),
            args: self.args(s).to_vec(),
            needs_grad: self.needs_grad(s),
        })
    }

    // The unchecked accessors the passes and backends use: every slot they hold comes from
    // this tape (`Tape::verify`, `Plan::verify`).
    #[inline]
    pub(crate) fn op(&self, s: Slot) -> Op {
        self.entry(s).op
    }

    #[inline]
    pub(crate) fn args(&self, s: Slot) -> Args<'_> {
        let (n, copy) = self.locate(s);
        self.args_of(n, copy)
    }

    /// Slot `s`'s node, of a tape that stores every node ([`Tape::without_copies`]): what a
    /// walk over every node reads, without asking where it is stored.
    #[inline]
    pub(crate) fn stored(&self, s: Slot) -> Stored<'_> {
        debug_assert!(self.copies.is_none());
        Stored {
            tape: self,
            node: self.nodes[s.index()],
        }
    }

    /// The operands of `node`, stored or (in `copy` past the first) the first copy's.
    #[inline]
    fn args_of(&self, node: TapeNode, copy: u32) -> Args<'_> {
        let range = node.args_start as usize..(node.args_start + node.args_len()) as usize;
        match &self.copies {
            Some(c) if copy > 0 => {
                let first = c.first_args as usize;
                let moves = &c.moves[range.start - first..range.end - first];
                Args::moved(&self.args[range], moves, copy)
            }
            _ => Args::stored(&self.args[range]),
        }
    }

    #[inline]
    pub(crate) fn needs_grad(&self, s: Slot) -> bool {
        self.entry(s).needs_grad()
    }

    /// Whether compiled code adds into `s`'s gradient: where it needs one, but for a
    /// constant's that is neither an output nor the loss. A constant's gradient feeds
    /// nothing, and one made per use (`x * 0.5`, as micrograd makes them) would cost a
    /// derivative, a store and the other operand's value kept for it, at every use. The
    /// interpreter still adds into it, as micrograd does; a compiled program does not keep
    /// it ([`crate::Program::is_kept`]) and recomputes it where every gradient is asked for
    /// ([`crate::Program::every_value_and_grad`]).
    #[inline]
    pub(crate) fn takes_grad(&self, s: Slot) -> bool {
        self.entry(s).takes_grad()
    }

    /// Whether `s` needs a gradient that compiled code never adds into ([`Tape::takes_grad`]):
    /// one a compiled program does not keep, so nothing needs to write it (false past the
    /// tape's end). The one place that says so.
    pub(crate) fn drops_grad(&self, s: Slot) -> bool {
        (s.index() < self.len())
            .then(|| self.entry(s))
            .is_some_and(|n| n.needs_grad() && !n.takes_grad())
    }

    /// All slots in forward order.
    pub fn slots(&self) -> impl DoubleEndedIterator<Item = Slot> + ExactSizeIterator {
        (0..self.len() as u32).map(Slot)
    }

    pub fn num_params(&self) -> usize {
        self.num_params
    }

    pub fn num_inputs(&self) -> usize {
        self.num_inputs
    }

    /// Slot of input 0; inputs occupy `input_base..input_base + num_inputs`.
    pub fn input_base(&self) -> usize {
        self.num_params
    }

    /// The params' initial values, in creation order.
    pub fn param_init(&self) -> &[f64] {
        &self.param_init
    }

    /// The slot of each param, in creation order: a permutation of `0..num_params`.
    pub fn param_slots(&self) -> &[Slot] {
        &self.param_slots
    }

    /// The same tape with its params moved: the param in slot `from[s]` goes to slot `s`.
    /// Every other slot stays where it is. `from` must be a permutation of
    /// `0..num_params`; the JIT's layout pass picks it so that a layer's weights are read with
    /// unit stride across its neurons.
    pub fn with_param_layout(&self, from: &[u32]) -> Result<Tape> {
        self.clone().into_param_layout(from)
    }

    /// [`Tape::with_param_layout`], reusing this tape's memory (a compile moves millions
    /// of operand slots; allocating them anew costs more than rewriting them).
    pub fn into_param_layout(mut self, from: &[u32]) -> Result<Tape> {
        let p = self.num_params;
        if from.len() != p {
            return Err(Error::InvalidTape {
                slot: 0,
                what: format!("param layout of {} slots for {p} params", from.len()),
            });
        }
        let mut to = vec![DROPPED; p];
        for (s, &f) in from.iter().enumerate() {
            match to.get_mut(f as usize) {
                Some(t) if *t == DROPPED => *t = s as u32,
                _ => {
                    return Err(Error::InvalidTape {
                        slot: s as u32,
                        what: format!("param layout: slot {f} is not a param, or moved twice"),
                    })
                }
            }
        }
        if let Some(c) = &self.copies {
            if !c.keeps_strides(&to) {
                // Copies that read params of their own at a stride the move breaks.
                self = self.without_copies();
            }
        }
        let moved = |s: Slot| {
            if s.index() < p {
                Slot(to[s.index()])
            } else {
                s
            }
        };
        move_params(&mut self.nodes, from);
        if let Some(c) = &mut self.copies {
            // (A param any copy reads moves as every copy's read of it.)
            move_params(&mut c.strides, from);
        }
        for a in self
            .args
            .iter_mut()
            .chain(&mut self.param_slots)
            .chain(&mut self.outputs)
            .chain(&mut self.loss)
        {
            *a = moved(*a);
        }
        // (A batch's copies have no params of their own: the slots their rule gives stay.)
        for s in self.slot_of.entries_mut().filter(|s| **s != DROPPED) {
            *s = moved(Slot(*s)).0;
        }
        if let Some(c) = self.consumers.get_mut() {
            c.move_params(from);
        }
        // Every tape is verified when it is made, and permuting the params among their own
        // slots keeps every invariant: param `k` is where `param_slots[k]` says, operands
        // still precede their users (params precede every node that has operands), and no
        // node's gradient cone changes. So the tape is not walked again.
        debug_assert!(self.verify().is_ok());
        Ok(self)
    }

    /// The same tape with every node stored (what a walk over every node, such as the
    /// interpreter's, reads fastest: [`Tape::stored`]).
    pub(crate) fn without_copies(self) -> Tape {
        if self.copies.is_none() {
            return self;
        }
        let mut nodes = Vec::with_capacity(self.len());
        let mut args = Vec::with_capacity(self.args.len());
        for s in self.slots() {
            let mut node = self.entry(s);
            node.args_start = args.len() as u32;
            args.extend(self.args(s));
            nodes.push(node);
        }
        Tape {
            nodes,
            args,
            copies: None,
            ..self
        }
    }

    /// Slot `s`'s node: stored, or the first copy's moved to the copy's operands.
    #[inline]
    fn entry(&self, s: Slot) -> TapeNode {
        self.locate(s).0
    }

    /// Slot `s`'s stored node and its copy (0 for a stored node's slot).
    #[inline]
    fn locate(&self, s: Slot) -> (TapeNode, u32) {
        match &self.copies {
            Some(c) if s.0 >= c.first + c.period => {
                if s.0 < c.range().end {
                    let (b, first) = c.split(s.0);
                    (self.nodes[first as usize], b)
                } else {
                    (self.nodes[(s.0 - c.unstored()) as usize], 0)
                }
            }
            _ => (self.nodes[s.index()], 0),
        }
    }

    /// Calls `f(slot, c)` on every constant `c`, in slot order (a copy's as the first
    /// copy's, without locating every slot).
    pub(crate) fn for_each_constant(&self, mut f: impl FnMut(Slot, f64)) {
        let constant = |n: &TapeNode| match n.op {
            Op::Const(c) => Some(c),
            _ => None,
        };
        let Some(c) = &self.copies else {
            for (s, n) in self.nodes.iter().enumerate() {
                constant(n).into_iter().for_each(|x| f(Slot(s as u32), x));
            }
            return;
        };
        let first_copy_end = (c.first + c.period) as usize;
        for (s, n) in self.nodes[..first_copy_end].iter().enumerate() {
            constant(n).into_iter().for_each(|x| f(Slot(s as u32), x));
        }
        // (The first copy's constants found once: a copy has thousands of nodes.)
        let first_copy: Vec<(u32, f64)> = (self.nodes[c.first as usize..first_copy_end].iter())
            .enumerate()
            .filter_map(|(k, n)| Some((k as u32, constant(n)?)))
            .collect();
        for b in 1..c.count {
            for &(k, x) in &first_copy {
                f(Slot(c.first + b * c.period + k), x);
            }
        }
        for (k, n) in self.nodes[first_copy_end..].iter().enumerate() {
            let s = Slot(c.range().end + k as u32);
            constant(n).into_iter().for_each(|x| f(s, x));
        }
    }

    /// The values a fresh program starts from, other than 0: each param's initial value and
    /// each constant, with its slot.
    pub(crate) fn for_each_initial_value(&self, mut f: impl FnMut(Slot, f64)) {
        for (&s, &p) in self.param_slots().iter().zip(self.param_init()) {
            f(s, p);
        }
        self.for_each_constant(f);
    }

    /// Fresh value and gradient buffers, in slot order: [`Tape::for_each_initial_value`],
    /// everything else 0.
    pub(crate) fn initial_buffers(&self) -> (Vec<f64>, Vec<f64>) {
        let mut values = vec![0.0; self.len()];
        self.for_each_initial_value(|s, x| values[s.index()] = x);
        (values, vec![0.0; self.len()])
    }

    /// The batch's copies, if linearization found some: their nodes are the first copy's
    /// (ops and gradient flags), their operands the first copy's moved by
    /// [`Copies::stride`].
    pub(crate) fn copies(&self) -> Option<&Copies> {
        self.copies.as_ref()
    }

    /// Who reads each slot, counted on the first call.
    pub(crate) fn consumers(&self) -> &Consumers {
        self.consumers.get_or_init(|| Consumers::of(self))
    }

    pub fn outputs(&self) -> &[Slot] {
        &self.outputs
    }

    pub fn loss(&self) -> Option<Slot> {
        self.loss
    }

    pub fn graph_id(&self) -> u64 {
        self.graph_id
    }

    /// The graph node slot `s` holds, if one does (a search over the graph's nodes: for
    /// error messages).
    pub fn node_of(&self, s: Slot) -> Option<u32> {
        (0..self.slot_of.len() as u32).find(|&n| self.slot_of.get(n) == s.0)
    }

    /// The slot of a value of the graph this tape was built from.
    pub fn slot(&self, v: Value<'_>) -> Result<Slot> {
        if v.graph().id() != self.graph_id {
            return Err(Error::ForeignValue {
                node: v.id(),
                value_graph: v.graph().id(),
                graph: self.graph_id,
                context: "tape lookup",
            });
        }
        let on_graph = (v.id() as usize) < self.slot_of.len();
        match on_graph.then(|| self.slot_of.get(v.id())) {
            Some(s) if s != DROPPED => Ok(Slot(s)),
            _ => Err(Error::NotOnTape { node: v.id() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes keep their ops, constants and operands, however many.
    #[test]
    fn every_node_reads_back_its_op_and_operands() {
        let g = Graph::new();
        let xs: Vec<_> = (0..7).map(|_| g.input()).collect();
        let w = g.param(-0.0);
        let c = g.constant(f64::NAN);
        let sums: Vec<_> = (1..=7).map(|n| g.sum(xs[..n].iter().copied())).collect();
        let p = (w * c).powf(-1.5);
        let loss = g.sum(sums.iter().copied().chain([p]));
        g.set_loss(loss).unwrap();
        let tape = Tape::from_graph(&g).unwrap();
        for (n, sum) in (1..=7).zip(&sums) {
            let node = tape.node(tape.slot(*sum).unwrap()).unwrap();
            let want: Vec<Slot> = xs[..n].iter().map(|x| tape.slot(*x).unwrap()).collect();
            assert_eq!((node.op, node.args), (Op::Sum, want));
        }
        let node = tape.node(tape.slot(p).unwrap()).unwrap();
        assert_eq!(node.op, Op::Powf(-1.5));
        assert_eq!(node.args.len(), 1);
        assert!(node.needs_grad);
        let node = tape.node(tape.slot(c).unwrap()).unwrap();
        assert!(matches!(node.op, Op::Const(c) if c.is_nan()));
        assert!(node.args.is_empty());
        assert_eq!(tape.node(tape.slot(w).unwrap()).unwrap().op, Op::Param(0));
        assert_eq!(
            tape.node(tape.slot(xs[6]).unwrap()).unwrap().op,
            Op::Input(6)
        );
        let loss = tape.node(tape.loss().unwrap()).unwrap();
        assert_eq!(loss.args.len(), 8);
        // Moving the params moves no operand out of place.
        tape.with_param_layout(&[0]).unwrap().verify().unwrap();
    }

    /// Compiled code drops only the gradients of constants nothing shows, and `verify` says
    /// so of any other node.
    #[test]
    fn only_constants_that_nothing_shows_drop_their_gradient() {
        let g = Graph::new();
        let x = g.input();
        let (half, shown) = (g.constant(0.5), g.constant(2.0));
        g.add_output(shown).unwrap();
        let y = x * half * shown;
        g.set_loss(y).unwrap();
        let mut tape = Tape::from_graph(&g).unwrap();
        let slot = |v| tape.slot(v).unwrap();
        let (x, half, shown, y) = (slot(x), slot(half), slot(shown), slot(y));
        assert!(tape.drops_grad(half) && tape.needs_grad(half));
        assert!(!tape.drops_grad(shown) && tape.takes_grad(shown));
        assert!(tape.takes_grad(x) && tape.takes_grad(y));
        assert!(!tape.drops_grad(Slot(tape.len() as u32)));
        // A node other than such a constant that drops its gradient is an invalid tape.
        tape.nodes[x.index()].args_len_and_grad &= !TAKES_GRAD_BIT;
        assert!(tape.verify().is_err());
    }

    /// `g`'s tape, checked to read back, slot by slot, as the same tape storing every node:
    /// ops, operands, gradient flags, constants, and every value's slot.
    fn reads_back_as_every_node_stored(g: &Graph) -> Tape {
        let tape = Tape::from_graph(g).unwrap();
        let data = g.data.borrow();
        let all = linearize::sweep_storing_all(&data, &linearize::liveness(&data));
        assert_eq!(tape.len(), all.nodes.len());
        assert_eq!(tape.slot_of.to_vec(), all.slot_of.to_vec());
        for s in tape.slots() {
            let (node, stored) = (tape.entry(s), all.nodes[s.index()]);
            assert_eq!(
                format!("{:?}", node.op),
                format!("{:?}", stored.op),
                "slot {}",
                s.0
            );
            assert_eq!(
                node.args_len_and_grad, stored.args_len_and_grad,
                "slot {}",
                s.0
            );
            let args = &all.args[stored.args_start as usize..][..stored.args_len() as usize];
            assert_eq!(tape.args(s).to_vec(), args, "slot {}", s.0);
        }
        let ops = all.nodes.iter().filter(|n| !n.op.is_leaf()).count();
        assert_eq!(tape.op_nodes(), ops);
        let constants = |t: &Tape| {
            let mut out = Vec::new();
            t.for_each_constant(|s, c| out.push((s, c.to_bits())));
            out
        };
        let stored = tape.clone().without_copies();
        assert!(stored.copies().is_none());
        assert_eq!(constants(&tape), constants(&stored));
        tape
    }

    /// Whether linearizing `g` takes its copies as the graph proved them, reading the first
    /// two only.
    fn takes_proven_copies(g: &Graph) -> bool {
        let data = g.data.borrow();
        let (start, period, count) = copies::hint(&data).expect("copies joined by a sum");
        linearize::proven_copies(&data, start, period, count).is_some()
    }

    /// A tape whose copies are stored once reads back as every node stored.
    #[test]
    fn copies_stored_once_read_back_as_every_node_stored() {
        use crate::nn::{Activation, Layer};
        use rand::SeedableRng;
        // 7 copies of a 3-5-1 MLP on inputs of their own, reading a value computed before
        // them; copy 5 differs (the copies end before it); a mean loss.
        let g = Graph::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let hidden = Layer::new(&g, 3, 5, Activation::Tanh, &mut rng);
        let readout = Layer::new(&g, 5, 1, Activation::Linear, &mut rng);
        let scale = g.param(0.5).exp();
        let outs: Vec<Value<'_>> = (0..7)
            .map(|b| {
                let x = g.inputs_without_grad(3);
                let h = hidden.call(&x).unwrap();
                let y = readout.call(&h).unwrap()[0] * scale;
                (y - 0.5).powf(if b == 5 { 3.0 } else { 2.0 })
            })
            .collect();
        g.set_loss(g.sum(&outs) * (1.0 / 7.0)).unwrap();
        assert!(takes_proven_copies(&g));
        let tape = reads_back_as_every_node_stored(&g);
        let copies = tape.copies().expect("copies 0 to 4");
        assert_eq!(copies.count, 5);
        let mut constants = 0;
        tape.for_each_constant(|_, _| constants += 1);
        assert_eq!(constants, 7 + 1, "0.5 per copy, then 1 / 7");
    }

    /// How a batch's copies may differ from the first beyond what the graph proves as it is
    /// built (the ops and how operands move), and what the copies read.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Batch {
        /// Copies alike, inputs of their own.
        Alike,
        /// Inputs all made before the copies, each copy reading its own.
        InputsFirst,
        /// The same, the last copy reading the first inputs.
        InputsFirstBackward,
        /// Copy 4's inputs take a gradient, the others' do not.
        OneCopysInputsTakeGradient,
        /// A value of copy 2 that the loss does not read is an output.
        OutputInOneCopy,
        /// That value is an output in every copy.
        OutputInEveryCopy,
        /// Each copy reads a value of its own made before the copies (an input taking a
        /// gradient); copy 3's takes none.
        ValuesFirstOneWithoutGradient,
        /// Each copy reads its neighbour's activation (the first, a value before them).
        ReadsNeighbour,
    }

    fn batch(g: &Graph, batch: Batch) {
        use crate::nn::{Activation, Layer};
        use rand::SeedableRng;
        const COPIES: usize = 6;
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let hidden = Layer::new(g, 3, 4, Activation::Tanh, &mut rng);
        let readout = Layer::new(g, 4, 1, Activation::Linear, &mut rng);
        let inputs = g.inputs_without_grad(3 * COPIES);
        let values: Vec<_> = (0..COPIES)
            .map(|b| match (batch, b) {
                (Batch::ValuesFirstOneWithoutGradient, 3) => g.input_without_grad(),
                _ => g.input(),
            })
            .collect();
        let mut before = values[0] * 0.5;
        let outs: Vec<Value<'_>> = (0..COPIES)
            .map(|b| {
                let x = match batch {
                    Batch::InputsFirst => inputs[3 * b..3 * b + 3].to_vec(),
                    Batch::InputsFirstBackward => {
                        inputs[3 * (COPIES - 1 - b)..3 * (COPIES - b)].to_vec()
                    }
                    Batch::OneCopysInputsTakeGradient if b == 4 => g.inputs(3),
                    _ => g.inputs_without_grad(3),
                };
                let h = hidden.call(&x).unwrap();
                let mut y = readout.call(&h).unwrap()[0];
                // (Kept only where it is an output.)
                let shown = h[1] * 2.0;
                match batch {
                    Batch::OutputInOneCopy if b == 2 => {
                        g.add_output(shown).unwrap();
                    }
                    Batch::OutputInEveryCopy => {
                        g.add_output(shown).unwrap();
                    }
                    Batch::ValuesFirstOneWithoutGradient => y *= values[b],
                    Batch::ReadsNeighbour => {
                        y += before;
                        before = h[0];
                    }
                    _ => {}
                }
                (y - 0.5).powf(2.0)
            })
            .collect();
        g.set_loss(g.sum(&outs) * (1.0 / COPIES as f64)).unwrap();
    }

    /// Copies the graph proved as it was built are linearized from the first two and read
    /// back as every node stored; where they differ in what the graph does not prove
    /// (gradient flags, outputs, reads of values before them), linearization checks every
    /// copy instead.
    #[test]
    fn proven_copies_read_back_as_every_node_stored() {
        use Batch::*;
        let cases = [
            (Alike, true),
            (InputsFirst, true),
            (InputsFirstBackward, true),
            (OneCopysInputsTakeGradient, false),
            (OutputInOneCopy, false),
            (OutputInEveryCopy, true),
            (ValuesFirstOneWithoutGradient, false),
            (ReadsNeighbour, false),
        ];
        for (case, proven) in cases {
            let g = Graph::new();
            batch(&g, case);
            assert_eq!(takes_proven_copies(&g), proven, "{case:?}");
            let tape = reads_back_as_every_node_stored(&g);
            if proven {
                assert_eq!(tape.copies().map(|c| c.count), Some(6), "{case:?}");
            }
        }
    }
}
