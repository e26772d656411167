//! Copies: a batch written as copies of one subgraph, nested without scanning every copy.
//!
//! micrograd's demo builds its MLP once per point and sums the points' losses; a minibatch
//! written the same way is B copies of a whole network. Structure recovery ([`super::nest`])
//! finds those copies too, but only after making items of every copy's nodes: at B = 128
//! copies of MNIST's 784-50-10 that is 5 million nodes scanned to learn what one copy says.
//! Linearization found the copies already and checked that each is the first one moved
//! ([`Tape::copies`]); this pass recovers the first copy's structure alone and nests it over
//! the copies, each of its [`Affine`]s moving by the stride of the slots it reaches (all of
//! which must agree), the items before and after the copies recovered on their own. A dot
//! fused in the first copy must fuse in every copy (nothing else reads any copy's
//! products). Where that fails, the general recovery finds whatever repeats.
//!
//! [`Affine`]: super::schedule::Affine

use std::ops::Range;

use super::nest::{single, MIN_NEST_NODES};
use super::schedule::{every_iteration, Item, Nest, NestId, MAX_NEST_DEPTH};
use crate::tape::{Copies, Slot, Tape};

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
    // Each sequence moves as its first slot does; `strides_agree` checks every other slot.
    let body: Vec<Item> = body
        .iter()
        .map(|item| {
            item.map_affines(&mut |a, _| {
                let stride = copies.stride(Slot(a.base as u32));
                a.nested(stride.unwrap_or(0))
            })
        })
        .collect();
    let nest = Item::Nest(Nest {
        count: copies.count,
        body,
        id: NestId::default(),
    });
    if !strides_agree(copies, &nest) || !dots_fuse_everywhere(tape, &nest) {
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
        every_iteration(&first_copy, access.len, |t, js| {
            copies.stride(access.at.at_levels(t, js)) == Some(access.at.outer[0])
        })
    })
}

/// Whether nothing but its sum reads any copy's products of a dot: the first copy's were
/// checked when its dots fused, and every copy's nodes read their own copy as the first's
/// do, so only a node after the copies (or an output) could read another copy's product.
fn dots_fuse_everywhere(tape: &Tape, nest: &Item) -> bool {
    let Item::Nest(n) = nest else { return false };
    let first_copy = Item::Nest(super::schedule::Nest {
        count: 1,
        ..n.clone()
    });
    let consumers = tape.consumers();
    first_copy
        .try_for_each_flat(&mut |item, js| match item {
            // (A chained sum's links but the last live in registers as the products do.)
            Item::Dot(d)
                if (d.products.out.slots_in(js, d.products.len))
                    .chain(
                        d.sum
                            .links
                            .iter()
                            .flat_map(|l| l.slots_in(js, d.sum.tail_len - 1)),
                    )
                    .any(|s| consumers.uses(s) != 1 || consumers.read_after_the_copies(s)) =>
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
        let copies = tape.copies()?.clone();
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
    fn a_copy_that_differs_ends_the_copies() {
        for (differs, copies) in [(4, Some(4)), (3, Some(3)), (2, None), (0, None)] {
            let g = Graph::new();
            batch(
                &g,
                6,
                |b, y, _| if b == differs { y.relu() } else { y.tanh() },
            );
            assert_eq!(
                copies_of(&g).map(|c| c.count),
                copies,
                "copy {differs} differs"
            );
        }
        // So does a constant (of a different sign of zero).
        let g = Graph::new();
        batch(
            &g,
            6,
            |b, y, _| if b == 4 { y.powf(-0.0) } else { y.powf(0.0) },
        );
        assert_eq!(copies_of(&g).map(|c| c.count), Some(4));
    }

    #[test]
    fn a_copy_whose_inputs_take_a_gradient_where_the_first_copys_do_not_ends_the_copies() {
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
        assert_eq!(copies_of(&g).map(|c| c.count), Some(3));
    }

    #[test]
    fn a_copy_whose_products_are_read_elsewhere_is_left_to_the_general_recovery() {
        let g = Graph::new();
        let w: Vec<Value<'_>> = (0..12).map(|k| g.param(k as f64)).collect();
        let bias = g.param(0.5);
        let mut outs = Vec::new();
        let mut read_elsewhere = None;
        for b in 0..5 {
            let x = g.inputs_without_grad(12);
            let products: Vec<Value<'_>> = w.iter().zip(&x).map(|(&w, &x)| w * x).collect();
            outs.push(g.sum(std::iter::once(&bias).chain(&products)).tanh());
            if b == 3 {
                read_elsewhere = Some(products[5]);
            }
        }
        g.set_loss(g.sum(&outs) + read_elsewhere.unwrap()).unwrap();
        let tape = Tape::from_graph(&g).unwrap();
        let copies = tape.copies().expect("alike copies");
        assert_eq!((copies.count, copies.period), (5, 14));
        let items = items(&tape, copies, |range| recovered(&tape, range));
        assert_eq!(items, None, "copy 3's dot cannot fuse");
    }

    #[test]
    fn a_copy_that_shows_a_value_is_a_copy() {
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(7);
        let neuron = Layer::new(&g, 12, 1, Activation::Tanh, &mut rng);
        let outs: Vec<Value<'_>> = (0..6)
            .map(|b| {
                let y = neuron.call(&g.inputs_without_grad(12)).unwrap()[0];
                if b == 4 {
                    g.add_output(y).unwrap();
                }
                y
            })
            .collect();
        g.set_loss(g.sum(&outs)).unwrap();
        assert_eq!(copies_of(&g).map(|c| c.count), Some(6));
    }
}
