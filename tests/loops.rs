//! Loop recovery: graph families built to exercise the pass, run bit for bit against the
//! interpreter with recovery on and off at every level, and the schedules the pass makes.

mod common;

use std::ops::Range;

use common::{
    assert_backends_agree, interpreter_and_every_jit_level, native_stats, random_inputs, Action,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::nn::{Activation, Classifier, Layer};
use tapejit::{Graph, Jit, JitStats, NestStats, Op, Program, Slot, Tiering, Value};

/// Checks every backend against the interpreter and returns the stats of the JIT at the
/// default level.
fn check(name: &str, g: &Graph) -> JitStats {
    let mut backends = interpreter_and_every_jit_level(g);
    assert_backends_agree(name, &mut backends, &mut StdRng::seed_from_u64(7));
    Jit::builder()
        .tiering(Tiering::Off)
        .compile(g)
        .unwrap()
        .stats()
        .clone()
}

/// Every nest of `stats`, outermost first, each followed by the nests in its body.
fn all_nests(stats: &JitStats) -> Vec<&NestStats> {
    fn walk<'a>(nests: &'a [NestStats], out: &mut Vec<&'a NestStats>) {
        for n in nests {
            out.push(n);
            walk(&n.inner, out);
        }
    }
    let mut out = Vec::new();
    walk(&stats.nests, &mut out);
    out
}

#[test]
fn mlps_of_several_shapes_become_loops() {
    for (i, (nin, hidden)) in [
        (10, vec![12]),
        (16, vec![9, 7]),
        (30, vec![1]),
        (8, vec![8, 8, 8]),
        // Rows of 13 and 20 weights, laid out as rows of 16 and 24 on cache lines.
        (11, vec![13, 20]),
    ]
    .into_iter()
    .enumerate()
    {
        let g = Graph::new();
        Classifier::new(&g, nin, &hidden, 3, &mut StdRng::seed_from_u64(i as u64)).unwrap();
        let loops = check(&format!("MLP {nin}-{hidden:?}-3"), &g).loops;
        assert!(loops > 0, "MLP {nin}-{hidden:?}: no loops recovered");
    }
}

#[test]
fn a_shared_layer_applied_to_several_inputs() {
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(3);
    let layer = Layer::new(&g, 12, 4, Activation::Tanh, &mut rng);
    let mut outs = Vec::new();
    for _ in 0..3 {
        let x = g.inputs(12);
        outs.extend(layer.call(&x).unwrap());
    }
    g.set_loss(g.sum(outs.iter().map(|&o| o * o))).unwrap();
    let stats = check("shared layer", &g);
    assert!(stats.loops > 0);
    // A nest over the three applications, whose shared weights' gradients it adds after
    // them (`SharedGrad`).
    assert!(
        stats
            .nests
            .iter()
            .any(|n| n.count == 3 && n.shared_grads > 0),
        "{:?}",
        stats.nests
    );
}

/// `n` products `w_i * x_i` with the pattern broken by `interrupt` at `at`.
fn products<'g>(
    g: &'g Graph,
    n: usize,
    interrupt: impl Fn(usize) -> Option<Value<'g>>,
) -> Vec<Value<'g>> {
    let w: Vec<_> = (0..n).map(|i| g.param(0.1 * i as f64 - 0.7)).collect();
    let x = g.inputs(n);
    (0..n)
        .map(|i| interrupt(i).unwrap_or_else(|| w[i] * x[i]))
        .collect()
}

#[test]
fn a_run_interrupted_by_another_op() {
    let g = Graph::new();
    let extra = g.input();
    let terms = products(&g, 40, |i| (i == 17).then(|| extra.tanh()));
    g.set_loss(g.sum(&terms).powf(2.0)).unwrap();
    assert!(check("interrupted run", &g).loops >= 2);
}

#[test]
fn a_stride_change_midway() {
    let g = Graph::new();
    let w: Vec<_> = (0..60).map(|i| g.param(0.01 * i as f64)).collect();
    let x = g.inputs(60);
    // Operand strides 1 for the first 20 products, then 2.
    let mut terms: Vec<Value> = (0..20).map(|i| w[i] * x[i]).collect();
    terms.extend((0..20).map(|i| w[20 + 2 * i] * x[20 + 2 * i]));
    g.set_loss(g.sum(&terms).tanh()).unwrap();
    assert!(check("stride change", &g).loops >= 2);
}

#[test]
fn a_chain_whose_iterations_depend_on_each_other() {
    let g = Graph::new();
    let w = g.param(0.97);
    let mut v = g.input();
    for _ in 0..50 {
        v *= w;
    }
    g.add_output(v).unwrap();
    g.set_loss(v.tanh()).unwrap();
    assert!(check("dependent chain", &g).loops > 0);
}

#[test]
fn a_rollout_whose_state_feeds_several_nodes_of_the_next_step() {
    // Each state is read three times by the next step (the first element's neighbour is
    // itself) and the last one by the loss, twice by one node: backward stores each
    // gradient's first addition instead of zeroing it, and the script runs backward many
    // times, so a gradient neither zeroed nor stored would show.
    let g = Graph::new();
    let k = g.param(0.3);
    let mut x: Vec<Value> = g.inputs(6);
    for _ in 0..30 {
        x = (0..x.len())
            .map(|i| {
                let left = x[i.saturating_sub(1)];
                x[i] + ((x[i] - left) * k - x[i] * x[i] * 0.01)
            })
            .collect();
    }
    let squares: Vec<Value> = x.iter().map(|&v| v * v).collect();
    g.set_loss(g.sum(&squares)).unwrap();
    let stats = check("rollout", &g);
    assert!(stats.loops > 0);
    assert!(stats.stored_first_additions > 0, "{stats:?}");
}

#[test]
fn constants_between_run_members_and_repeated_operands() {
    let g = Graph::new();
    let x = g.inputs(30);
    // `x * 2.0` puts a constant between every two products: output stride 2.
    let doubled: Vec<Value> = x.iter().map(|&xi| xi * 2.0).collect();
    let squares: Vec<Value> = x.iter().map(|&xi| xi * xi).collect();
    let p = g.param(0.5);
    let scaled: Vec<Value> = squares.iter().map(|&s| s * p).collect();
    g.set_loss(g.sum(doubled.iter().chain(&scaled)).sigmoid())
        .unwrap();
    assert!(check("constants and repeats", &g).loops >= 3);
}

#[test]
fn constants_made_at_every_use_in_a_rollout() {
    // Each step makes its constants anew, as `x * 0.5` does: the same number in every step
    // (a number in the code), one that changes from step to step, one that changes only in
    // the last step, and a -0.0 (all three read from memory, as they must be); plus one
    // constant made once, shown as an output (its gradient kept).
    let g = Graph::new();
    let k = g.param(0.7);
    let shown = g.constant(0.25);
    g.add_output(shown).unwrap();
    let steps = 12;
    let mut x: Vec<Value> = g.inputs(5);
    for step in 0..steps {
        let last = if step + 1 == steps { 0.375 } else { 0.125 };
        x = (0..x.len())
            .map(|i| {
                let left = x[i.saturating_sub(1)];
                let pull = (x[i] - left) * k * 0.5;
                let drift = x[i] * (1.0 + step as f64 / 64.0) * last;
                x[i] + pull * shown - drift + g.constant(-0.0) * x[i]
            })
            .collect();
    }
    g.set_loss(g.sum(x.iter().map(|&v| v * v))).unwrap();
    assert!(check("constants made at every use", &g).loops > 0);
    let jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    let stats = jit.stats();
    assert!(
        stats.nest_depth >= 1 && stats.constant_operands > 0,
        "{stats:?}"
    );
    // Nothing adds into a constant's gradient but the shown one's; every gradient, the
    // constants' among them, is the interpreter's when asked for them all (`check`).
    let tape = jit.tape();
    let constants: Vec<Slot> = (tape.slots())
        .filter(|&s| matches!(tape.node(s).unwrap().op, Op::Const(_)))
        .collect();
    let shown = tape.slot(shown).unwrap();
    for &c in &constants {
        assert_eq!(jit.is_kept(c), c == shown, "constant at slot {}", c.0);
    }
}

#[test]
fn a_graph_without_any_pattern() {
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(11);
    let x = g.inputs(5);
    let mut v = x[0];
    for i in 0..40 {
        let other = x[rng.gen_range(0..5)];
        v = match i % 5 {
            0 => v + other,
            1 => (v * other).tanh(),
            2 => v - other.exp(),
            3 => v.sigmoid() * other,
            _ => v / (other * other + 1.0),
        };
    }
    g.set_loss(v).unwrap();
    assert_eq!(check("no pattern", &g).loops, 0);
}

#[test]
fn fast_math_agrees_to_rounding_and_is_off_by_default() {
    let g = Graph::new();
    Classifier::new(&g, 40, &[16], 4, &mut StdRng::seed_from_u64(5)).unwrap();
    let mut interp = tapejit::Interpreter::new(&g).unwrap();
    let mut exact = Jit::builder()
        .tiering(Tiering::Off)
        .keep_ir(true)
        .compile(&g)
        .unwrap();
    let mut fast = Jit::builder()
        .tiering(Tiering::Off)
        .fast_math(true)
        .keep_ir(true)
        .compile(&g)
        .unwrap();
    // Only the fast program's arithmetic carries fast-math flags.
    let reassociates = |jit: &Jit| jit.ir().unwrap().contains(" reassoc ");
    assert!(reassociates(&fast) && !reassociates(&exact));
    let mut rng = StdRng::seed_from_u64(9);
    for step in 0..50 {
        let mut inputs: Vec<f64> = (0..40).map(|_| rng.gen_range(0.0..1.0)).collect();
        inputs.extend((0..4).map(|k| (k == step % 4) as u8 as f64));
        let want = interp.step(&inputs, 0.05).unwrap();
        assert_eq!(exact.step(&inputs, 0.05).unwrap().to_bits(), want.to_bits());
        let got = fast.step(&inputs, 0.05).unwrap();
        assert!(
            ((got - want) / want).abs() < 1e-9,
            "step {step}: {got} vs {want}"
        );
    }
    for (p, q) in fast.params().iter().zip(interp.params()) {
        assert!((p - q).abs() <= 1e-9 * q.abs().max(1.0), "{p} vs {q}");
    }
}

#[test]
fn layers_wider_than_a_lane_group_with_input_gradients() {
    // Tanh neurons whose inputs take gradients, which every lane adds into the same slots,
    // last neuron first. 70: one group of 64 and a rest of 6; 130: a loop over two groups of
    // 64 and a rest of 2; 136: a loop over 17 groups of 8 (the largest multiple of 8 that
    // divides it, so no rest).
    for width in [70, 130, 136] {
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(12);
        let layer = Layer::new(&g, 9, width as usize, Activation::Tanh, &mut rng);
        let x = g.inputs(9);
        let out = layer.call(&x).unwrap();
        g.set_loss(g.sum(out.iter().map(|&o| o * o))).unwrap();
        let stats = check(&format!("{width}-wide layer"), &g);
        assert!(stats.loops > 0);
        // The layer's neurons, forward and backward in lanes.
        assert!(
            (stats.nests.iter()).any(|n| n.count == width && n.lanes && n.backward_lanes),
            "{width}: {:?}",
            stats.nests
        );
    }
}

#[test]
fn a_nest_whose_lane_order_would_reorder_a_gradient_runs_neuron_by_neuron() {
    // Every neuron adds into `shared` from two body items; side by side, all of the second
    // item's additions would come before all of the first's. The pass must see it.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(13);
    let layer = Layer::new(&g, 10, 6, Activation::Linear, &mut rng);
    let shared = g.param(0.3);
    let x = g.inputs(10);
    let out: Vec<Value> = layer
        .neurons
        .iter()
        .map(|n| {
            let v = n.call(&x).unwrap();
            (v * shared) + shared
        })
        .collect();
    g.set_loss(g.sum(out.iter().map(|&o| o * o))).unwrap();
    let stats = check("shared across items", &g);
    assert!(stats.loops > 0);
    // The neurons' nest: forward in lanes, backward one neuron after the other.
    let neurons = stats.nests.iter().find(|n| n.count == 6);
    assert!(
        neurons.is_some_and(|n| n.lanes && !n.backward_lanes),
        "{:?}",
        stats.nests
    );
}

#[test]
fn step_fuses_updates_only_where_a_loop_computes_the_whole_gradient() {
    // Weights used once (fused), a bias also used outside the layer (not fused, so its whole
    // row of biases is not), a param outside the loss's cone (its gradient must still read 0
    // after `step`), and the interpreter checking every state after every action.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(14);
    let layer = Layer::new(&g, 16, 10, Activation::Relu, &mut rng);
    let idle = g.param(2.0);
    g.add_output(idle * 3.0).unwrap();
    let x = g.inputs_without_grad(16);
    let out = layer.call(&x).unwrap();
    let reused_bias = layer.neurons[4].b;
    let loss = g.sum(out.iter().map(|&o| o * o)) + reused_bias * reused_bias;
    g.set_loss(loss).unwrap();
    let stats = check("step fusion", &g);
    assert!(stats.loops > 0);
    // The 16 weights of each of the 10 neurons; no bias, nor `idle`.
    assert_eq!(stats.fused_updates, 16 * 10, "{stats:?}");
}

#[test]
fn gradients_step_defers_are_there_whenever_anyone_looks() {
    // `step` leaves a layer's weight gradients unstored until something could tell. Run
    // each action right after a step, without looking in between, then compare everything.
    let g = Graph::new();
    Classifier::new(&g, 24, &[12], 3, &mut StdRng::seed_from_u64(15)).unwrap();
    let stats = native_stats(&g);
    assert!(stats.deferred_grads > 0, "{stats:?}");
    let (inputs, params) = (g.num_inputs(), g.num_params());
    let mut rng = StdRng::seed_from_u64(16);
    let mut x = || random_inputs(&mut rng, inputs);
    let new_params: Vec<f64> = (0..params).map(|k| 0.01 * (k % 17) as f64 - 0.08).collect();
    let mut bad = x();
    bad[5] = f64::INFINITY;
    let followers = [
        Action::SetInputs(x()),
        Action::Forward,
        Action::Backward,
        Action::SetParams(new_params),
        Action::Update(0.05),
        Action::ZeroGrad,
        Action::Step(bad, 0.1),
        Action::Step(x(), 0.1),
    ];
    let first = x();
    for (k, follower) in followers.iter().enumerate() {
        let mut backends = interpreter_and_every_jit_level(&g);
        let mut results = Vec::new();
        for b in &mut backends {
            let stepped = common::apply(b.program.as_mut(), &Action::Step(first.clone(), 0.1));
            let followed = common::apply(b.program.as_mut(), follower);
            let p = b.program.as_ref();
            let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
            // Kept slots are compared below; products are kept by the interpreter only.
            let grads: Vec<(bool, u64)> = (0..p.tape().len())
                .map(|s| (p.is_kept(tapejit::Slot(s as u32)), p.grads()[s].to_bits()))
                .collect();
            let outcome = (stepped.is_ok(), followed.is_ok());
            results.push((
                b.name.clone(),
                outcome,
                bits(p.params()),
                bits(p.param_grads()),
                grads,
            ));
        }
        let (reference, others) = results.split_first().unwrap();
        for other in others {
            assert!(
                (&other.1, &other.2, &other.3) == (&reference.1, &reference.2, &reference.3)
                    && other
                        .4
                        .iter()
                        .zip(&reference.4)
                        .skip(params)
                        .all(|(a, b)| !a.0 || a.1 == b.1),
                "step, then action {k}: {} differs from {}",
                other.0,
                reference.0
            );
        }
    }
}

#[test]
fn train_is_step_per_sample_bit_for_bit() {
    // `train` fuses a first layer's weight update with the next sample's forward; whatever
    // it fuses, every backend must end where `step` per sample ends, losses included.
    for (nin, hidden, samples) in [(24, vec![12], 7), (20, vec![70, 5], 4), (16, vec![9], 1)] {
        let g = Graph::new();
        Classifier::new(&g, nin, &hidden, 3, &mut StdRng::seed_from_u64(17)).unwrap();
        let stats = native_stats(&g);
        assert!(stats.merged_train, "{nin}-{hidden:?}: train merges nothing");
        let width = g.num_inputs();
        let mut rng = StdRng::seed_from_u64(18);
        let inputs: Vec<f64> = (0..samples)
            .flat_map(|s| {
                let mut x = random_inputs(&mut rng, width);
                x[nin..].fill(0.0);
                x[nin + s % 3] = 1.0;
                x
            })
            .collect();
        let mut reference = tapejit::Interpreter::new(&g).unwrap();
        let want: Vec<u64> = inputs
            .chunks(width)
            .map(|x| reference.step(x, 0.05).unwrap().to_bits())
            .collect();
        for mut b in interpreter_and_every_jit_level(&g) {
            let p = b.program.as_mut();
            let got: Vec<u64> = p
                .train(&inputs, 0.05)
                .unwrap()
                .iter()
                .map(|l| l.to_bits())
                .collect();
            let at = format!("{nin}-{hidden:?}, {samples} samples, {}", b.name);
            assert_eq!(got, want, "{at}: losses");
            let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
            assert_eq!(bits(p.params()), bits(reference.params()), "{at}: params");
            assert_eq!(
                bits(p.param_grads()),
                bits(reference.param_grads()),
                "{at}: grads"
            );
            let kept = common::kept_slots(&reference, p);
            for s in kept {
                assert_eq!(
                    p.values()[s].to_bits(),
                    reference.values()[s].to_bits(),
                    "{at}: value {s}"
                );
                assert_eq!(
                    p.grads()[s].to_bits(),
                    reference.grads()[s].to_bits(),
                    "{at}: grad {s}"
                );
            }
        }
    }
}

#[test]
fn train_checks_every_input_before_the_first_step() {
    let g = Graph::new();
    Classifier::new(&g, 10, &[9], 3, &mut StdRng::seed_from_u64(19)).unwrap();
    for mut b in interpreter_and_every_jit_level(&g) {
        let p = b.program.as_mut();
        let before = p.params();
        let mut inputs = vec![0.5; 13 * 3];
        inputs[13 * 2 + 4] = f64::INFINITY;
        assert!(matches!(
            p.train(&inputs, 0.1),
            Err(tapejit::Error::NonFinite { .. })
        ));
        assert!(matches!(
            p.train(&inputs[..20], 0.1),
            Err(tapejit::Error::WrongLength { .. })
        ));
        assert!(matches!(
            p.train(&[], 0.1),
            Err(tapejit::Error::WrongLength { .. })
        ));
        assert_eq!(p.params(), before, "{}: nothing ran", b.name);
    }
}

/// Copies of a two-layer MLP whose second layer's dots have 16 or 8 steps: in lanes, their
/// gradient into the first layer's outputs (which every neuron of the second layer reads)
/// is added 8 steps at a time, one vector per lane (the vertical order); with 12 neurons
/// the last vector of lanes is partial. Bit for bit against the interpreter at every level,
/// `step` and `train` included.
#[test]
fn copies_whose_dots_add_into_a_shared_layer_in_blocks() {
    for (nin, hidden, copies) in [(2, [16, 16], 6), (5, [16, 12], 4), (3, [8, 16], 5)] {
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(nin as u64);
        let l1 = Layer::new(&g, nin, hidden[0], Activation::Relu, &mut rng);
        let l2 = Layer::new(&g, hidden[0], hidden[1], Activation::Tanh, &mut rng);
        let mut terms = Vec::new();
        for _ in 0..copies {
            let x = g.inputs(nin);
            let h = l1.call(&x).unwrap();
            terms.extend(l2.call(&h).unwrap());
        }
        g.set_loss(g.sum(terms.iter().map(|&o| o * o))).unwrap();
        let stats = check(&format!("{copies} copies of {nin}-{hidden:?}"), &g);
        // The second layer's neurons, in lanes, backward in the vertical order.
        assert!(
            (all_nests(&stats).iter()).any(|n| n.count as usize == hidden[1] && n.vertical),
            "{copies} copies of {nin}-{hidden:?}: {:?}",
            stats.nests
        );
    }
}

/// Elman cells (the `families` RNN's shape): each neuron's sum adds single products of the
/// step's inputs, then a map of products over the state, which every neuron reads: a dot
/// whose first terms are other items' values, its backward in the vertical order. States
/// read by the next step only (their gradients summed from 0) or by a readout too; hidden
/// sizes a whole number of vertical blocks or not. Bit for bit against the interpreter at
/// every level.
#[test]
fn recurrent_cells_whose_sums_add_terms_before_their_products() {
    let shapes = [
        (2, 16, 5, false),
        (3, 16, 4, true),
        (1, 8, 6, true),
        (2, 12, 3, false),
    ];
    for (inputs, hidden, steps, readout) in shapes {
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(hidden as u64 + steps as u64);
        let cell = Layer::new(&g, inputs + hidden, hidden, Activation::Tanh, &mut rng);
        let out = Layer::new(&g, hidden, 1, Activation::Linear, &mut rng);
        let mut h: Vec<Value> = g.inputs(hidden);
        let mut terms = Vec::new();
        for _ in 0..steps {
            let mut xh = g.inputs_without_grad(inputs);
            xh.extend(&h);
            h = cell.call(&xh).unwrap();
            if readout {
                terms.extend(out.call(&h).unwrap());
            }
        }
        terms.extend(&h);
        g.set_loss(g.sum(terms.iter().map(|&t| t * t))).unwrap();
        let name = format!("{steps} steps of a {inputs}+{hidden} cell, readout {readout}");
        let stats = check(&name, &g);
        // The cell's neurons, in lanes, backward in the vertical order.
        assert!(
            (all_nests(&stats).iter()).any(|n| n.count as usize == hidden && n.vertical),
            "{name}: {:?}",
            stats.nests
        );
    }
}

/// A rollout whose forward runs the chain to the next step before the values only the loss
/// reads (`plan::order`): a scalar state through `tanh(h * 3 + 0.5)`, with `h * 2` read by
/// the loss only, and the same around a vector state. Bit for bit against the interpreter
/// at every level.
#[test]
fn rollouts_whose_forward_runs_the_chain_first() {
    for width in [1, 5] {
        let g = Graph::new();
        let mut h: Vec<Value> = g.inputs(width);
        let mut terms = Vec::new();
        for _ in 0..40 {
            terms.extend(h.iter().map(|&x| x * 2.0));
            h = h.iter().map(|&x| (x * 3.0 + 0.5).tanh()).collect();
        }
        terms.extend(&h);
        g.set_loss(g.sum(terms.iter().map(|&t| t * t))).unwrap();
        let stats = check(&format!("a rollout of {width} states"), &g);
        assert!(
            stats.nests.iter().any(|n| n.forward_reordered),
            "{width} states: {:?}",
            stats.nests
        );
    }
}

/// A layer whose every neuron's sum adds, before its products, a value of its own that the
/// loss reads too (a term before the products with two readers, each lane its own): `b +
/// tanh(a * z) + w . x`, with `z` an input of the neuron's own (backward in lanes) or one of
/// the layer's inputs `x` (which the products add into too: backward neuron by neuron). Bit
/// for bit against the interpreter at every level.
#[test]
fn a_dot_after_a_term_that_others_read_too() {
    for (nin, neurons, own_z) in [
        (16, 16, true),
        (16, 16, false),
        (8, 5, true),
        (24, 9, false),
    ] {
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(nin as u64);
        let x = g.inputs(nin);
        let mut terms = Vec::new();
        for i in 0..neurons {
            let a = g.param(rng.gen_range(-1.0..1.0));
            let z = if own_z { g.input() } else { x[i % nin] };
            let extra = (z * a).tanh();
            let products: Vec<Value> = x
                .iter()
                .map(|&xi| g.param(rng.gen_range(-1.0..1.0)) * xi)
                .collect();
            let b = g.param(0.1);
            let sum = g.sum([b, extra].into_iter().chain(products));
            terms.extend([sum.tanh(), extra * 0.5]);
        }
        g.set_loss(g.sum(terms.iter().map(|&t| t * t))).unwrap();
        let name = format!("{neurons} neurons over {nin} inputs, own z {own_z}");
        let stats = check(&name, &g);
        // The neurons' nest (the largest): forward in lanes, backward in lanes with `z` of
        // their own, neuron by neuron with the layer's inputs.
        let layer = stats.nests.iter().max_by_key(|n| n.nodes);
        assert!(
            layer.is_some_and(|n| n.count as usize == neurons
                && n.lanes
                && n.backward_lanes == own_z),
            "{name}: {:?}",
            stats.nests
        );
    }
}

/// tanh is an [`Arith`](tapejit::op::Arith) formula of ours: the interpreter computes it on
/// `f64`s, the JIT's scalar code calls that compiled function and its vector code computes
/// it inline, eight lanes at once. A map of `tanh(x_i / y_i)` over 64 inputs (in lanes where
/// loops are recovered) on values from every range its formula picks between (tiny, the
/// series, either side of 0.625, the exponential across a change of k, from 22, infinite,
/// NaN, -0, subnormal; the non-finite ones divided out of finite inputs): values and
/// gradients bit for bit against the interpreter at every level.
#[test]
fn tanh_in_vector_lanes_is_the_interpreters_on_every_kind_of_input() {
    // (x, y): y = 1 passes x through as it is.
    let mut pairs = vec![(1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (1e300, 1e-300)];
    pairs.extend(
        [
            0.0,
            -0.0,
            5e-324,
            -1e-300,
            2e-9,
            -3.7e-9,
            22.0,
            -21.999,
            19.5,
            1.0,
            -1.0,
            0.999_999,
            0.549_306_144_334_054_9,
            0.625,
            -0.624_999_999_999_999_9,
            0.866_433_975_699_931_6, // 2|x| = 2.5 ln2, where k changes
            -0.866_433_975_699_931_6,
            0.52,
            1e300,
        ]
        .map(|x| (x, 1.0)),
    );
    let mut rng = StdRng::seed_from_u64(19);
    let mut random_up_to = |pairs: &mut Vec<(f64, f64)>, len: usize, exponents: Range<f64>| {
        while pairs.len() < len {
            let magnitude: f64 = rng.gen_range(exponents.clone()).exp2();
            pairs.push((if rng.gen() { magnitude } else { -magnitude }, 1.0));
        }
    };
    // Vectors of lanes that all take the series (below 0.625), all the exponential, and
    // (the rest) a mix: each way a backend of lanes may branch.
    random_up_to(&mut pairs, 24, -8.0..5.0);
    random_up_to(&mut pairs, 32, -8.0..-1.0);
    random_up_to(&mut pairs, 40, 0.0..4.0);
    random_up_to(&mut pairs, MAP_LEN, -8.0..5.0);
    assert_map_in_lanes_agrees("tanh", |x| x.tanh(), &pairs, true);
}

/// `pairs` with each pair whose quotient is no finite number divided by 1 instead.
fn finite_quotients(pairs: &[(f64, f64)]) -> Vec<(f64, f64)> {
    (pairs.iter())
        .map(|&(x, y)| {
            if (x / y).is_finite() {
                (x, y)
            } else {
                (x, 1.0)
            }
        })
        .collect()
}

/// How many inputs a map of [`assert_map_in_lanes_agrees`] has.
const MAP_LEN: usize = 64;

/// `op(x_i / y_i)` over [`MAP_LEN`] pairs, its sum halved the loss: values and gradients
/// bit for bit against the interpreter at every level and in the first tier, and a nest in
/// vector lanes forward and backward (where loop recovery finds the map). Gradients where a
/// quotient is no finite number only if `nan_grads_exact`: LLVM keeps no NaN's sign through
/// a negation (see `new_ops_in_vector_lanes...`).
fn assert_map_in_lanes_agrees(
    name: &str,
    op: for<'g> fn(Value<'g>) -> Value<'g>,
    pairs: &[(f64, f64)],
    nan_grads_exact: bool,
) {
    assert_eq!(pairs.len(), MAP_LEN);
    let g = Graph::new();
    let (x, y) = (
        g.inputs_without_grad(MAP_LEN),
        g.inputs_without_grad(MAP_LEN),
    );
    let outs: Vec<Value> = x.iter().zip(&y).map(|(&a, &b)| op(a / b)).collect();
    g.set_loss(g.sum(outs.iter().map(|&o| o * 0.5))).unwrap();
    let inputs = |pairs: &[(f64, f64)]| {
        let inputs = pairs.iter().map(|p| p.0).chain(pairs.iter().map(|p| p.1));
        Action::SetInputs(inputs.collect())
    };
    let finite = finite_quotients(pairs);
    let for_grads = if nan_grads_exact { pairs } else { &finite };
    let script = [
        inputs(pairs),
        Action::Forward,
        inputs(for_grads),
        Action::Forward,
        Action::Backward,
    ];
    let mut backends = interpreter_and_every_jit_level(&g);
    backends.push(common::first_tier(&g));
    common::assert_backends_agree_on(&format!("{name} of special values"), &mut backends, &script);
    let jit = Jit::builder()
        .tiering(Tiering::Off)
        .keep_ir(true)
        .compile(&g)
        .unwrap();
    let stats = jit.stats();
    assert!(
        (stats.nests.iter()).any(|n| n.lanes && n.backward_lanes),
        "the {name} map runs in no lanes: {:?}",
        stats.nests
    );
    // The formulas are inline: the code calls no math function but libm's sin and cos,
    // which only lanes beyond the reduction's range reach.
    let ir = jit.ir().unwrap();
    let calls: Vec<&str> = (ir.lines())
        .filter(|l| l.contains("call ") && l.contains("@tapejit_"))
        .filter(|l| !l.contains("@tapejit_libm_sin") && !l.contains("@tapejit_libm_cos"))
        .collect();
    assert!(calls.is_empty(), "{name}: calls {calls:#?}");
}

/// log is a formula of ours too (a table's entries looked up lane by lane): a map of
/// `log(x_i / y_i)` over 64 inputs, on values from every range it picks between (around 1,
/// within the window of 1/16 and at its edges, each subinterval's edges, subnormals, the
/// largest, zeros of both signs, negatives, infinities and NaN divided out of finite
/// inputs), in vectors whose lanes all take the window, none, or a mix: values and gradients
/// bit for bit against the interpreter at every level.
#[test]
fn log_in_vector_lanes_is_the_interpreters_on_every_kind_of_input() {
    let mut pairs = vec![(1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (1e300, 1e-300)];
    pairs.extend(
        [
            1.0,
            0.0,
            -0.0,
            5e-324,
            2.2e-308,
            f64::MAX,
            -1.0,
            -5e-324,
            1.0625,
            0.9375,
            1.0 + f64::EPSILON,
            1.0 - f64::EPSILON / 2.0,
            0.6875,
            1.375,
            0.99609375,
            1.0078125,
            2.0,
            0.5,
        ]
        .map(|x| (x, 1.0)),
    );
    let mut rng = StdRng::seed_from_u64(29);
    let mut random_up_to = |pairs: &mut Vec<(f64, f64)>, len: usize, range: Range<f64>| {
        while pairs.len() < len {
            pairs.push((rng.gen_range(range.clone()), 1.0));
        }
    };
    // Vectors of lanes that all take the window around 1, none, and a mix.
    random_up_to(&mut pairs, 32, 0.95..1.05);
    random_up_to(&mut pairs, 40, 2.0..1e6);
    random_up_to(&mut pairs, MAP_LEN, 0.5..1.5);
    assert_map_in_lanes_agrees("log", |x| x.log(), &pairs, true);
}

/// sin and cos are formulas of ours below 2^20 and libm's beyond (a branch: vector code
/// calls libm only for vectors with a lane beyond): maps of `sin(x_i / y_i)` and of `cos`, on
/// values from every range they pick between (tiny, signed zeros, subnormals, every
/// quadrant, near multiples of pi/2 where the reduction cancels, at and beyond 2^20,
/// infinities and NaN divided out of finite inputs), in vectors whose lanes are all within
/// the reduction's range, all beyond, and a mix.
#[test]
fn sin_and_cos_in_vector_lanes_are_the_interpreters_on_every_kind_of_input() {
    let mut pairs = vec![(1.0, 0.0), (-1.0, 0.0), (0.0, 0.0), (1e300, 1e-300)];
    pairs.extend(
        [
            0.0,
            -0.0,
            5e-324,
            -5e-324,
            1e-9,
            std::f64::consts::FRAC_PI_2,
            std::f64::consts::PI,
            -std::f64::consts::FRAC_PI_4,
            667_000.0 * std::f64::consts::FRAC_PI_2,
            1048575.9,
            1048576.0,
            -1048576.0,
            1e22,
            f64::MAX,
        ]
        .map(|x| (x, 1.0)),
    );
    let mut rng = StdRng::seed_from_u64(31);
    let random_up_to =
        |rng: &mut StdRng, pairs: &mut Vec<(f64, f64)>, len, exponents: Range<f64>| {
            while pairs.len() < len {
                let magnitude: f64 = rng.gen_range(exponents.clone()).exp2();
                pairs.push((if rng.gen() { magnitude } else { -magnitude }, 1.0));
            }
        };
    // Lanes all within range, near multiples of pi/2, all beyond 2^20, and a mix.
    random_up_to(&mut rng, &mut pairs, 32, -3.0..19.0);
    while pairs.len() < 40 {
        let n = rng.gen_range(-600_000i32..600_000) as f64;
        pairs.push((n * std::f64::consts::FRAC_PI_2, 1.0));
    }
    random_up_to(&mut rng, &mut pairs, 48, 20.5..60.0);
    random_up_to(&mut rng, &mut pairs, MAP_LEN, -3.0..40.0);
    assert_map_in_lanes_agrees("sin", |x| x.sin(), &pairs, false);
    assert_map_in_lanes_agrees("cos", |x| x.cos(), &pairs, false);
}

/// Powers at exponents other than IEEE's exact ones are a formula of ours (`e^(c log|x|)`
/// with C's special values selected around it): maps of `(x_i / y_i) ** c` for an odd, an
/// even, a non-integral and a negative exponent, on values from every range they pick
/// between (signed zeros, subnormals, negatives, around 1 where the log takes its window,
/// where the power overflows or vanishes, infinities divided out of finite inputs), in
/// vectors whose lanes all take the window around 1, none, and a mix.
#[test]
fn powers_in_vector_lanes_are_the_interpreters_on_every_kind_of_input() {
    // (No NaN input: its power is itself, and a loss summing two NaNs of other bits keeps
    // either, as the machine's operand order falls. The unit tests of `op::power` hold it.)
    let mut pairs = vec![(1.0, 0.0), (-1.0, 0.0), (1e300, 1e-300)];
    pairs.extend(
        [
            0.0,
            -0.0,
            5e-324,
            -5e-324,
            1.0,
            -1.0,
            2.0,
            -2.0,
            1e-200,
            1e200,
            -1e200,
            f64::MAX,
            1.0625,
            0.9375,
        ]
        .map(|x| (x, 1.0)),
    );
    let mut rng = StdRng::seed_from_u64(37);
    while pairs.len() < 32 {
        pairs.push((rng.gen_range(0.95..1.05), 1.0));
    }
    while pairs.len() < 40 {
        pairs.push((rng.gen_range(2.0..1e6), 1.0));
    }
    while pairs.len() < MAP_LEN {
        let magnitude: f64 = rng.gen_range(-40.0..40.0f64).exp2();
        pairs.push((if rng.gen() { magnitude } else { -magnitude }, 1.0));
    }
    assert_map_in_lanes_agrees("x ** 3", |x| x.powf(3.0), &pairs, false);
    assert_map_in_lanes_agrees("x ** 4", |x| x.powf(4.0), &pairs, false);
    assert_map_in_lanes_agrees("x ** 2.5", |x| x.powf(2.5), &pairs, false);
    assert_map_in_lanes_agrees("x ** -0.75", |x| x.powf(-0.75), &pairs, false);
}

/// The ops that call a formula of ours with a table or a branch to libm (`softplus` and
/// `log1p`, whose table lookups are lane by lane; `sin`, `cos`, libm's beyond 2^20)
/// and those built of selects (`abs`, `min`, `max`) or an instruction (`sqrt`): a map of
/// `op(x_i / y_i)` over 64 inputs, in lanes where loops are recovered, on values from every
/// range that is special to one of them (signed zeros, subnormals, where softplus turns
/// into `x` or `e^x`, large arguments of sin and cos, infinities and NaN divided out of
/// finite inputs), `min` and `max` of `x_i` and `y_i` on ties of every kind: values bit for
/// bit against the interpreter at every level, and gradients where the quotients are finite.
/// A NaN gradient need not be the interpreter's to the bit: LLVM does not keep a NaN's sign
/// through arithmetic (it turns `-sin(x) * 0.5`, cos's derivative, into `sin(x) * -0.5`,
/// even at O0), nor which of two NaNs a product keeps (division's derivative by its divisor
/// multiplies two at 0 / 0; the divisors take no gradient here).
#[test]
fn new_ops_in_vector_lanes_are_the_interpreters_on_every_kind_of_input() {
    const N: usize = 64;
    let mut pairs = vec![
        (1.0, 0.0),
        (-1.0, 0.0),
        (0.0, 0.0),
        (1e300, 1e-300),
        (-1e300, 1e-300),
        // Ties, min and max: equal, signed zeros either way.
        (2.0, 2.0),
        (0.0, -0.0),
        (-0.0, 0.0),
        (-0.0, -0.0),
    ];
    pairs.extend(
        [
            0.0,
            -0.0,
            5e-324,
            -5e-324,
            -1e-300,
            1e-20,
            -0.5,
            -1.0,
            1.0,
            std::f64::consts::PI,
            33.272,
            40.0,
            -40.0,
            1000.0,
            -1000.0,
            -745.2,
            709.8,
            1e6 + 0.5,
            1e22,
            -1e22,
            2f64.powi(60),
            1e300,
            -f64::MAX,
            f64::MAX,
        ]
        .map(|x| (x, 1.0)),
    );
    let mut rng = StdRng::seed_from_u64(23);
    while pairs.len() < N {
        let magnitude: f64 = rng.gen_range(-30.0..80.0f64).exp2();
        let sign = if rng.gen() { 1.0 } else { -1.0 };
        pairs.push((sign * magnitude, if rng.gen() { 1.0 } else { -3.0 }));
    }
    let inputs = |pairs: &[(f64, f64)]| -> Vec<f64> {
        pairs
            .iter()
            .map(|p| p.0)
            .chain(pairs.iter().map(|p| p.1))
            .collect()
    };
    let finite = finite_quotients(&pairs);
    let script = [
        Action::SetInputs(inputs(&pairs)),
        Action::Forward,
        Action::SetInputs(inputs(&finite)),
        Action::Forward,
        Action::Backward,
    ];
    type Map = for<'g> fn(Value<'g>, Value<'g>) -> Value<'g>;
    // Whether `y` takes a gradient: where it is no divisor.
    let maps: [(&str, Map, bool); 9] = [
        ("softplus", |x, y| (x / y).softplus(), false),
        ("log1p", |x, y| (x / y).log1p(), false),
        ("abs", |x, y| (x / y).abs(), false),
        ("sin", |x, y| (x / y).sin(), false),
        ("cos", |x, y| (x / y).cos(), false),
        ("sqrt", |x, y| (x / y).sqrt(), false),
        ("min", |x, y| x.min(y), true),
        ("max", |x, y| x.max(y), true),
        ("min of max", |x, y| x.max(y * 0.5).min(y), true),
    ];
    for (name, map, y_grad) in maps {
        let g = Graph::new();
        let x = g.inputs(N);
        let y = if y_grad {
            g.inputs(N)
        } else {
            g.inputs_without_grad(N)
        };
        let outs: Vec<Value> = x.iter().zip(&y).map(|(&a, &b)| map(a, b)).collect();
        g.set_loss(g.sum(outs.iter().map(|&o| o * 0.5))).unwrap();
        let mut backends = interpreter_and_every_jit_level(&g);
        common::assert_backends_agree_on(name, &mut backends, &script);
        let jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
        let stats = jit.stats();
        assert!(stats.loops > 0, "{name}: the map is no loop");
        // A map of one op and its scaling is a loop of scalar code (which LLVM vectorizes);
        // a longer body is a nest, in lanes.
        let one_op = name == "min" || name == "max";
        assert!(
            one_op || (stats.nests.iter()).any(|n| n.lanes && n.backward_lanes),
            "{name}: the map runs in no lanes: {:?}",
            stats.nests
        );
    }
}
