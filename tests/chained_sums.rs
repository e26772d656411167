//! Dots added up one `+` at a time (`s = s + w * x`, micrograd's `sum((wi * xi for ...),
//! b)`): loop recovery runs them as dots whose partial sums stay in registers. Every graph
//! runs bit for bit against the interpreter (values and gradients of every node, the
//! partial sums' recomputed), at every level.

mod common;

use common::{assert_backends_agree, interpreter_and_every_jit_level, native_stats, random_inputs};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::{Graph, Program, Value};

/// `first + w[0] * x[0] + w[1] * x[1] + ...`, one `+` at a time.
fn chained<'g>(first: Value<'g>, w: &[Value<'g>], x: &[Value<'g>]) -> Value<'g> {
    w.iter().zip(x).fold(first, |s, (&w, &x)| s + w * x)
}

/// `n` neurons over `x`, each a bias and a weight per input added as a chain.
fn layer<'g>(g: &'g Graph, x: &[Value<'g>], n: usize, rng: &mut StdRng) -> Vec<Value<'g>> {
    (0..n)
        .map(|_| {
            let w: Vec<Value> = x
                .iter()
                .map(|_| g.param(rng.gen_range(-0.5..0.5)))
                .collect();
            chained(g.param(rng.gen_range(-0.1..0.1)), &w, x)
        })
        .collect()
}

/// Checks every backend against the interpreter; the share of the tape's operations in loops.
fn check(name: &str, g: &Graph) -> f64 {
    let mut backends = interpreter_and_every_jit_level(g);
    assert_backends_agree(name, &mut backends, &mut StdRng::seed_from_u64(7));
    let stats = native_stats(g);
    stats.loop_nodes as f64 / backends[0].program.tape().op_nodes() as f64
}

#[test]
fn an_mlp_whose_neurons_add_one_plus_at_a_time_runs_as_loops() {
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(1);
    let x = g.inputs(20);
    let h: Vec<Value> = layer(&g, &x, 12, &mut rng)
        .iter()
        .map(|v| v.tanh())
        .collect();
    let out = layer(&g, &h, 3, &mut rng);
    let errors: Vec<Value> = out.iter().map(|&o| (o - 0.5).powf(2.0)).collect();
    g.set_loss(g.sum(&errors)).unwrap();
    let covered = check("chained MLP", &g);
    assert!(covered > 0.9, "only {covered:.2} of the nodes in loops");
}

#[test]
fn a_chain_ends_where_a_partial_sum_is_read_elsewhere() {
    // Partial sums read by an output, by another node, by the loss's other term; a product
    // read twice; the first addition with its operands the other way round.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(2);
    let x = g.inputs(60);
    let w: Vec<Value> = (0..60).map(|_| g.param(rng.gen_range(-0.5..0.5))).collect();
    let mut s = w[0] * x[0] + g.param(0.2);
    let mut extra = Vec::new();
    for t in 1..60 {
        let p = w[t] * x[t];
        s += p;
        match t {
            12 => drop(g.add_output(s).unwrap()),
            25 => extra.push(s.tanh()),
            40 => extra.push(p.exp()),
            _ => {}
        }
    }
    extra.push(s);
    g.set_loss(g.sum(&extra).powf(2.0)).unwrap();
    check("interrupted chain", &g);
}

#[test]
fn chains_too_short_for_a_loop_and_chains_of_inputs_without_gradient() {
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(3);
    let x = g.inputs_without_grad(30);
    let short = layer(&g, &x[..5], 4, &mut rng);
    let long = layer(&g, &x, 6, &mut rng);
    // A chain whose first term is an input and whose products are of inputs alone.
    let inputs_only = chained(x[0], &x[1..15], &x[2..16]);
    let terms: Vec<Value> = short.iter().chain(&long).map(|v| v.relu()).collect();
    g.set_loss(g.sum(&terms) * inputs_only.tanh()).unwrap();
    check("short chains", &g);
}

#[test]
fn train_merges_a_chained_first_layer_bit_for_bit() {
    // `train` merges a first layer's update with the next sample's forward and skips the
    // zero pixels; with the layer added as chains it must end where `step` per sample ends.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(4);
    let (nin, classes) = (24, 3);
    let pixels = g.inputs_without_grad(nin);
    let target = g.inputs_without_grad(classes);
    let h: Vec<Value> = layer(&g, &pixels, 10, &mut rng)
        .iter()
        .map(|v| v.relu())
        .collect();
    let logits = layer(&g, &h, classes, &mut rng);
    g.set_loss(tapejit::nn::softmax_cross_entropy(&logits, &target).unwrap())
        .unwrap();
    assert!(native_stats(&g).merged_train, "train merges nothing");
    let width = g.num_inputs();
    let inputs: Vec<f64> = (0..6)
        .flat_map(|s| {
            let mut x = random_inputs(&mut rng, width);
            // Zero pixels, as images have, for the skipping loop.
            x.iter_mut().take(nin).step_by(3).for_each(|v| *v = 0.0);
            x[nin..].fill(0.0);
            x[nin + s % classes] = 1.0;
            x
        })
        .collect();
    let mut reference = tapejit::Interpreter::new(&g).unwrap();
    let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
    let want = bits(
        inputs
            .chunks(width)
            .map(|x| reference.step(x, 0.05).unwrap())
            .collect(),
    );
    for mut b in interpreter_and_every_jit_level(&g) {
        let p = b.program.as_mut();
        let at = &b.name;
        assert_eq!(bits(p.train(&inputs, 0.05).unwrap()), want, "{at}: losses");
        assert_eq!(bits(p.params()), bits(reference.params()), "{at}: params");
        // Minibatches on two threads, from where `train` ended, against the interpreter's.
        let mut again = tapejit::Interpreter::new(&g).unwrap();
        again.set_params(&p.params()).unwrap();
        let minibatch = p.train_minibatches(&inputs, 3, 0.05, 2).unwrap();
        assert_eq!(
            bits(minibatch),
            bits(again.train_minibatches(&inputs, 3, 0.05, 1).unwrap()),
            "{at}: minibatch losses"
        );
        assert_eq!(
            bits(p.params()),
            bits(again.params()),
            "{at}: minibatch params"
        );
    }
}

#[test]
fn a_batch_written_as_copies_of_a_chained_mlp() {
    // The same chained layers (shared weights) applied to 6 samples, their errors summed:
    // copies of one another, nested once.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(5);
    let (nin, hidden) = (10, 9);
    let w1: Vec<Vec<Value>> = (0..hidden)
        .map(|_| {
            (0..=nin)
                .map(|_| g.param(rng.gen_range(-0.5..0.5)))
                .collect()
        })
        .collect();
    let w2: Vec<Value> = (0..=hidden)
        .map(|_| g.param(rng.gen_range(-0.5..0.5)))
        .collect();
    let errors: Vec<Value> = (0..6)
        .map(|_| {
            let x = g.inputs(nin);
            let h: Vec<Value> = (w1.iter())
                .map(|w| chained(w[nin], &w[..nin], &x).tanh())
                .collect();
            let y = g.input();
            (chained(w2[hidden], &w2[..hidden], &h) - y).powf(2.0)
        })
        .collect();
    g.set_loss(g.sum(&errors)).unwrap();
    let covered = check("chained copies", &g);
    assert!(covered > 0.9, "only {covered:.2} of the nodes in loops");
}

#[test]
fn an_l2_term_chained_over_params_a_layer_moves() {
    // The layout pass moves a nest's weights input-major; a chain over them in creation
    // order (`reg = reg + w * w`) then reads them out of order and runs straight-line.
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(6);
    let x = g.inputs(12);
    let w: Vec<Vec<Value>> = (0..8)
        .map(|_| (0..12).map(|_| g.param(rng.gen_range(-0.5..0.5))).collect())
        .collect();
    let out: Vec<Value> = (w.iter())
        .map(|w| chained(g.param(0.1), w, &x).tanh())
        .collect();
    let l2 = w.iter().flatten().fold(g.constant(0.0), |s, &w| s + w * w);
    g.set_loss(g.sum(&out) + l2 * 0.01).unwrap();
    check("chained L2", &g);
}
