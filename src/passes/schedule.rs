//! The schedule: loop recovery's output (`passes::loops`), the tape as the lowering walks it.
//! Straight-line ranges and loops cover every non-leaf slot exactly once, in slot order:
//!
//! - [`MapLoop`]: a run of nodes with the same op whose own slots and every operand's slots
//!   are affine in the run index `t` (`base + stride * t`), separated only by leaves.
//! - [`SumLoop`]: a `sum` whose operands after the first are affine.
//! - [`DotLoop`]: a map of `mul` and the sum that alone reads its products (its last terms),
//!   fused (the products stay in registers).
//! - [`Nest`]: a sequence of such loops (and single nodes between them) repeated with every
//!   slot advancing by a constant per repetition: a layer, neuron after neuron.
//!
//! [`Item::accesses`] is the one answer to "which slots does this item read and write".
//!
//! **Invariant (exactness):** a loop performs its nodes' operations in the interpreter's
//! order: forward by increasing `t` (and nest repetition `j`), backward by decreasing `t`
//! and `j` with a nest's body reversed, each node's operand gradients in operand order, a
//! sum's operands left to right. Because a run contains no
//! other non-leaf node, nothing else interleaves, so results are bit-identical to the
//! straight-line walk whatever the backend does within IEEE semantics.

use std::ops::Range;

use crate::op::Op;
use crate::tape::Slot;

/// How deep nests may nest: a loop in a nest in a nest ... ([`Affine::outer`] has one
/// coefficient per level).
pub const MAX_NEST_DEPTH: usize = 4;

/// Slot `base + stride * t + outer[0] * j0 + outer[1] * j1 + ...` of iteration `t` of a loop,
/// in repetition `j0` of the outermost [`Nest`] around it, `j1` of the next one in, and so
/// on to the innermost (all `j` are 0 outside nests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Affine {
    pub base: i64,
    pub stride: i64,
    /// Per enclosing nest, outermost first: how far the slot moves per repetition.
    pub outer: [i64; MAX_NEST_DEPTH],
}

impl Affine {
    /// Slot `s` in every iteration.
    pub fn fixed(s: Slot) -> Affine {
        Affine {
            base: s.0 as i64,
            stride: 0,
            outer: [0; MAX_NEST_DEPTH],
        }
    }

    /// The slot in iteration `t` of repetition 0 of every nest around.
    pub fn at(self, t: u32) -> Slot {
        Slot((self.base + self.stride * t as i64) as u32)
    }

    /// `counts` (repetitions of the nests around, outermost first) with each level this
    /// sequence does not move along cut to one repetition (where it has any): every
    /// repetition of such a level reaches the same slots (a weight the copies of a batch
    /// share, read once per copy).
    pub fn moving_counts(&self, counts: &[u32]) -> Vec<u32> {
        (counts.iter().zip(&self.outer))
            .map(|(&count, &step)| if step == 0 { count.min(1) } else { count })
            .collect()
    }

    /// The sequence in repetition `js` of the nests around (outermost first; missing
    /// levels are 0), those nests removed.
    pub fn in_repetition(self, js: &[u32]) -> Affine {
        let across: i64 = self.outer.iter().zip(js).map(|(&o, &j)| o * j as i64).sum();
        Affine {
            base: self.base + across,
            stride: self.stride,
            outer: [0; MAX_NEST_DEPTH],
        }
    }

    /// The slot in iteration `t`, repetition `j` of its nest (of the outermost one, if
    /// nests nest; 0 of any other).
    pub fn at_nested(self, t: u32, j: u32) -> Slot {
        self.at_levels(t, &[j])
    }

    /// The slot in iteration `t`, repetition `js[0]` of the outermost nest, `js[1]` of the
    /// next one in, ... (missing levels are 0).
    pub fn at_levels(self, t: u32, js: &[u32]) -> Slot {
        self.in_repetition(js).at(t)
    }

    /// The slots of iterations `0..len` in repetition `js` of the nests around (the
    /// repetition located once, not per iteration).
    pub fn slots_in(self, js: &[u32], len: u32) -> impl Iterator<Item = Slot> {
        let a = self.in_repetition(js);
        (0..len).map(move |t| a.at(t))
    }

    /// The same sequence inside a new outermost nest, each of whose repetitions moves it by
    /// `step`.
    pub fn nested(self, step: i64) -> Affine {
        let mut outer = [0; MAX_NEST_DEPTH];
        outer[0] = step;
        outer[1..].copy_from_slice(&self.outer[..MAX_NEST_DEPTH - 1]);
        Affine { outer, ..self }
    }

    /// The same sequence in repetition `j` of its outermost nest, as seen outside that nest.
    pub fn unnested(self, j: i64) -> Affine {
        self.unnested_at(0, j)
    }

    /// The same sequence in repetition `j` of the nest at `level` (0: the outermost), that
    /// nest removed.
    pub fn unnested_at(self, level: usize, j: i64) -> Affine {
        let mut outer = self.outer;
        outer.copy_within(level + 1.., level);
        outer[MAX_NEST_DEPTH - 1] = 0;
        Affine {
            base: self.base + self.outer[level] * j,
            stride: self.stride,
            outer,
        }
    }

    /// The lowest and highest slot of iterations `0..len` in every repetition `js < counts`
    /// of the nests around (outermost first; missing levels are 0). A linear form is
    /// extreme at the corners of its box, so no slot is enumerated.
    pub fn bounds(self, len: u32, counts: &[u32]) -> (i64, i64) {
        let (mut lo, mut hi) = (self.base, self.base);
        let extents = std::iter::once((self.stride, len))
            .chain(self.outer.iter().copied().zip(counts.iter().copied()));
        for (coefficient, n) in extents {
            let reach = coefficient * (n.max(1) as i64 - 1);
            lo += reach.min(0);
            hi += reach.max(0);
        }
        (lo, hi)
    }

    /// The span between the extreme slots of iterations `0..len` of nest iterations
    /// `0..count`.
    pub fn span(self, len: u32, count: u32) -> Range<u32> {
        let (lo, hi) = self.bounds(len, &[count]);
        lo as u32..hi as u32 + 1
    }

    /// The affine sequence through `first` and `second`.
    pub(super) fn through(first: Slot, second: Slot) -> Affine {
        Affine {
            base: first.0 as i64,
            stride: second.0 as i64 - first.0 as i64,
            outer: [0; MAX_NEST_DEPTH],
        }
    }
}

/// `len` nodes of one op at slots `out.at(t)`, operand `k` of iteration `t` at
/// `args[k].at(t)`.
#[derive(Clone, Debug, PartialEq)]
pub struct MapLoop {
    pub op: Op,
    pub out: Affine,
    pub args: Vec<Affine>,
    pub len: u32,
    /// Whether backward visits these nodes (the same for all of them).
    pub needs_grad: bool,
    /// Per operand: whether it takes a gradient (an input may not).
    pub grad_args: Vec<bool>,
}

/// The `sum` at `slot`: `first + tail.at(0) + ... + tail.at(tail_len - 1)`, left to right.
#[derive(Clone, Debug, PartialEq)]
pub struct SumLoop {
    pub slot: Affine,
    pub first: Affine,
    pub tail: Affine,
    pub tail_len: u32,
    pub needs_grad: bool,
    /// Whether `first`, and the tail, take gradients (an input may not).
    pub grad_first: bool,
    pub grad_tail: bool,
    /// Where the tape adds the terms one `add` at a time (`s = s + w * x`, micrograd's
    /// `sum(..., b)`): the partial sum after term `t` at `links.at(t)`, the last being
    /// `slot`; each read by the next link only, so the loop keeps them in registers and
    /// their slots are not kept, as a dot's products are not. `None`: one n-ary `sum` node.
    pub links: Option<Affine>,
}

impl SumLoop {
    /// Tape nodes that compute the sum: its links, or the one `sum`.
    pub fn nodes(&self) -> u32 {
        match self.links {
            Some(_) => self.tail_len,
            None => 1,
        }
    }
}

/// A sum over products that nothing else reads, fused: `sum.slot = first + a(0) * b(0) +
/// a(1) * b(1) + ...` with `a`, `b` the operands of `products` (a map of `mul`). The same
/// operations in the same order as the two loops, but the products never reach memory:
/// their slots are not kept ([`crate::plan::buffers::kept`]). The products are the sum's last terms;
/// [`DotLoop::head`] terms before them are other items' values, read as a sum's tail is (a
/// recurrent cell's sum adds its few input terms, then a map over the state).
#[derive(Clone, Debug, PartialEq)]
pub struct DotLoop {
    pub products: MapLoop,
    pub sum: SumLoop,
}

impl DotLoop {
    /// How many of the sum's tail terms come before the products.
    pub fn head(&self) -> u32 {
        self.sum.tail_len.saturating_sub(self.products.len)
    }

    /// Whether the sum's tail ends with exactly the products (what [`DotLoop::head`] and
    /// the emitter assume).
    pub fn sums_its_products(&self) -> bool {
        ends_with(&self.sum, &self.products)
    }
}

/// Whether `sum`'s tail ends with exactly the outputs of `products`.
pub(super) fn ends_with(sum: &SumLoop, products: &MapLoop) -> bool {
    let Some(head) = sum.tail_len.checked_sub(products.len) else {
        return false;
    };
    let tail = sum.tail;
    let last = Affine {
        base: tail.base + tail.stride * head as i64,
        ..tail
    };
    last == products.out
}

/// `count` repetitions of `body`, whose slots advance by each [`Affine::outer`] per
/// repetition: a layer of neurons, each one a map and a sum and an activation. How it runs
/// (in lanes, in which order) is the plan's to say, under its `id` ([`crate::plan::NestPlan`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Nest {
    pub count: u32,
    /// Loops, single nodes (maps of one), and nests: one repetition, in tape order.
    pub body: Vec<Item>,
    pub id: NestId,
}

/// A nest's number in its schedule, each nest's its own ([`Schedule::nests`]); what the
/// plan decides for a nest it keeps under this number. A nest made from another (a
/// repetition of the nest around it, its first repetitions) keeps the number: the same
/// decisions hold for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NestId(pub u32);

/// One step of the lowered program, in tape order.
#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    /// Straight-line nodes: the non-leaf slots of the range. Never in a nest's body (there a
    /// straight-line run is a sequence of maps of one node each).
    Straight(Range<u32>),
    Map(MapLoop),
    /// Boxed, as the dot: items are a tape's worth of single nodes before structure
    /// recovery nests them, and an item is as large as its largest variant.
    Sum(Box<SumLoop>),
    Dot(Box<DotLoop>),
    Nest(Nest),
    /// Operands `args` of the straight-line `sum` at `slot`, added to what earlier parts
    /// summed (the first part starts from its first operand): the plan cuts a sum too wide
    /// for one function into parts ([`crate::plan`]); loop recovery never makes them.
    SumPart {
        slot: Slot,
        args: Range<u32>,
    },
}

/// Slots `at.at_levels(t, js)` for `t` in `0..len` and every repetition `js` of the nests
/// around an item, and what the item does with them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Access {
    pub at: Affine,
    pub len: u32,
    pub kind: AccessKind,
}

impl Access {
    /// Calls `f` on every slot the access reaches inside nests of `counts` repetitions
    /// (outermost first): once per repetition of the nests it moves along
    /// ([`Affine::moving_counts`]), so a slot every copy of a batch reads is told of once.
    pub fn for_each_slot(&self, counts: &[u32], f: impl FnMut(Slot)) {
        self.for_each_slot_in(&self.at.moving_counts(counts), f);
    }

    /// Calls `f` on every slot the access reaches in every repetition of nests of `counts`
    /// repetitions (outermost first), as many as they are.
    pub fn for_each_slot_in(&self, counts: &[u32], mut f: impl FnMut(Slot)) {
        every_repetition(counts, |js| {
            self.at.slots_in(js, self.len).for_each(&mut f);
            true
        });
    }
}

/// Whether `f(t, js)` holds for every iteration `t < len` of a loop in every repetition `js`
/// of nests of `counts` repetitions (outermost first), stopping at the first that does not.
pub fn every_iteration(counts: &[u32], len: u32, mut f: impl FnMut(u32, &[u32]) -> bool) -> bool {
    every_repetition(counts, |js| (0..len).all(|t| f(t, js)))
}

/// Whether `f(js)` holds for every repetition `js` of nests of `counts` repetitions
/// (outermost first), stopping at the first that does not: [`every_iteration`] for callers that
/// walk a repetition's iterations themselves. Nests of no repetitions have none.
pub fn every_repetition(counts: &[u32], mut f: impl FnMut(&[u32]) -> bool) -> bool {
    if counts.contains(&0) {
        return true;
    }
    let mut js = vec![0u32; counts.len()];
    loop {
        if !f(&js) {
            return false;
        }
        // The next repetition, the first level fastest.
        let mut level = 0;
        while level < counts.len() {
            js[level] += 1;
            if js[level] < counts[level] {
                break;
            }
            js[level] = 0;
            level += 1;
        }
        if level == counts.len() {
            return true;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// Forward writes the values (and backward reads their gradients, if `grad`).
    Writes { grad: bool },
    /// Forward reads the values; backward adds into their gradients if `grad`.
    Reads { grad: bool },
}

/// The tape as the lowering walks it: straight-line ranges and loops, covering every non-leaf
/// slot exactly once, in slot order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    pub items: Vec<Item>,
    /// How many nests the items hold, at any depth: their [`NestId`]s are `0..nests`.
    pub nests: u32,
    /// Loops made.
    pub loops: usize,
    /// Tape nodes the loops cover.
    pub loop_nodes: usize,
}

/// Numbers the nests of `items` (at any depth, in tape order, a nest before those in its
/// body) `0..`, returning how many there are: recovery's last step, so every nest of a
/// schedule has its own [`NestId`].
pub(super) fn number_nests(items: &mut [Item]) -> u32 {
    fn visit(items: &mut [Item], next: &mut u32) {
        for item in items {
            if let Item::Nest(nest) = item {
                nest.id = NestId(*next);
                *next += 1;
                visit(&mut nest.body, next);
            }
        }
    }
    let mut next = 0;
    visit(items, &mut next);
    next
}

impl Item {
    /// Tape nodes the item covers (0 for straight-line code).
    pub fn loop_nodes(&self) -> usize {
        match self {
            Item::Straight(_) | Item::SumPart { .. } => 0,
            Item::Map(m) => m.len as usize,
            Item::Sum(s) => s.nodes() as usize,
            Item::Dot(d) => d.products.len as usize + d.sum.nodes() as usize,
            Item::Nest(n) => n.count as usize * n.body.iter().map(Item::loop_nodes).sum::<usize>(),
        }
    }

    /// The item as the flat sequence of items it stands for: a nest unrolled into its
    /// repetitions (recursively), anything else as it is.
    #[cfg(test)]
    pub fn flattened(&self) -> Vec<Item> {
        let mut out = Vec::new();
        let _ = self.try_for_each_flat(&mut |item, js| {
            let mut flat = item.clone();
            for &j in js {
                flat = iteration(&flat, j as i64);
            }
            out.push(flat);
            Ok::<(), ()>(())
        });
        out
    }

    /// Calls `f` on each item of the flat sequence the item stands for (a nest unrolled
    /// into its repetitions, recursively) in order, until it fails, as the body item it
    /// repeats and its repetition `js` of every nest around it (outermost first:
    /// its slots are `Affine::at_levels(t, js)`). Nothing is built: a rollout's nest stands
    /// for hundreds of thousands of items.
    pub fn try_for_each_flat<E>(
        &self,
        f: &mut impl FnMut(&Item, &[u32]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.try_for_each_flat_in(&mut Vec::new(), f)
    }

    fn try_for_each_flat_in<E>(
        &self,
        js: &mut Vec<u32>,
        f: &mut impl FnMut(&Item, &[u32]) -> Result<(), E>,
    ) -> Result<(), E> {
        match self {
            Item::Nest(n) => {
                js.push(0);
                for j in 0..n.count {
                    *js.last_mut().expect("pushed") = j;
                    for b in &n.body {
                        b.try_for_each_flat_in(js, f)?;
                    }
                }
                js.pop();
                Ok(())
            }
            other => f(other, js),
        }
    }

    /// Loops the item lowers to.
    pub fn loops(&self) -> usize {
        match self {
            Item::Straight(_) | Item::SumPart { .. } => 0,
            // A map of one node is no loop.
            Item::Map(m) => (m.len > 1) as usize,
            Item::Sum(_) | Item::Dot(_) => 1,
            Item::Nest(n) => 1 + n.body.iter().map(Item::loops).sum::<usize>(),
        }
    }

    /// How deep its nests nest (0 for anything but a nest).
    pub fn depth(&self) -> usize {
        match self {
            Item::Nest(n) => 1 + n.body.iter().map(Item::depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    /// The slots a loop item reads and writes, in one place for every pass that asks: the
    /// value it writes first, then its operands in operand order. A nest answers for its body
    /// (the `Affine`s of its items have the nest's level); straight-line code answers nothing
    /// (the tape says what it reads).
    pub fn accesses(&self) -> Vec<Access> {
        let writes = |at, len, grad| Access {
            at,
            len,
            kind: AccessKind::Writes { grad },
        };
        let reads = |at, len, grad| Access {
            at,
            len,
            kind: AccessKind::Reads { grad },
        };
        match self {
            Item::Map(m) => std::iter::once(writes(m.out, m.len, m.needs_grad))
                .chain(
                    m.args
                        .iter()
                        .zip(&m.grad_args)
                        .map(|(&a, &g)| reads(a, m.len, g && m.needs_grad)),
                )
                .collect(),
            Item::Sum(s) => vec![
                writes(s.slot, 1, s.needs_grad),
                reads(s.first, 1, s.grad_first && s.needs_grad),
                reads(s.tail, s.tail_len, s.grad_tail && s.needs_grad),
            ],
            // The products live in registers: only their operands are accessed (and the
            // terms before them).
            Item::Dot(d) => {
                let (m, s) = (&d.products, &d.sum);
                let head =
                    (d.head() > 0).then(|| reads(s.tail, d.head(), s.grad_tail && s.needs_grad));
                vec![
                    writes(s.slot, 1, s.needs_grad),
                    reads(s.first, 1, s.grad_first && s.needs_grad),
                ]
                .into_iter()
                .chain(head)
                .chain(
                    m.args
                        .iter()
                        .zip(&m.grad_args)
                        .map(|(&a, &g)| reads(a, m.len, g && s.needs_grad)),
                )
                .collect()
            }
            Item::Nest(n) => n.body.iter().flat_map(Item::accesses).collect(),
            Item::Straight(_) | Item::SumPart { .. } => Vec::new(),
        }
    }

    /// [`Item::accesses`] of a top-level item, each with the repetition counts of the nests
    /// around it, outermost first.
    pub fn nested_accesses(&self) -> Vec<(Access, Vec<u32>)> {
        fn visit(item: &Item, counts: &[u32], out: &mut Vec<(Access, Vec<u32>)>) {
            match item {
                Item::Nest(n) => {
                    let inner: Vec<u32> = counts.iter().copied().chain([n.count]).collect();
                    for b in &n.body {
                        visit(b, &inner, out);
                    }
                }
                _ => out.extend(item.accesses().into_iter().map(|a| (a, counts.to_vec()))),
            }
        }
        let mut out = Vec::new();
        visit(self, &[], &mut out);
        out
    }

    /// Calls `f` on every [`Affine`] of the item (a nest's body's too), in
    /// [`Item::map_affines`] order.
    pub fn for_each_affine(&self, f: &mut impl FnMut(&Affine)) {
        let map = |m: &MapLoop, f: &mut dyn FnMut(&Affine)| {
            f(&m.out);
            m.args.iter().for_each(&mut *f);
        };
        let sum = |s: &SumLoop, f: &mut dyn FnMut(&Affine)| {
            f(&s.slot);
            f(&s.first);
            f(&s.tail);
            s.links.iter().for_each(&mut *f);
        };
        match self {
            Item::Map(m) => map(m, f),
            Item::Sum(s) => sum(s, f),
            Item::Dot(d) => {
                map(&d.products, f);
                sum(&d.sum, f);
            }
            Item::Nest(n) => n.body.iter().for_each(|b| b.for_each_affine(f)),
            Item::Straight(_) | Item::SumPart { .. } => {}
        }
    }

    /// The same item with every [`Affine`] (a nest's body's too) replaced by `f` of it and
    /// the length of its sequence along `t`.
    pub fn map_affines(&self, f: &mut impl FnMut(Affine, u32) -> Affine) -> Item {
        // Field by field: `..m.clone()` would clone the vectors (and a nest's whole body)
        // only to drop them.
        let map = |m: &MapLoop, f: &mut dyn FnMut(Affine, u32) -> Affine| MapLoop {
            op: m.op,
            out: f(m.out, m.len),
            args: m.args.iter().map(|&a| f(a, m.len)).collect(),
            len: m.len,
            needs_grad: m.needs_grad,
            grad_args: m.grad_args.clone(),
        };
        let sum = |s: &SumLoop, f: &mut dyn FnMut(Affine, u32) -> Affine| SumLoop {
            slot: f(s.slot, 1),
            first: f(s.first, 1),
            tail: f(s.tail, s.tail_len),
            links: s.links.map(|l| f(l, s.tail_len)),
            ..*s
        };
        match self {
            Item::Map(m) => Item::Map(map(m, f)),
            Item::Sum(s) => Item::Sum(Box::new(sum(s, f))),
            Item::Dot(d) => Item::Dot(Box::new(DotLoop {
                products: map(&d.products, f),
                sum: sum(&d.sum, f),
            })),
            Item::Nest(n) => Item::Nest(Nest {
                count: n.count,
                body: n.body.iter().map(|b| b.map_affines(f)).collect(),
                id: n.id,
            }),
            Item::Straight(_) | Item::SumPart { .. } => self.clone(),
        }
    }
}

/// Repetition `j` of a nest's body item, as the item it stands for one nest level out.
pub fn iteration(item: &Item, j: i64) -> Item {
    item.map_affines(&mut |a, _| a.unnested(j))
}
