//! `train` skipping zero inputs (`JitBuilder::zero_skipping`) ends where the interpreter's
//! `step` per sample ends, bit for bit, in every case IEEE arithmetic makes observable: -0
//! biases and sums, -0 weights and inputs, weights and gradients that stop being finite
//! mid-training, all-zero and fully dense inputs, sparse hidden activations. So does
//! `train_minibatches`, which skips them too, where the interpreter's ends.

mod common;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program, Tiering, ZeroSkipping};

const NIN: usize = 24;
/// Rows of 13 weights, which the buffers lay out as rows of 16 starting on cache lines (the
/// gaps lie among the weights every test here skips over).
const HIDDEN: usize = 13;
const CLASSES: usize = 3;
const WIDTH: usize = NIN + CLASSES;

/// Samples whose pixels are 0 with probability `zeros` (a -0 with probability `negative`
/// among those), else uniform in `[0, scale)`; one-hot labels.
fn samples(rng: &mut StdRng, n: usize, zeros: f64, negative: f64, scale: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(n * WIDTH);
    for _ in 0..n {
        for _ in 0..NIN {
            out.push(if rng.gen_bool(zeros) {
                if rng.gen_bool(negative) {
                    -0.0
                } else {
                    0.0
                }
            } else {
                rng.gen_range(0.0..scale)
            });
        }
        let label = rng.gen_range(0..CLASSES);
        out.extend((0..CLASSES).map(|k| (k == label) as u8 as f64));
    }
    out
}

/// Asserts `got` is `want` bit for bit, any NaN matching any NaN (the interpreter and the
/// JIT agree on where NaN arises, not on its sign: x86's default NaN is negative).
fn assert_same(at: &str, what: &str, want: &[f64], got: &[f64]) {
    assert_eq!(want.len(), got.len(), "{at}: {what}: lengths");
    for (i, (w, g)) in want.iter().zip(got).enumerate() {
        let same = w.to_bits() == g.to_bits() || (w.is_nan() && g.is_nan());
        assert!(same, "{at}: {what} #{i}: interpreter {w:e}, jit {g:e}");
    }
}

/// The first layer's params of a `NIN-HIDDEN-CLASSES` classifier: neuron by neuron, `NIN`
/// weights then the bias.
fn first_layer(params: &mut [f64]) -> &mut [f64] {
    &mut params[..HIDDEN * (NIN + 1)]
}

/// Minibatch sizes and thread counts `train_minibatches` runs with (a minibatch of one
/// sample, chunks shorter than `tapejit`'s 16, two chunks on two threads, and more than 64
/// samples, whose rows' masks take two words).
const MINIBATCHES: [(usize, usize); 4] = [(1, 1), (5, 2), (20, 2), (70, 3)];

/// Runs `runs` (each a batch of samples and a learning rate) through the interpreter's `step`
/// and through `train` of the JIT at every level and skipping setting, from `params`, and
/// demands the same losses, params, gradients and outputs, bit for bit; and the same for
/// `train_minibatches` (whose JIT skips zero inputs as `train` does) against the
/// interpreter's.
fn assert_train_exact(what: &str, params: &[f64], runs: &[(Vec<f64>, f64)]) {
    let g = Graph::new();
    Classifier::new(&g, NIN, &[HIDDEN], CLASSES, &mut StdRng::seed_from_u64(3)).unwrap();
    assert_train_exact_on(&g, what, params, runs);
}

/// [`assert_train_exact`] on the graph `g`.
fn assert_train_exact_on(g: &Graph, what: &str, params: &[f64], runs: &[(Vec<f64>, f64)]) {
    let mut reference = Interpreter::new(g).unwrap();
    reference.set_params(params).unwrap();
    let mut want_losses = Vec::new();
    for (inputs, lr) in runs {
        for x in inputs.chunks(g.num_inputs()) {
            want_losses.push(reference.step(x, *lr).unwrap());
        }
    }
    let minibatch_references = minibatch_references(g, params, runs);
    for level in OptLevel::ALL {
        for skipping in [
            ZeroSkipping::Auto,
            ZeroSkipping::Always,
            ZeroSkipping::Never,
        ] {
            let at = format!("{what}, {level:?}, {skipping:?}");
            let mut jit = Jit::builder()
                .tiering(Tiering::Off)
                .opt_level(level)
                .zero_skipping(skipping)
                .compile(g)
                .unwrap();
            // The merged first layer, skipping zero inputs unless told not to.
            let stats = jit.stats();
            assert!(stats.merged_train, "{at}: train merges nothing");
            let skips = skipping != ZeroSkipping::Never;
            assert_eq!(stats.zero_skipping, skips, "{at}: zero-skipping");
            jit.set_params(params).unwrap();
            let mut losses = Vec::new();
            for (inputs, lr) in runs {
                losses.extend(jit.train(inputs, *lr).unwrap());
            }
            assert_same(&at, "losses", &want_losses, &losses);
            assert_same(&at, "params", &reference.params(), &jit.params());
            assert_same(&at, "grads", &reference.param_grads(), &jit.param_grads());
            assert_same(&at, "outputs", &reference.outputs(), &jit.outputs());
            // Every value both keep: the first layer's sums too, whose sign of zero the
            // params may not show.
            let kept = common::kept_slots(&reference, &jit);
            let values = |p: &dyn Program| kept.iter().map(|&s| p.values()[s]).collect::<Vec<_>>();
            assert_same(&at, "values", &values(&reference), &values(&jit));

            for (k, &(batch, threads)) in MINIBATCHES.iter().enumerate() {
                let at = format!("{at}, minibatches of {batch} on {threads} threads");
                let (want, want_losses) = &minibatch_references[k];
                jit.set_params(params).unwrap();
                let mut losses = Vec::new();
                for (inputs, lr) in runs {
                    losses.extend(jit.train_minibatches(inputs, batch, *lr, threads).unwrap());
                }
                assert_same(&at, "losses", want_losses, &losses);
                assert_same(&at, "params", &want.params(), &jit.params());
                assert_same(&at, "grads", &want.param_grads(), &jit.param_grads());
                assert_same(&at, "values", &values(want), &values(&jit));
            }
        }
    }
}

/// The interpreter after `train_minibatches` over `runs` from `params`, and the losses, for
/// each of [`MINIBATCHES`].
fn minibatch_references(
    g: &Graph,
    params: &[f64],
    runs: &[(Vec<f64>, f64)],
) -> Vec<(Interpreter, Vec<f64>)> {
    MINIBATCHES
        .iter()
        .map(|&(batch, threads)| {
            let mut reference = Interpreter::new(g).unwrap();
            reference.set_params(params).unwrap();
            let mut losses = Vec::new();
            for (inputs, lr) in runs {
                let got = reference.train_minibatches(inputs, batch, *lr, threads);
                losses.extend(got.unwrap());
            }
            (reference, losses)
        })
        .collect()
}

fn initial_params() -> Vec<f64> {
    let g = Graph::new();
    Classifier::new(&g, NIN, &[HIDDEN], CLASSES, &mut StdRng::seed_from_u64(3)).unwrap();
    Interpreter::new(&g).unwrap().params().to_vec()
}

#[test]
fn sparse_dense_and_all_zero_inputs() {
    let mut rng = StdRng::seed_from_u64(1);
    for (what, zeros) in [
        ("sparse", 0.8),
        ("dense", 0.0),
        ("all zero", 1.0),
        ("half", 0.5),
    ] {
        let runs = vec![
            (samples(&mut rng, 9, zeros, 0.0, 1.0), 0.05),
            (samples(&mut rng, 1, zeros, 0.0, 1.0), 0.05),
            (samples(&mut rng, 6, zeros, 0.0, 1.0), 0.2),
        ];
        assert_train_exact(what, &initial_params(), &runs);
    }
    // Dense samples make the next ones run dense for a while, sparse ones skip again.
    let mut mixed = samples(&mut rng, 3, 0.0, 0.0, 1.0);
    mixed.extend(samples(&mut rng, 12, 0.85, 0.0, 1.0));
    mixed.extend(samples(&mut rng, 2, 0.1, 0.0, 1.0));
    mixed.extend(samples(&mut rng, 12, 0.85, 0.0, 1.0));
    assert_train_exact("dense, then sparse", &initial_params(), &[(mixed, 0.05)]);
}

#[test]
fn negative_zero_inputs() {
    let mut rng = StdRng::seed_from_u64(2);
    let runs = vec![(samples(&mut rng, 12, 0.7, 0.5, 1.0), 0.05)];
    assert_train_exact("-0 inputs", &initial_params(), &runs);
}

#[test]
fn negative_zero_biases_meet_zero_inputs() {
    // b = -0 and every input 0: the interpreter's sum becomes +0 with the first +0 product
    // (a positive weight times 0); the skipping loop's stays -0 and is redone.
    let mut params = initial_params();
    for neuron in first_layer(&mut params).chunks_mut(NIN + 1) {
        neuron[NIN] = -0.0;
    }
    let mut rng = StdRng::seed_from_u64(4);
    let mut runs = vec![(samples(&mut rng, 5, 1.0, 0.0, 1.0), 0.05)];
    // Negative weights only: every product is -0 and the sums stay -0 in both.
    let mut negative = params.clone();
    for neuron in first_layer(&mut negative).chunks_mut(NIN + 1) {
        for w in &mut neuron[..NIN] {
            *w = -w.abs() - 0.01;
        }
    }
    // Negative weights but the last input's: on several threads, the threads before the
    // last hand on sums of -0, and the last thread's +0 product makes them +0.
    let mut handed_on = negative.clone();
    for neuron in first_layer(&mut handed_on).chunks_mut(NIN + 1) {
        neuron[NIN - 1] = 0.5;
    }
    assert_train_exact("-0 biases, positive and negative weights", &params, &runs);
    assert_train_exact("-0 biases, negative weights", &negative, &runs);
    assert_train_exact(
        "-0 biases, negative weights but the last",
        &handed_on,
        &runs,
    );
    runs.push((samples(&mut rng, 5, 0.9, 0.5, 1.0), 0.05));
    assert_train_exact("-0 biases, then sparse inputs", &params, &runs);
}

#[test]
fn negative_zero_weights_and_learning_rates() {
    // A skipped update subtracts `lr * +0`: nothing for lr > 0, but `-0 - (-0)` is +0, so a
    // negative (or -0) learning rate turns -0 weights into +0 where zero inputs meet them.
    let mut params = initial_params();
    for neuron in first_layer(&mut params).chunks_mut(NIN + 1) {
        neuron[1] = -0.0;
        neuron[NIN - 1] = -0.0;
    }
    let mut rng = StdRng::seed_from_u64(5);
    for lr in [0.05, -0.05, -0.0, 0.0] {
        let runs = vec![(samples(&mut rng, 10, 0.8, 0.3, 1.0), lr)];
        assert_train_exact(&format!("-0 weights, lr {lr}"), &params, &runs);
    }
}

/// A sample whose one nonzero input is input 0.
fn only_input_zero(value: f64, label: usize) -> Vec<f64> {
    let mut x = vec![0.0; WIDTH];
    x[0] = value;
    x[NIN + label] = 1.0;
    x
}

/// Samples whose input 0 is 0.
fn without_input_zero(rng: &mut StdRng, n: usize) -> Vec<f64> {
    let mut out = samples(rng, n, 0.5, 0.0, 1.0);
    for x in out.chunks_mut(WIDTH) {
        x[0] = 0.0;
    }
    out
}

#[test]
fn weights_that_stop_being_finite() {
    // One update overflows input 0's weights to infinity; the next samples' input 0 is 0,
    // and `inf * 0` is NaN in every sum the interpreter computes from then on.
    let mut rng = StdRng::seed_from_u64(6);
    let mut overflow = only_input_zero(1e10, 0);
    overflow.extend(without_input_zero(&mut rng, 3));
    let runs = vec![
        (samples(&mut rng, 4, 0.8, 0.0, 1.0), 0.05),
        (overflow, 1e306),
        (without_input_zero(&mut rng, 4), 0.05),
    ];
    assert_train_exact("overflowing update", &initial_params(), &runs);
    let runs = vec![
        (samples(&mut rng, 4, 0.8, 0.0, 1e10), 1e150),
        (samples(&mut rng, 4, 0.8, 0.0, 1.0), 0.05),
    ];
    assert_train_exact("large updates", &initial_params(), &runs);
}

/// `NIN` inputs and a target; `HIDDEN` units `max(0, b + w0*x0 + ...)` (`Max` picks 0 for
/// a NaN sum, and its gradient is 0 there: a NaN in a sum reaches neither the loss nor the
/// gradients); a linear output, squared error. Params: the units' weights and bias, then
/// the output's weights. The graph's input vector is [`WIDTH`] wide, the target last.
fn nan_swallowing_net(g: &Graph) {
    nan_swallowing_net_with(g, true);
}

/// [`nan_swallowing_net`], its output weights params if `trained`, else constants.
fn nan_swallowing_net_with(g: &Graph, trained: bool) {
    let x = g.inputs_without_grad(NIN);
    let target = g.inputs_without_grad(CLASSES)[0];
    let mut rng = StdRng::seed_from_u64(9);
    let zero = g.constant(0.0);
    let hidden: Vec<_> = (0..HIDDEN)
        .map(|_| {
            let w: Vec<_> = (0..NIN)
                .map(|_| g.param(rng.gen_range(-0.3..0.3)))
                .collect();
            let b = g.param(0.1);
            let mut terms = vec![b];
            terms.extend(w.iter().zip(&x).map(|(&w, &x)| w * x));
            zero.max(g.sum(&terms))
        })
        .collect();
    let out: Vec<_> = hidden
        .iter()
        .map(|&h| {
            let v = rng.gen_range(-0.5..0.5);
            h * if trained { g.param(v) } else { g.constant(v) }
        })
        .collect();
    let error = g.sum(&out) - target;
    g.set_loss(error * error).unwrap();
}

/// Params of [`nan_swallowing_net`] and a sample after which their update overflows input
/// 0's weights to infinity and nothing else: weights 1e-3 from input 0 and output weights of
/// +-0.5, so that with input 0 at 1e10 and a target of 1e300 the first layer's gradients
/// times 1e10 overflow, while the output weights' (the units' outputs, about 1e7, times the
/// error) do not.
fn overflow_setup(g: &Graph) -> (Vec<f64>, Vec<f64>) {
    let mut params = Interpreter::new(g).unwrap().params().to_vec();
    for neuron in first_layer(&mut params).chunks_mut(NIN + 1) {
        neuron[0] = 1e-3;
    }
    let first = HIDDEN * (NIN + 1);
    for (j, v) in params[first..].iter_mut().enumerate() {
        *v = if j % 2 == 0 { 0.5 } else { -0.5 };
    }
    let mut overflow = vec![0.0; WIDTH];
    overflow[0] = 1e10;
    overflow[NIN] = 1e300;
    (params, overflow)
}

#[test]
fn weights_that_stop_being_finite_where_nan_is_swallowed() {
    // The overflowed weights' NaN sums never reach a gradient (`Max` drops them): only the
    // check of the updated weights (or, after `step`, the guard computed again) keeps the
    // later samples from skipping `inf * 0`.
    let g = Graph::new();
    nan_swallowing_net(&g);
    let (params, overflow) = overflow_setup(&g);
    let mut rng = StdRng::seed_from_u64(10);
    let mut first = overflow.clone();
    first.extend(without_input_zero(&mut rng, 3));
    let runs = vec![(first, 0.05), (without_input_zero(&mut rng, 4), 0.05)];
    assert_train_exact_on(&g, "overflow, NaN swallowed", &params, &runs);

    let mut reference = Interpreter::new(&g).unwrap();
    let mut jit = Jit::builder()
        .tiering(Tiering::Off)
        .zero_skipping(ZeroSkipping::Always)
        .compile(&g)
        .unwrap();
    assert!(jit.stats().zero_skipping);
    let sparse = without_input_zero(&mut rng, 5);
    for p in [&mut reference as &mut dyn Program, &mut jit] {
        p.set_params(&params).unwrap();
        p.train(&sparse, 0.05).unwrap();
        p.step(&overflow, 0.05).unwrap();
        p.train(&sparse, 0.05).unwrap();
    }
    assert_same(
        "step, NaN swallowed",
        "params",
        &reference.params(),
        &jit.params(),
    );
    let kept = common::kept_slots(&reference, &jit);
    let values = |p: &dyn Program| kept.iter().map(|&s| p.values()[s]).collect::<Vec<_>>();
    assert_same(
        "step, NaN swallowed",
        "values",
        &values(&reference),
        &values(&jit),
    );
}

#[test]
fn gradients_that_stop_being_finite_where_nan_is_swallowed() {
    // A target so large that the error's gradient overflows: the first layer's gradients are
    // infinite, `inf * 0` is NaN for every weight whose input is 0, and `Max` then drops the
    // NaN sums, so the later gradients are finite again and the NaN weights stay visible.
    let g = Graph::new();
    nan_swallowing_net_with(&g, false);
    let params = Interpreter::new(&g).unwrap().params().to_vec();
    let mut rng = StdRng::seed_from_u64(11);
    let mut inputs = samples(&mut rng, 4, 0.6, 0.0, 1.0);
    inputs[NIN] = 1.7e308;
    assert_train_exact_on(&g, "infinite gradients", &params, &[(inputs, 0.05)]);
}

#[test]
fn gradients_that_stop_being_finite() {
    // Finite first-layer weights, output weights so large that the logits overflow: the
    // gradients reaching the first layer are NaN, and so is `NaN * 0` for every weight.
    let mut params = initial_params();
    let first = HIDDEN * (NIN + 1);
    for w in &mut params[first..] {
        *w = f64::MAX * w.signum();
    }
    let mut rng = StdRng::seed_from_u64(8);
    let runs = vec![(samples(&mut rng, 5, 0.8, 0.0, 1.0), 0.05)];
    assert_train_exact("overflowing logits", &params, &runs);
}

#[test]
fn a_step_between_trains_is_seen() {
    // `step` and `set_params` change weights outside `train`; its next call must see them.
    let g = Graph::new();
    Classifier::new(&g, NIN, &[HIDDEN], CLASSES, &mut StdRng::seed_from_u64(3)).unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    let sparse = without_input_zero(&mut rng, 6);
    let huge = only_input_zero(1e10, 1);
    let mut reference = Interpreter::new(&g).unwrap();
    let mut jit = Jit::builder()
        .tiering(Tiering::Off)
        .zero_skipping(ZeroSkipping::Always)
        .compile(&g)
        .unwrap();
    assert!(jit.stats().zero_skipping);
    for p in [&mut reference as &mut dyn Program, &mut jit] {
        p.train(&sparse, 0.05).unwrap();
        let mut params = p.params();
        first_layer(&mut params)[1] = -0.0;
        p.set_params(&params).unwrap();
        p.train(&sparse, -0.05).unwrap();
        // Overflows the weights outside `train`.
        p.step(&huge, 1e306).unwrap();
        p.train(&sparse, 0.05).unwrap();
    }
    assert_same("step between", "params", &reference.params(), &jit.params());
}

#[test]
fn inputs_at_a_stride_and_a_ragged_last_chunk() {
    // The first layer reads every other input, 13 of them: the list of steps is built one
    // input at a time (not 8), and 13 is not a multiple of 8 either way.
    let (nin, classes) = (13, 3);
    let g = Graph::new();
    let x = g.inputs_without_grad(2 * nin);
    let y = g.inputs_without_grad(classes);
    let picked: Vec<_> = x.iter().step_by(2).copied().collect();
    let mlp = tapejit::nn::MLP::new(&g, nin, &[9, classes], &mut StdRng::seed_from_u64(12));
    let logits = mlp.call(&picked).unwrap();
    g.set_loss(tapejit::nn::softmax_cross_entropy(&logits, &y).unwrap())
        .unwrap();
    let width = 2 * nin + classes;
    let mut rng = StdRng::seed_from_u64(13);
    let mut inputs = Vec::new();
    for _ in 0..12 {
        for _ in 0..2 * nin {
            inputs.push(if rng.gen_bool(0.7) {
                0.0
            } else {
                rng.gen_range(0.0..1.0)
            });
        }
        let label = rng.gen_range(0..classes);
        inputs.extend((0..classes).map(|k| (k == label) as u8 as f64));
    }
    assert_eq!(inputs.len(), 12 * width);
    let params = Interpreter::new(&g).unwrap().params().to_vec();
    assert_train_exact_on(&g, "stride 2, 13 inputs", &params, &[(inputs, 0.05)]);
}

/// `train` on samples one of which holds a non-finite number fails with that number's index
/// and changes nothing, whether it checks every sample first (few samples) or as its steps
/// reach them (many: the JIT stops at the sample, and the buffers are put back).
#[test]
fn a_non_finite_sample_stops_train_and_changes_nothing() {
    let g = Graph::new();
    Classifier::new(&g, NIN, &[HIDDEN], CLASSES, &mut StdRng::seed_from_u64(3)).unwrap();
    let mut rng = StdRng::seed_from_u64(17);
    let warm_up = samples(&mut rng, 5, 0.6, 0.1, 1.0);
    let mut programs: Vec<(String, Box<dyn Program>)> = vec![(
        "interpreter".into(),
        Box::new(Interpreter::new(&g).unwrap()),
    )];
    for level in [OptLevel::O0, OptLevel::O2] {
        for skipping in [ZeroSkipping::Auto, ZeroSkipping::Never] {
            let jit = Jit::builder()
                .tiering(Tiering::Off)
                .opt_level(level)
                .zero_skipping(skipping)
                .compile(&g)
                .unwrap();
            let stats = jit.stats();
            assert!(stats.merged_train);
            assert_eq!(stats.zero_skipping, skipping != ZeroSkipping::Never);
            programs.push((format!("{level:?}, {skipping:?}"), Box::new(jit)));
        }
    }
    for (name, program) in &mut programs {
        program.train(&warm_up, 0.05).unwrap();
        let before = (
            program.params(),
            program.values().to_vec(),
            program.grads().to_vec(),
        );
        // 3 samples are checked first; 6,000 (162,000 numbers, some chunks of them) as
        // `train` goes.
        for n in [3, 6000] {
            let clean = samples(&mut rng, n, 0.6, 0.1, 1.0);
            for (sample, input, bad) in [
                (0, 0, f64::NAN),
                (n / 2 + 1, 5, f64::INFINITY),
                (n - 1, NIN - 1, f64::NEG_INFINITY),
            ] {
                let at = format!("{name}: {n} samples, {bad} in sample {sample}");
                let mut inputs = clean.clone();
                let index = sample * WIDTH + input;
                inputs[index] = bad;
                match program.train(&inputs, 0.05) {
                    Err(tapejit::Error::NonFinite {
                        what: "input",
                        index: i,
                        value,
                    }) => {
                        assert_eq!(i, index, "{at}");
                        assert_eq!(value.to_bits(), bad.to_bits(), "{at}");
                    }
                    Err(other) => panic!("{at}: expected NonFinite, got {other:?}"),
                    Ok(losses) => panic!("{at}: expected NonFinite, trained {}", losses.len()),
                }
                assert_same(&at, "params", &before.0, &program.params());
                assert_same(&at, "values", &before.1, program.values());
                assert_same(&at, "grads", &before.2, program.grads());
            }
        }
    }
}

#[test]
fn a_late_sample_of_a_long_minibatch_with_gradients_that_are_not_finite() {
    // Past the 64th sample (the JIT's rows mark a minibatch's samples in 64-bit words), one
    // whose inputs are so large that its logits overflow: its gradients reaching the first
    // layer are NaN, and `NaN * 0` reaches the weights of its zero inputs too.
    let mut rng = StdRng::seed_from_u64(9);
    let mut inputs = samples(&mut rng, 70, 0.8, 0.0, 1.0);
    for x in &mut inputs[66 * WIDTH..66 * WIDTH + NIN] {
        *x *= 1e300;
    }
    let runs = vec![(inputs, 0.05)];
    assert_train_exact("a late sample overflowing", &initial_params(), &runs);
    // The path under test: the first layer cut by its rows across threads (skipping zero
    // inputs, as `assert_train_exact` runs it too), each row's samples marked in words of 64.
    let g = Graph::new();
    Classifier::new(&g, NIN, &[HIDDEN], CLASSES, &mut StdRng::seed_from_u64(3)).unwrap();
    assert_eq!(
        Jit::builder()
            .tiering(Tiering::Off)
            .compile(&g)
            .unwrap()
            .stats()
            .split_rows,
        NIN
    );
}
