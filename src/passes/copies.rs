//! Copies: a batch written as copies of one subgraph, found without scanning every copy.
//!
//! micrograd's demo builds its MLP once per point and sums the points' losses; a minibatch
//! written the same way is B copies of a whole network. Structure recovery ([`super::nest`])
//! finds those copies too, but only after making items of every copy's nodes: at B = 128
//! copies of MNIST's 784-50-10 that is 5 million nodes scanned to learn what one copy says.
//! This pass finds the copies from the sum that joins them, checks node by node that every
//! copy is the first one moved, recovers the first copy's structure alone and nests it:
//!
//! 1. **The hint**: a `sum` among the loss's first few operands whose operands (one per copy,
//!    a copy's loss) lie at equal distances `period` apart. Copy `b` is the `period` slots
//!    up to and including its operand.
//! 2. **The check**: every node of copy `b` is the node `b * period` slots back (the same
//!    op, a constant aside, and gradient flags), and each of its operands either lies in its
//!    own copy (`period` further on) or before the copies, moved by `b` times a stride of
//!    that slot's own (0 for the params every copy shares, the sample's width for its
//!    inputs): the same stride wherever the first copy reads the slot, and never reaching
//!    into the copies. So no copy reads another, and a slot's stride is one number.
//! 3. **The nest**: the first copy's items, each of its [`Affine`]s moving by the stride of
//!    the slots it reaches (all of which must agree), repeated `count` times; the items
//!    before and after the copies recovered on their own. A dot fused in the first copy must
//!    fuse in every copy (nothing else reads any copy's products).
//!
//! Anything else (a copy that reads its neighbour, copies that differ, a first copy that
//! starts before its hint says) is left to the general recovery, which finds whatever
//! repeats. The result is the nest the general recovery would make, in time linear in the
//! tape with a small constant (the check) plus one copy's recovery.

use std::ops::Range;

use super::loops::{every_rep, Item, Nest, MAX_NEST_DEPTH};
use super::nest::{single, MIN_NEST, MIN_NEST_NODES};
use crate::op::Op;
use crate::tape::{Slot, Tape};

/// How deep below the loss the hint is looked for (`loss = sum(copies) * (1 / B) + l2`:
/// two levels).
const HINT_DEPTH: usize = 3;

/// `count` copies of `period` slots from `first`, and how far each slot before the copies
/// that the first copy reads moves per copy.
#[derive(Clone, Debug, PartialEq)]
pub struct Copies {
    pub first: u32,
    pub period: u32,
    pub count: u32,
    /// Per slot before `first`: its stride per copy, or [`UNREAD`].
    strides: Vec<i64>,
}

/// A slot before the copies that the first copy does not read.
const UNREAD: i64 = i64::MIN;

impl Copies {
    /// The slots the copies cover.
    pub fn range(&self) -> Range<u32> {
        self.first..self.first + self.period * self.count
    }

    /// How far slot `s`, read or written by the first copy, moves per copy: the copy's own
    /// nodes by `period`, the slots before it by their stride; `None` for any other slot.
    pub fn stride(&self, s: Slot) -> Option<i64> {
        if (self.first..self.first + self.period).contains(&s.0) {
            return Some(self.period as i64);
        }
        let stride = *self.strides.get(s.index())?;
        (stride != UNREAD).then_some(stride)
    }
}

/// The copies of `tape`, if its loss joins at least [`MIN_NEST`] copies that are each the
/// first one moved (the module docs' check).
pub fn find(tape: &Tape) -> Option<Copies> {
    let ends = hint(tape)?;
    let period = ends[1].0 - ends[0].0;
    let count = ends.len() as u32;
    let leaves = (tape.num_params() + tape.num_inputs()) as u32;
    let first = (ends[0].0 + 1).checked_sub(period)?;
    if first < leaves {
        return None;
    }
    let mut copies = Copies {
        first,
        period,
        count,
        strides: vec![UNREAD; first as usize],
    };
    copies.check(tape).then_some(copies)
}

impl Copies {
    /// The module docs' check, filling in the strides from the second copy.
    fn check(&mut self, tape: &Tape) -> bool {
        let (first, period) = (self.first, self.period);
        for b in 1..self.count {
            let shift = b * period;
            for s in (first..first + period).map(Slot) {
                let moved = Slot(s.0 + shift);
                if !alike(tape, s, moved) {
                    return false;
                }
                for (&a, &m) in tape.args(s).iter().zip(tape.args(moved)) {
                    if a.0 >= first {
                        if m.0 != a.0 + shift {
                            return false;
                        }
                        continue;
                    }
                    // (A slot of the copy's own is compared as its node; one before the
                    // copies may differ in taking a gradient: an input with and one without.)
                    if tape.takes_grad(a) != tape.takes_grad(m) {
                        return false;
                    }
                    let by = m.0 as i64 - a.0 as i64;
                    let stride = &mut self.strides[a.index()];
                    if *stride == UNREAD {
                        // (Copy 1 reads every slot copy 0 reads, so this is copy 1.) The
                        // last copy's read must lie before the copies too.
                        let last = a.0 as i64 + by * (self.count as i64 - 1);
                        if !(0..first as i64).contains(&last) {
                            return false;
                        }
                        *stride = by;
                    } else if *stride * b as i64 != by {
                        return false;
                    }
                }
            }
        }
        true
    }
}

/// Whether nodes `a` and `b` do the same (a constant's value aside: the copies only read
/// it) with the same gradient flags and as many operands.
fn alike(tape: &Tape, a: Slot, b: Slot) -> bool {
    let same_op = match (tape.op(a), tape.op(b)) {
        (Op::Const(_), Op::Const(_)) => true,
        (Op::Powf(x), Op::Powf(y)) => x.to_bits() == y.to_bits(),
        (x, y) => x == y,
    };
    same_op
        && tape.needs_grad(a) == tape.needs_grad(b)
        && tape.takes_grad(a) == tape.takes_grad(b)
        && tape.args(a).len() == tape.args(b).len()
}

/// The operands of a `sum` near the loss that lie at equal distances (more than one slot)
/// apart, at least [`MIN_NEST`] of them: one per copy.
fn hint(tape: &Tape) -> Option<Vec<Slot>> {
    let mut level = vec![tape.loss()?];
    for _ in 0..HINT_DEPTH {
        let mut next = Vec::new();
        for &s in &level {
            let args = tape.args(s);
            if tape.op(s) == Op::Sum && args.len() >= MIN_NEST as usize {
                let period = args[1].0.wrapping_sub(args[0].0);
                let spaced = args
                    .windows(2)
                    .all(|w| w[1].0.wrapping_sub(w[0].0) == period);
                if spaced && period > 1 {
                    return Some(args.to_vec());
                }
            }
            next.extend(args.iter().copied().filter(|a| !tape.op(*a).is_leaf()));
        }
        level = next;
    }
    None
}

/// The items of `tape` with its `copies` as one nest: `recovered(range)` the items of the
/// slots before the copies, one copy, and the slots after, each recovered alone. `None`
/// where the first copy's items do not stand for every copy's (module docs), or would nest
/// too deep.
pub fn items(
    tape: &Tape,
    copies: &Copies,
    recovered: impl Fn(Range<u32>) -> Vec<Item>,
) -> Option<Vec<Item>> {
    let leaves = (tape.num_params() + tape.num_inputs()) as u32;
    let copy = copies.first..copies.first + copies.period;
    let body: Vec<Item> = recovered(copy)
        .into_iter()
        .flat_map(|item| match item {
            Item::Straight(range) => range
                .map(Slot)
                .filter(|&s| !tape.op(s).is_leaf())
                .map(|s| single(tape, s))
                .collect(),
            other => vec![other],
        })
        .collect();
    if body.iter().map(Item::depth).max().unwrap_or(0) + 1 > MAX_NEST_DEPTH {
        return None;
    }
    let nodes: usize = body.iter().map(Item::loop_nodes).sum();
    if nodes * (copies.count as usize) < MIN_NEST_NODES {
        return None;
    }
    let mut uneven = false;
    let body: Vec<Item> = body
        .iter()
        .map(|item| {
            item.map_affines(&mut |a, _| {
                let stride = copies.stride(Slot(a.base as u32));
                uneven |= stride.is_none();
                a.nested(stride.unwrap_or(0))
            })
        })
        .collect();
    let nest = Item::Nest(Nest {
        count: copies.count,
        body,
        lanes: Default::default(),
        shared_grads: Vec::new(),
        forward_order: Vec::new(),
    });
    if uneven || !strides_agree(copies, &nest) || !dots_fuse_everywhere(tape, &nest) {
        return None;
    }
    let end = tape.len() as u32;
    let mut out = recovered(leaves..copies.first);
    out.push(nest);
    out.extend(recovered(copies.range().end..end));
    Some(out)
}

/// Whether every slot each access of the first copy reaches moves by the access's stride.
fn strides_agree(copies: &Copies, nest: &Item) -> bool {
    nest.nested_accesses().iter().all(|(access, counts)| {
        let mut first_copy = counts.clone();
        first_copy[0] = 1;
        every_rep(&first_copy, access.len, |t, js| {
            copies.stride(access.at.at_levels(t, js)) == Some(access.at.outer[0])
        })
    })
}

/// Whether nothing but its sum reads any copy's products of a dot (the first copy's were
/// checked when its dots fused).
fn dots_fuse_everywhere(tape: &Tape, nest: &Item) -> bool {
    let uses = &tape.consumers().uses;
    nest.try_for_each_flat(&mut |item, js| match item {
        Item::Dot(d)
            if (0..d.products.len).any(|t| uses[d.products.out.at_levels(t, js).index()] != 1) =>
        {
            Err(())
        }
        _ => Ok(()),
    })
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Value;
    use crate::nn::{Activation, Layer};
    use crate::passes::loops::recovered;
    use crate::Graph;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    /// `count` copies of a 3-8-1 tanh MLP sharing its params, each on inputs of its own, the
    /// loss their outputs' mean (`sum * (1 / count)`); `out(b, y, outs)` is copy `b`'s output
    /// given its MLP's `y` and the outputs before it.
    fn batch<'g>(
        g: &'g Graph,
        count: usize,
        out: impl Fn(usize, Value<'g>, &[Value<'g>]) -> Value<'g>,
    ) {
        let mut rng = StdRng::seed_from_u64(7);
        let hidden = Layer::new(g, 3, 8, Activation::Tanh, &mut rng);
        let readout = Layer::new(g, 8, 1, Activation::Linear, &mut rng);
        let mut outs: Vec<Value<'g>> = Vec::new();
        for b in 0..count {
            let x = g.inputs_without_grad(3);
            let y = readout.call(&hidden.call(&x).unwrap()).unwrap()[0];
            let o = out(b, y, &outs);
            outs.push(o);
        }
        g.set_loss(g.sum(&outs) * (1.0 / count as f64)).unwrap();
    }

    /// The copies `find` finds in `g`, after checking that their nest is what the general
    /// recovery finds.
    fn copies_of(g: &Graph) -> Option<Copies> {
        let tape = Tape::from_graph(g).unwrap();
        let copies = find(&tape)?;
        let leaves = (tape.num_params() + tape.num_inputs()) as u32;
        let items = items(&tape, &copies, |range| recovered(&tape, range));
        let general = recovered(&tape, leaves..tape.len() as u32);
        assert_eq!(items.as_ref(), Some(&general));
        Some(copies)
    }

    #[test]
    fn a_batch_of_copies_is_one_nest_over_them() {
        let g = Graph::new();
        batch(&g, 6, |_, y, _| y * y);
        let copies = copies_of(&g).expect("six copies");
        assert_eq!(copies.count, 6);
        // A copy: 8 neurons of 3 products, a sum and a tanh; a readout of 8 products and a
        // sum; its square.
        assert_eq!(copies.period, 8 * 5 + 9 + 1);
    }

    #[test]
    fn copies_may_read_a_value_computed_before_them() {
        let g = Graph::new();
        let scale = g.param(2.0).exp();
        batch(&g, 5, |_, y, _| y * scale);
        assert_eq!(copies_of(&g).map(|c| c.count), Some(5));
    }

    #[test]
    fn a_copy_that_reads_its_neighbour_is_left_to_the_general_recovery() {
        let g = Graph::new();
        batch(
            &g,
            6,
            |b, y, outs| if b == 0 { y * y } else { y * outs[b - 1] },
        );
        assert_eq!(copies_of(&g), None);
    }

    #[test]
    fn copies_that_differ_are_left_to_the_general_recovery() {
        let g = Graph::new();
        batch(&g, 6, |b, y, _| if b == 4 { y.relu() } else { y.tanh() });
        assert_eq!(copies_of(&g), None);
        let g = Graph::new();
        batch(
            &g,
            6,
            |b, y, _| if b == 4 { y.powf(-0.0) } else { y.powf(0.0) },
        );
        assert_eq!(copies_of(&g), None);
    }

    #[test]
    fn copies_whose_inputs_differ_in_taking_a_gradient_are_left_to_the_general_recovery() {
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(7);
        let neuron = Layer::new(&g, 12, 1, Activation::Tanh, &mut rng);
        let outs: Vec<Value<'_>> = (0..5)
            .map(|b| {
                let x = match b {
                    3 => g.inputs(12),
                    _ => g.inputs_without_grad(12),
                };
                neuron.call(&x).unwrap()[0]
            })
            .collect();
        g.set_loss(g.sum(&outs)).unwrap();
        assert_eq!(copies_of(&g), None);
    }

    #[test]
    fn a_copy_whose_products_are_read_elsewhere_is_left_to_the_general_recovery() {
        let g = Graph::new();
        let w: Vec<Value<'_>> = (0..12).map(|k| g.param(k as f64)).collect();
        let bias = g.param(0.5);
        let mut outs = Vec::new();
        for b in 0..5 {
            let x = g.inputs_without_grad(12);
            let products: Vec<Value<'_>> = w.iter().zip(&x).map(|(&w, &x)| w * x).collect();
            outs.push(g.sum(std::iter::once(&bias).chain(&products)).tanh());
            if b == 3 {
                g.add_output(products[5]).unwrap();
            }
        }
        g.set_loss(g.sum(&outs)).unwrap();
        let tape = Tape::from_graph(&g).unwrap();
        let copies = find(&tape).expect("alike copies");
        assert_eq!((copies.count, copies.period), (5, 14));
        let items = items(&tape, &copies, |range| recovered(&tape, range));
        assert_eq!(items, None, "copy 3's dot cannot fuse");
    }
}
