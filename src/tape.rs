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
//! - **Nothing dead**: every other node is needed by an output or the loss.
//! - **Gradient cone closed**: the loss needs a gradient, and the operands of a non-leaf
//!   node that needs one need one too, except inputs made without gradient
//!   ([`Graph::input_without_grad`]). Backward visits exactly these nodes and adds local
//!   gradients only into operands that need one.
//! - **Only constants' gradients dropped**: compiled code adds into a node's gradient
//!   (`Tape::takes_grad`) exactly where it needs one, but for a constant that is neither an
//!   output nor the loss (`Tape::drops_grad`).

use crate::error::{Error, Result};
use crate::graph::{Graph, Value};
use crate::op::Op;
use std::sync::OnceLock;

/// A position in the tape and in its value and gradient buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u32);

impl Slot {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One slot of a tape, as [`Tape::node`] shows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TapeNodeView<'t> {
    pub op: Op,
    /// The operands' slots, in operand order.
    pub args: &'t [Slot],
    /// Whether backward computes a gradient for this slot (the loss depends on it).
    pub needs_grad: bool,
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
    slot_of: Vec<u32>,
    /// Counted on first use ([`Tape::consumers`]).
    consumers: OnceLock<Consumers>,
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

/// Who reads each slot: what several planning passes ask of every slot, counted in one walk
/// over the operands ([`Tape::consumers`]).
#[derive(Clone, Debug)]
pub(crate) struct Consumers {
    /// Per slot: the operand positions that read it, plus one per output or loss that names
    /// it (at most 255 counted).
    pub uses: Vec<u8>,
    /// Per slot that takes a gradient ([`Tape::takes_grad`]): the additions compiled backward
    /// makes into it, one per operand position of a node it visits (at most 255 counted); 0
    /// for any other slot.
    pub grad_additions: Vec<u8>,
    /// Per slot: the last node that adds into its gradient (backward's first, in the
    /// interpreter's order), or [`Consumers::NONE`].
    pub last_grad_consumer: Vec<u32>,
}

impl Consumers {
    pub const NONE: u32 = u32::MAX;

    fn of(tape: &Tape) -> Consumers {
        let n = tape.len();
        let mut uses = vec![0u8; n];
        let mut grad_additions = vec![0u8; n];
        let mut last_grad_consumer = vec![Consumers::NONE; n];
        for s in tape.slots() {
            let grad = tape.takes_grad(s);
            for &a in tape.args(s) {
                let i = a.index();
                uses[i] = uses[i].saturating_add(1);
                if grad && tape.takes_grad(a) {
                    grad_additions[i] = grad_additions[i].saturating_add(1);
                    last_grad_consumer[i] = s.0;
                }
            }
        }
        for o in tape.outputs.iter().chain(&tape.loss) {
            uses[o.index()] = uses[o.index()].saturating_add(1);
        }
        Consumers {
            uses,
            grad_additions,
            last_grad_consumer,
        }
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
        let n = g.nodes.len();
        // Per node: whether it is kept, and whether backward reaches it from the loss.
        const LIVE: u8 = 1;
        const GRAD: u8 = 2;
        // (An output or the loss: its gradient is shown.)
        const SHOWN: u8 = 4;
        let mut flags = vec![0u8; n];
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

        // Params, then inputs (each created in index order: param `k` is the `k`-th), then
        // the rest in build order: one forward sweep assigns slots and copies the nodes, whose
        // operands it has already placed.
        let num_params = g.param_init.len();
        let num_inputs = g.num_inputs as usize;
        let leaves = (num_params + num_inputs) as u32;
        let leaf = |op: Op, grad: Grad| TapeNode::new(op, 0, 0, grad);
        let mut nodes = vec![leaf(Op::Const(0.0), Grad::NONE); leaves as usize];
        nodes.reserve(n - leaves as usize);
        let mut args = Vec::with_capacity(g.args.len());
        let mut slot_of = vec![DROPPED; n];
        let is_loss = |i: usize| g.loss.is_some_and(|l| l as usize == i);
        for (i, node) in g.nodes.iter().enumerate() {
            let needs_grad = flags[i] & GRAD != 0;
            slot_of[i] = match node.op {
                Op::Param(k) => {
                    nodes[k as usize] = leaf(node.op, Grad::both(needs_grad));
                    k
                }
                Op::Input(k) => {
                    // An input without a gradient takes none from its users (it may still
                    // be the loss itself).
                    let differentiable = g.input_grad[k as usize] || is_loss(i);
                    let grad = Grad::both(needs_grad && differentiable);
                    nodes[num_params + k as usize] = leaf(node.op, grad);
                    num_params as u32 + k
                }
                _ if flags[i] & LIVE == 0 => DROPPED,
                op => {
                    let args_start = args.len() as u32;
                    args.extend(g.args_of(node).iter().map(|&a| Slot(slot_of[a as usize])));
                    // A constant's gradient feeds nothing: compiled code adds into it only
                    // where it is shown.
                    let takes =
                        needs_grad && (!matches!(op, Op::Const(_)) || flags[i] & SHOWN != 0);
                    let grad = Grad {
                        needs: needs_grad,
                        takes,
                    };
                    nodes.push(TapeNode::new(op, args_start, node.args_len, grad));
                    nodes.len() as u32 - 1
                }
            };
        }
        let tape = Tape {
            graph_id: graph.id(),
            nodes,
            args,
            num_params,
            num_inputs,
            param_init: g.param_init.clone(),
            param_slots: (0..num_params as u32).map(Slot).collect(),
            outputs: g
                .outputs
                .iter()
                .map(|&o| Slot(slot_of[o as usize]))
                .collect(),
            loss: g.loss.map(|l| Slot(slot_of[l as usize])),
            slot_of,
            consumers: OnceLock::new(),
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
        if self.nodes.len() < p + i {
            return Err(bad(0, "fewer slots than params and inputs".into()));
        }
        if self.param_slots.len() != p {
            return Err(bad(
                0,
                format!("{} param slots for {p} params", self.param_slots.len()),
            ));
        }
        for (s, node) in self.nodes.iter().enumerate() {
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
                let operand = self.nodes[a.index()];
                let exempt = matches!(operand.op, Op::Input(_));
                if node.needs_grad() && !operand.needs_grad() && !exempt {
                    return Err(bad(
                        s,
                        format!("operand slot {} is outside the gradient cone", a.0),
                    ));
                }
            }
        }
        for &o in self.outputs.iter().chain(&self.loss) {
            if o.index() >= self.nodes.len() {
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
            if !self.nodes[l.index()].needs_grad() {
                return Err(bad(
                    l.index(),
                    "the loss is outside the gradient cone".into(),
                ));
            }
        }
        Ok(())
    }

    /// Number of slots (= nodes).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// What slot `s` holds, or [`Error::NoSuchSlot`] past the end of the tape.
    pub fn node(&self, s: Slot) -> Result<TapeNodeView<'_>> {
        if s.index() >= self.len() {
            return Err(Error::NoSuchSlot {
                slot: s.0,
                len: self.len(),
            });
        }
        Ok(TapeNodeView {
            op: self.op(s),
            args: self.args(s),
            needs_grad: self.needs_grad(s),
        })
    }

    // The unchecked accessors the passes and backends use: every slot they hold comes from
    // this tape (`Tape::verify`, `Plan::verify`).
    pub(crate) fn op(&self, s: Slot) -> Op {
        self.nodes[s.index()].op
    }

    pub(crate) fn args(&self, s: Slot) -> &[Slot] {
        let n = self.nodes[s.index()];
        &self.args[n.args_start as usize..(n.args_start + n.args_len()) as usize]
    }

    pub(crate) fn needs_grad(&self, s: Slot) -> bool {
        self.nodes[s.index()].needs_grad()
    }

    /// Whether compiled code adds into `s`'s gradient: where it needs one, but for a
    /// constant's that is neither an output nor the loss. A constant's gradient feeds
    /// nothing, and one made per use (`x * 0.5`, as micrograd makes them) would cost a
    /// derivative, a store and the other operand's value kept for it, at every use. The
    /// interpreter still adds into it, as micrograd does; a compiled program does not keep
    /// it ([`crate::Program::is_kept`]) and recomputes it where every gradient is asked for
    /// ([`crate::Program::every_value_and_grad`]).
    pub(crate) fn takes_grad(&self, s: Slot) -> bool {
        self.nodes[s.index()].takes_grad()
    }

    /// Whether `s` needs a gradient that compiled code never adds into ([`Tape::takes_grad`]):
    /// one a compiled program does not keep, so nothing needs to write it (false past the
    /// tape's end). The one place that says so.
    pub(crate) fn drops_grad(&self, s: Slot) -> bool {
        (self.nodes.get(s.index())).is_some_and(|n| n.needs_grad() && !n.takes_grad())
    }

    /// All slots in forward order.
    pub fn slots(&self) -> impl DoubleEndedIterator<Item = Slot> + ExactSizeIterator {
        (0..self.nodes.len() as u32).map(Slot)
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
        let moved = |s: Slot| {
            if s.index() < p {
                Slot(to[s.index()])
            } else {
                s
            }
        };
        move_params(&mut self.nodes, from);
        for a in self
            .args
            .iter_mut()
            .chain(&mut self.param_slots)
            .chain(&mut self.outputs)
            .chain(&mut self.loss)
        {
            *a = moved(*a);
        }
        for s in self.slot_of.iter_mut().filter(|s| **s != DROPPED) {
            *s = moved(Slot(*s)).0;
        }
        if let Some(c) = self.consumers.get_mut() {
            // Params read nothing: only their own entries move.
            move_params(&mut c.uses, from);
            move_params(&mut c.grad_additions, from);
            move_params(&mut c.last_grad_consumer, from);
        }
        // Every tape is verified when it is made, and permuting the params among their own
        // slots keeps every invariant: param `k` is where `param_slots[k]` says, operands
        // still precede their users (params precede every node that has operands), and no
        // node's gradient cone changes. So the tape is not walked again.
        debug_assert!(self.verify().is_ok());
        Ok(self)
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
        match self.slot_of.get(v.id() as usize) {
            Some(&s) if s != DROPPED => Ok(Slot(s)),
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
            assert_eq!((node.op, node.args), (Op::Sum, &want[..]));
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
}
