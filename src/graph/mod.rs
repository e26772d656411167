//! The graph builder: micrograd's API over an arena.
//!
//! A [`Value`] is a cheap `Copy` handle (graph reference + node id). Building a value appends a
//! node to its graph's arena, so operands always precede their users: the arena is already in
//! topological order, and nothing here (or later) needs recursion. As nodes are appended, the
//! graph notes where they copy the ones before them (`copies.rs`).

mod copies;

use std::borrow::Borrow;
use std::cell::RefCell;
use std::fmt;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::op::Op;
pub(crate) use copies::{Arena, CopyRuns};

/// Index of a node in its graph's arena.
pub type NodeId = u32;

/// A node of the arena: an op and its operands, `args[start..start + len]` of the graph.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node {
    pub op: Op,
    pub args_start: u32,
    pub args_len: u32,
}

impl Node {
    /// Its operands, among the arena's `args`.
    pub fn args<'a>(&self, args: &'a [NodeId]) -> &'a [NodeId] {
        &args[self.args_start as usize..(self.args_start + self.args_len) as usize]
    }
}

/// The arena behind a [`Graph`]. Read by the tape builder; never exposed.
#[derive(Default)]
pub(crate) struct GraphData {
    pub nodes: Vec<Node>,
    pub args: Vec<NodeId>,
    pub num_inputs: u32,
    /// Per input, in creation order: whether backward computes its gradient.
    pub input_grad: Vec<bool>,
    pub param_init: Vec<f64>,
    pub outputs: Vec<NodeId>,
    pub loss: Option<NodeId>,
    /// The first misuse seen while building through operators (which cannot return errors);
    /// reported by compilation.
    pub poison: Option<Error>,
    /// Where the arena repeats itself: a batch's copies.
    pub copy_runs: CopyRuns,
}

impl GraphData {
    pub fn args_of(&self, node: &Node) -> &[NodeId] {
        node.args(&self.args)
    }

    pub fn arena(&self) -> Arena<'_> {
        Arena {
            nodes: &self.nodes,
            args: &self.args,
        }
    }
}

/// A scalar computation graph with micrograd's semantics.
///
/// ```
/// use tapejit::Graph;
/// let g = Graph::new();
/// let x = g.input();
/// let w = g.param(0.5);
/// let y = (w * x + 1.0).tanh();
/// g.set_loss(y).unwrap();
/// ```
pub struct Graph {
    id: u64,
    pub(crate) data: RefCell<GraphData>,
}

static NEXT_GRAPH_ID: AtomicU64 = AtomicU64::new(1);

impl Default for Graph {
    fn default() -> Self {
        Self::new()
    }
}

impl Graph {
    pub fn new() -> Graph {
        Graph {
            id: NEXT_GRAPH_ID.fetch_add(1, Ordering::Relaxed),
            data: RefCell::new(GraphData::default()),
        }
    }

    /// A process-unique id, used to tell graphs apart in errors.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Number of nodes built so far.
    pub fn len(&self) -> usize {
        self.data.borrow().nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A new input; inputs are numbered in creation order and set before each run. As in
    /// micrograd, backward computes its gradient.
    pub fn input(&self) -> Value<'_> {
        self.new_input(true)
    }

    /// `n` new inputs.
    pub fn inputs(&self, n: usize) -> Vec<Value<'_>> {
        (0..n).map(|_| self.input()).collect()
    }

    /// A new input whose gradient backward does not compute (it stays 0; only if the input
    /// is itself the loss does it get the loss's 1), like a tensor without `requires_grad`
    /// in PyTorch: data such as pixels, whose gradient training never reads. On an MLP that
    /// saves a third of backward's arithmetic in the first layer.
    pub fn input_without_grad(&self) -> Value<'_> {
        self.new_input(false)
    }

    /// `n` new inputs without gradient.
    pub fn inputs_without_grad(&self, n: usize) -> Vec<Value<'_>> {
        (0..n).map(|_| self.input_without_grad()).collect()
    }

    fn new_input(&self, grad: bool) -> Value<'_> {
        let n = {
            let mut d = self.data.borrow_mut();
            d.num_inputs += 1;
            d.input_grad.push(grad);
            d.num_inputs - 1
        };
        self.push(Op::Input(n), &[])
    }

    /// A new trainable parameter with its initial value; params are numbered in creation order.
    /// A NaN or infinite one is [`Error::NonFinite`] where the graph is compiled or
    /// interpreted, as `Program::set_params` refuses one.
    pub fn param(&self, init: f64) -> Value<'_> {
        let n = {
            let mut d = self.data.borrow_mut();
            d.param_init.push(init);
            let n = d.param_init.len() as u32 - 1;
            // A NaN or infinite param is refused as `set_params` refuses one: compiling or
            // interpreting the graph is the error.
            if !init.is_finite() {
                d.poison.get_or_insert(Error::NonFinite {
                    what: "param",
                    index: n as usize,
                    value: init,
                });
            }
            n
        };
        self.push(Op::Param(n), &[])
    }

    pub fn constant(&self, c: f64) -> Value<'_> {
        self.push(Op::Const(c), &[])
    }

    /// `((v0 + v1) + v2) + ...` as one node; the empty sum is the constant 0.
    ///
    /// Takes a slice, a `Vec` or any iterator of values:
    /// `g.sum(&terms)`, `g.sum(xs.iter().map(|&x| x * x))`.
    pub fn sum<'v, I>(&self, values: I) -> Value<'_>
    where
        I: IntoIterator,
        I::Item: Borrow<Value<'v>>,
    {
        let ids: Vec<NodeId> = values
            .into_iter()
            .map(|v| self.own_id(*v.borrow(), "sum"))
            .collect();
        if ids.is_empty() {
            return self.constant(0.0);
        }
        self.push_ids(Op::Sum, &ids)
    }

    /// `op` applied to `operands`: the one constructor behind every operator and method
    /// of [`Value`], for code that picks ops at run time (generated graphs, bindings).
    /// `Const` takes no operands; inputs and params come from [`Graph::input`] and
    /// [`Graph::param`], which number them. Values of another graph are reported when the
    /// graph is compiled, as for the operators.
    pub fn apply(&self, op: Op, operands: &[Value<'_>]) -> Result<Value<'_>> {
        if matches!(op, Op::Input(_) | Op::Param(_)) {
            return Err(Error::LeafOp { op: op.name() });
        }
        let fits = match op.arity() {
            Some(n) => operands.len() == n,
            None => !operands.is_empty(),
        };
        if !fits {
            return Err(Error::Arity {
                op: op.name(),
                expected: op.arity(),
                got: operands.len(),
            });
        }
        Ok(self.push(op, operands))
    }

    /// Marks `v` as an output: its value is computed by `forward`. Returns the output's index.
    pub fn add_output(&self, v: Value<'_>) -> Result<usize> {
        let id = self.check_own(v, "add_output")?;
        let mut d = self.data.borrow_mut();
        d.outputs.push(id);
        Ok(d.outputs.len() - 1)
    }

    /// Makes `v` the loss that `backward` differentiates (replacing any earlier loss).
    pub fn set_loss(&self, v: Value<'_>) -> Result<()> {
        let id = self.check_own(v, "set_loss")?;
        self.data.borrow_mut().loss = Some(id);
        Ok(())
    }

    pub fn num_inputs(&self) -> usize {
        self.data.borrow().num_inputs as usize
    }

    pub fn num_params(&self) -> usize {
        self.data.borrow().param_init.len()
    }

    pub(crate) fn check_own(&self, v: Value<'_>, context: &'static str) -> Result<NodeId> {
        if v.graph.id == self.id {
            Ok(v.id)
        } else {
            Err(Error::ForeignValue {
                node: v.id,
                value_graph: v.graph.id,
                graph: self.id,
                context,
            })
        }
    }

    /// The id of `v` in this graph; a foreign value poisons the graph and stands in as node 0,
    /// so the arena stays well-formed until compilation reports the error.
    fn own_id(&self, v: Value<'_>, context: &'static str) -> NodeId {
        self.check_own(v, context).unwrap_or_else(|e| {
            self.data.borrow_mut().poison.get_or_insert(e);
            0
        })
    }

    fn push(&self, op: Op, args: &[Value<'_>]) -> Value<'_> {
        // (Most ops take one or two operands: their ids need no allocation.)
        let mut few = [0; 2];
        let mut many = Vec::new();
        let ids = match few.get_mut(..args.len()) {
            Some(ids) => ids,
            None => {
                many.resize(args.len(), 0);
                &mut many
            }
        };
        for (id, &v) in ids.iter_mut().zip(args) {
            *id = self.own_id(v, op.name());
        }
        self.push_ids(op, ids)
    }

    fn push_ids(&self, op: Op, ids: &[NodeId]) -> Value<'_> {
        let mut d = self.data.borrow_mut();
        let id = d.nodes.len() as NodeId;
        let args_start = d.args.len() as u32;
        d.args.extend_from_slice(ids);
        d.nodes.push(Node {
            op,
            args_start,
            args_len: ids.len() as u32,
        });
        let GraphData {
            nodes,
            args,
            copy_runs,
            ..
        } = &mut *d;
        copy_runs.push(Arena { nodes, args }, id);
        Value { graph: self, id }
    }
}

/// A scalar of a [`Graph`]: a cheap handle, `Copy`, combined with `+ - * /` and the methods
/// below exactly as in micrograd. Values of different graphs cannot be combined: doing so is
/// reported as [`Error::ForeignValue`] when the graph is compiled.
#[derive(Clone, Copy)]
pub struct Value<'g> {
    graph: &'g Graph,
    id: NodeId,
}

impl fmt::Debug for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Value(graph {}, #{})", self.graph.id, self.id)
    }
}

impl<'g> Value<'g> {
    /// The node's index in its graph's arena.
    pub fn id(self) -> NodeId {
        self.id
    }

    pub fn graph(self) -> &'g Graph {
        self.graph
    }

    fn unary(self, op: Op) -> Value<'g> {
        self.graph.push(op, &[self])
    }

    fn binary(self, op: Op, other: Value<'_>) -> Value<'g> {
        self.graph.push(op, &[self, other])
    }

    /// `self ** c` for a constant exponent.
    pub fn powf(self, c: f64) -> Value<'g> {
        self.unary(Op::Powf(c))
    }
    pub fn exp(self) -> Value<'g> {
        self.unary(Op::Exp)
    }
    /// Natural logarithm.
    pub fn log(self) -> Value<'g> {
        self.unary(Op::Log)
    }
    /// tapejit's `tanh` ([`crate::op::tanh`]: a formula of ours, within 1.3 ULP, the same on
    /// every backend).
    pub fn tanh(self) -> Value<'g> {
        self.unary(Op::Tanh)
    }
    /// `0 if self < 0 else self`.
    pub fn relu(self) -> Value<'g> {
        self.unary(Op::Relu)
    }
    /// The larger of the two; the gradient flows to the one picked (`self` on ties).
    pub fn max(self, other: Value<'_>) -> Value<'g> {
        self.binary(Op::Max, other)
    }
    /// `1 / (1 + exp(-self))`.
    pub fn sigmoid(self) -> Value<'g> {
        self.unary(Op::Sigmoid)
    }
    /// `log(1 + exp(self))`, computed stably ([`Op::Softplus`]): finite for any finite
    /// `self`, `self` itself for large ones; its derivative is `sigmoid(self)`.
    pub fn softplus(self) -> Value<'g> {
        self.unary(Op::Softplus)
    }
    /// `log(1 + self)`, accurate near 0 (libm's `log1p`).
    pub fn log1p(self) -> Value<'g> {
        self.unary(Op::Log1p)
    }
    /// `|self|` (`+0` for `-0`); the derivative is `sign(self)`, 0 at 0.
    pub fn abs(self) -> Value<'g> {
        self.unary(Op::Abs)
    }
    pub fn sin(self) -> Value<'g> {
        self.unary(Op::Sin)
    }
    pub fn cos(self) -> Value<'g> {
        self.unary(Op::Cos)
    }
    /// The square root: the very numbers of `self.powf(0.5)`, value and derivative.
    pub fn sqrt(self) -> Value<'g> {
        self.unary(Op::Sqrt)
    }
    /// The smaller of the two; the gradient flows to the one picked (`self` on ties, as
    /// [`Value::max`]).
    pub fn min(self, other: Value<'_>) -> Value<'g> {
        self.binary(Op::Min, other)
    }
}

impl<'g> Neg for Value<'g> {
    type Output = Value<'g>;
    fn neg(self) -> Value<'g> {
        self.unary(Op::Neg)
    }
}

/// `Value op Value`, `Value op f64`, `f64 op Value` and `Value op= ...` for one operator;
/// an `f64` becomes a constant node of the value's graph.
macro_rules! binary_operator {
    ($Trait:ident, $method:ident, $AssignTrait:ident, $assign:ident, $op:expr) => {
        impl<'g> $Trait<Value<'g>> for Value<'g> {
            type Output = Value<'g>;
            fn $method(self, rhs: Value<'g>) -> Value<'g> {
                self.binary($op, rhs)
            }
        }
        impl<'g> $Trait<f64> for Value<'g> {
            type Output = Value<'g>;
            fn $method(self, rhs: f64) -> Value<'g> {
                self.binary($op, self.graph.constant(rhs))
            }
        }
        impl<'g> $Trait<Value<'g>> for f64 {
            type Output = Value<'g>;
            fn $method(self, rhs: Value<'g>) -> Value<'g> {
                rhs.graph.constant(self).binary($op, rhs)
            }
        }
        impl<'g> $AssignTrait<Value<'g>> for Value<'g> {
            fn $assign(&mut self, rhs: Value<'g>) {
                *self = self.binary($op, rhs);
            }
        }
        impl<'g> $AssignTrait<f64> for Value<'g> {
            fn $assign(&mut self, rhs: f64) {
                *self = self.binary($op, self.graph.constant(rhs));
            }
        }
    };
}

binary_operator!(Add, add, AddAssign, add_assign, Op::Add);
binary_operator!(Sub, sub, SubAssign, sub_assign, Op::Sub);
binary_operator!(Mul, mul, MulAssign, mul_assign, Op::Mul);
binary_operator!(Div, div, DivAssign, div_assign, Op::Div);
