//! `Program::train_minibatches`: the documented order of additions, the same bits on every
//! backend and every thread count, and typed errors for bad arguments.

mod common;

use common::{interpreter_and_every_jit_level, native_stats};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::minibatch::CHUNK;
use tapejit::nn::{Activation, Classifier, Layer};
use tapejit::{Error, Graph, Interpreter, Jit, OptLevel, Program, Tiering, Value, ZeroSkipping};

const NIN: usize = 12;
const CLASSES: usize = 3;
const WIDTH: usize = NIN + CLASSES;

/// 13 hidden units: rows of 13 weights, laid out as rows of 16 starting on cache lines, so
/// the params' addresses hold gaps that the minibatch's update walks over.
fn classifier(g: &Graph) {
    Classifier::new(g, NIN, &[13], CLASSES, &mut StdRng::seed_from_u64(21)).unwrap();
}

fn samples(n: usize, seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(n * WIDTH);
    for _ in 0..n {
        out.extend((0..NIN).map(|_| {
            if rng.gen_bool(0.5) {
                0.0
            } else {
                rng.gen_range(-1.0..1.0)
            }
        }));
        let label = rng.gen_range(0..CLASSES);
        out.extend((0..CLASSES).map(|k| (k == label) as u8 as f64));
    }
    out
}

/// The documented algorithm through the public API, one sample at a time: per minibatch,
/// chunks of `CHUNK` samples each summing gradients from 0 as `backward` accumulates them,
/// the chunks added in order, then `p -= (lr / m) * g`. Returns the losses and the last
/// minibatch's mean gradient.
fn by_hand(p: &mut dyn Program, inputs: &[f64], batch: usize, lr: f64) -> (Vec<f64>, Vec<f64>) {
    by_hand_of_width(p, inputs, WIDTH, batch, lr)
}

/// [`by_hand`] for samples of `width` inputs.
fn by_hand_of_width(
    p: &mut dyn Program,
    inputs: &[f64],
    width: usize,
    batch: usize,
    lr: f64,
) -> (Vec<f64>, Vec<f64>) {
    let samples: Vec<&[f64]> = inputs.chunks(width).collect();
    let mut losses = Vec::new();
    let mut mean = Vec::new();
    for minibatch in samples.chunks(batch) {
        let mut total: Option<Vec<f64>> = None;
        for chunk in minibatch.chunks(CHUNK) {
            p.zero_grad();
            for x in chunk {
                p.set_inputs(x).unwrap();
                losses.push(p.forward());
                p.backward().unwrap();
            }
            let g = p.param_grads();
            total = Some(match total {
                None => g,
                Some(t) => t.iter().zip(&g).map(|(a, b)| a + b).collect(),
            });
        }
        let (m, total) = (minibatch.len() as f64, total.unwrap());
        mean = total.iter().map(|g| g / m).collect();
        let params: Vec<f64> = p
            .params()
            .iter()
            .zip(&total)
            .map(|(w, g)| w - (lr / m) * g)
            .collect();
        p.set_params(&params).unwrap();
    }
    (losses, mean)
}

fn bits(xs: &[f64]) -> Vec<u64> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_backend_and_thread_count_follows_the_documented_order() {
    let g = Graph::new();
    classifier(&g);
    let inputs = samples(75, 22);
    for batch in [1, 5, CHUNK, 2 * CHUNK, 40, 100] {
        let mut reference = Interpreter::new(&g).unwrap();
        let (want_losses, want_mean) = by_hand(&mut reference, &inputs, batch, 0.1);
        // (The JIT's threads cut the first layer by rows: 4 threads take 6 rows each.)
        for threads in [1, 2, 3, 4] {
            for mut b in interpreter_and_every_jit_level(&g) {
                let at = format!("{}, batch {batch}, {threads} threads", b.name);
                let p = b.program.as_mut();
                let losses = p.train_minibatches(&inputs, batch, 0.1, threads).unwrap();
                assert_eq!(bits(&losses), bits(&want_losses), "{at}: losses");
                assert_eq!(bits(&p.params()), bits(&reference.params()), "{at}: params");
                assert_eq!(
                    bits(&p.param_grads()),
                    bits(&want_mean),
                    "{at}: mean gradient"
                );
                // The last sample's values and gradients, as after its forward and backward.
                let kept = common::kept_slots(&reference, p);
                let mut last = Interpreter::new(&g).unwrap();
                let before: Vec<f64> = {
                    // Params before the last minibatch's update, recomputed by hand.
                    let mut q = Interpreter::new(&g).unwrap();
                    let whole = inputs.len() / WIDTH;
                    let done = (whole - 1) / batch * batch;
                    by_hand(&mut q, &inputs[..done * WIDTH], batch, 0.1);
                    q.params()
                };
                last.set_params(&before).unwrap();
                last.set_inputs(&inputs[inputs.len() - WIDTH..]).unwrap();
                last.forward();
                last.backward().unwrap();
                let params = reference.params().len();
                let values: Vec<usize> = kept.iter().copied().filter(|&s| s >= params).collect();
                for s in values {
                    assert_eq!(
                        p.values()[s].to_bits(),
                        last.values()[s].to_bits(),
                        "{at}: value {s}"
                    );
                    // And its gradients, but the params'.
                    assert_eq!(
                        p.grads()[s].to_bits(),
                        last.grads()[s].to_bits(),
                        "{at}: gradient {s}"
                    );
                }
            }
        }
    }
}

/// On several threads the JIT cuts the classifier's first layer (on inputs without
/// gradient, skipping zero inputs) by its rows, each thread owning a range of them; the
/// test above checks that this changes no bit.
#[test]
fn the_jit_cuts_a_first_layer_by_rows() {
    let g = Graph::new();
    classifier(&g);
    let jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    assert_eq!(jit.stats().split_rows, NIN);
    let never = Jit::builder()
        .tiering(Tiering::Off)
        .zero_skipping(ZeroSkipping::Never)
        .compile(&g)
        .unwrap();
    assert_eq!(never.stats().split_rows, 0, "not without zero-skipping");
}

/// `steps` steps of `x' = x + ((x - left) * k - x * x * c)` from `x`: a nest of steps run one
/// after the other, whose intermediate values and gradients live in registers
/// (`plan::local`), in `accumulate`'s forward and backward too.
fn roll<'g>(mut x: Vec<Value<'g>>, (k, c): (Value<'g>, Value<'g>), steps: usize) -> Vec<Value<'g>> {
    for _ in 0..steps {
        x = (0..x.len())
            .map(|i| x[i] + ((x[i] - x[i.saturating_sub(1)]) * k - x[i] * x[i] * c))
            .collect();
    }
    x
}

/// Minibatch SGD on `p` gives the losses, params and mean gradient of [`by_hand_of_width`]
/// (`want`, and `reference`'s params after it).
fn assert_documented(
    at: &str,
    p: &mut dyn Program,
    inputs: &[f64],
    (batch, lr, threads): (usize, f64, usize),
    want: &(Vec<f64>, Vec<f64>),
    reference: &Interpreter,
) {
    let losses = p.train_minibatches(inputs, batch, lr, threads).unwrap();
    assert_eq!(bits(&losses), bits(&want.0), "{at}: losses");
    assert_eq!(bits(&p.params()), bits(&reference.params()), "{at}: params");
    assert_eq!(bits(&p.param_grads()), bits(&want.1), "{at}: mean gradient");
}

/// A rollout of 30 steps over 6 states ([`roll`]): every backend and thread count follows
/// the documented order.
#[test]
fn a_rollout_trains_in_minibatches_as_documented() {
    let g = Graph::new();
    let params = (g.param(-0.2), g.param(0.01));
    let x = roll(g.inputs(6), params, 30);
    g.set_loss(g.sum(x.iter().map(|&v| v * v))).unwrap();
    let stats = native_stats(&g);
    assert!(stats.local_values > 0 && stats.local_grads > 0, "{stats:?}");
    let mut rng = StdRng::seed_from_u64(23);
    let inputs: Vec<f64> = (0..40 * 6).map(|_| rng.gen_range(-0.5..0.5)).collect();
    for batch in [1, CHUNK, 40] {
        let mut reference = Interpreter::new(&g).unwrap();
        let want = by_hand_of_width(&mut reference, &inputs, 6, batch, 0.001);
        for threads in [1, 2] {
            for mut b in interpreter_and_every_jit_level(&g) {
                let at = format!("{}, batch {batch}, {threads} threads", b.name);
                let run = (batch, 0.001, threads);
                assert_documented(&at, b.program.as_mut(), &inputs, run, &want, &reference);
            }
        }
    }
}

/// A layer over inputs without gradient (whose zero inputs `accumulate` skips, in its own
/// forward and backward function 0) followed by a rollout over the layer's outputs: every
/// level and thread count follows the documented order.
#[test]
fn a_skipping_layer_then_a_rollout_trains_as_documented() {
    let g = Graph::new();
    let layer = Layer::new(&g, NIN, 9, Activation::Tanh, &mut StdRng::seed_from_u64(4));
    let params = (g.param(-0.2), g.param(0.01));
    let x = roll(layer.call(&g.inputs_without_grad(NIN)).unwrap(), params, 4);
    g.set_loss(g.sum(x.iter().map(|&v| v * v))).unwrap();
    let jit = Jit::builder()
        .tiering(Tiering::Off)
        .zero_skipping(ZeroSkipping::Always);
    let stats = jit.compile(&g).unwrap().stats().clone();
    assert!(stats.local_values > 0, "{stats:?}");
    let mut rng = StdRng::seed_from_u64(24);
    let inputs: Vec<f64> = (0..40 * NIN)
        .map(|_| match rng.gen_bool(0.5) {
            true => 0.0,
            false => rng.gen_range(-1.0..1.0),
        })
        .collect();
    for batch in [1, CHUNK, 40] {
        let mut reference = Interpreter::new(&g).unwrap();
        let want = by_hand_of_width(&mut reference, &inputs, NIN, batch, 0.01);
        for threads in [1, 2] {
            for level in OptLevel::ALL {
                let mut p = jit.clone().opt_level(level).compile(&g).unwrap();
                let at = format!("{level:?}, batch {batch}, {threads} threads");
                let run = (batch, 0.01, threads);
                assert_documented(&at, &mut p, &inputs, run, &want, &reference);
            }
        }
    }
}

#[test]
fn bad_arguments_are_typed_errors_and_change_nothing() {
    let g = Graph::new();
    classifier(&g);
    let inputs = samples(4, 23);
    for mut b in interpreter_and_every_jit_level(&g) {
        let p = b.program.as_mut();
        let before = p.params();
        assert!(matches!(
            p.train_minibatches(&inputs, 0, 0.1, 1),
            Err(Error::EmptyMinibatch)
        ));
        assert!(matches!(
            p.train_minibatches(&inputs[..WIDTH + 1], 2, 0.1, 1),
            Err(Error::WrongLength { .. })
        ));
        assert!(matches!(
            p.train_minibatches(&[], 2, 0.1, 1),
            Err(Error::WrongLength { .. })
        ));
        let mut bad = inputs.clone();
        bad[WIDTH + 3] = f64::NAN;
        assert!(matches!(
            p.train_minibatches(&bad, 2, 0.1, 2),
            Err(Error::NonFinite { .. })
        ));
        assert!(matches!(
            p.train_minibatches(&inputs, 2, f64::INFINITY, 2),
            Err(Error::NonFiniteLearningRate { .. })
        ));
        assert_eq!(bits(&p.params()), bits(&before), "{}", b.name);
        // Threads 0: one per core.
        p.train_minibatches(&inputs, 3, 0.1, 0).unwrap();
    }
    let g = Graph::new();
    let x = g.input();
    g.add_output(x * 2.0).unwrap();
    let mut p = Interpreter::new(&g).unwrap();
    assert!(matches!(
        p.train_minibatches(&[1.0], 1, 0.1, 1),
        Err(Error::NoLoss)
    ));
}

/// `accumulate` and `train`, which only minibatches and `train` run, are compiled when they
/// are first called: compiling a program costs nothing for them, the first call links each
/// (once), the stats and the IR say so, and the bits stay the interpreter's.
#[test]
fn minibatches_and_train_compile_their_code_on_first_use() {
    let g = Graph::new();
    classifier(&g);
    let inputs = samples(40, 23);
    let mut jit = tapejit::Jit::builder()
        .tiering(Tiering::Off)
        .keep_ir(true)
        .compile(&g)
        .unwrap();
    let compiled = jit.stats().clone();
    assert_eq!(compiled.first_use_compile_secs, 0.0);
    let ir = jit.ir().unwrap();
    assert!(!ir.contains("@accumulate(") && !ir.contains("@train("));
    let mut reference = Interpreter::new(&g).unwrap();
    for round in 0..2 {
        let losses = jit.train_minibatches(&inputs, 8, 0.1, 2).unwrap();
        let want = reference.train_minibatches(&inputs, 8, 0.1, 1).unwrap();
        assert_eq!(bits(&losses), bits(&want), "round {round}");
        assert_eq!(
            bits(&jit.params()),
            bits(&reference.params()),
            "round {round}"
        );
        let stats = jit.stats();
        assert!(stats.first_use_compile_secs > 0.0);
        assert_eq!(stats.modules, compiled.modules + 1, "linked once");
        assert!(stats.functions > compiled.functions);
        assert!(jit.ir().unwrap().contains("define void @accumulate("));
    }
    for round in 0..2 {
        let losses = jit.train(&inputs, 0.05).unwrap();
        let want = reference.train(&inputs, 0.05).unwrap();
        assert_eq!(bits(&losses), bits(&want), "train round {round}");
        assert_eq!(
            bits(&jit.params()),
            bits(&reference.params()),
            "train round {round}"
        );
        assert_eq!(jit.stats().modules, compiled.modules + 2, "linked once");
        assert!(jit.ir().unwrap().contains("define void @train("));
    }
    // `step` is unaffected by the extra modules.
    let one = &inputs[..WIDTH];
    assert_eq!(
        jit.step(one, 0.05).unwrap().to_bits(),
        reference.step(one, 0.05).unwrap().to_bits()
    );
    assert_eq!(bits(&jit.params()), bits(&reference.params()));
}

/// `JitBuilder::compile_ahead`: both lazy modules compiled and linked with the rest, tiered
/// or not, so no call compiles; the same bits.
#[test]
fn compile_ahead_links_train_and_accumulate_with_the_rest() {
    let g = Graph::new();
    classifier(&g);
    let inputs = samples(40, 29);
    let lazy = tapejit::Jit::builder()
        .tiering(Tiering::Off)
        .compile(&g)
        .unwrap();
    for tiering in [Tiering::Off, Tiering::Auto] {
        let mut jit = tapejit::Jit::builder()
            .tiering(tiering)
            .compile_ahead(true)
            .compile(&g)
            .unwrap();
        jit.wait_for_native().unwrap();
        let compiled = jit.stats().clone();
        assert_eq!(compiled.modules, lazy.stats().modules + 2, "{tiering:?}");
        let mut reference = Interpreter::new(&g).unwrap();
        let losses = jit.train_minibatches(&inputs, 8, 0.1, 2).unwrap();
        let want = reference.train_minibatches(&inputs, 8, 0.1, 1).unwrap();
        assert_eq!(bits(&losses), bits(&want), "{tiering:?}");
        let losses = jit.train(&inputs, 0.05).unwrap();
        let want = reference.train(&inputs, 0.05).unwrap();
        assert_eq!(bits(&losses), bits(&want), "{tiering:?}");
        assert_eq!(bits(&jit.params()), bits(&reference.params()));
        let stats = jit.stats();
        assert_eq!(stats.first_use_compile_secs, 0.0, "{tiering:?}: {stats:?}");
        assert_eq!(stats.modules, compiled.modules, "nothing compiled on use");
    }
}

/// A non-finite number in a later minibatch, in a chunk of either thread, stops every thread
/// at that minibatch: the error names the first such number, and params, values and
/// gradients are as before the call (the threads train copies, written back only at the end).
#[test]
fn a_non_finite_sample_stops_minibatches_and_changes_nothing() {
    let g = Graph::new();
    classifier(&g);
    let clean = samples(200, 31);
    for mut b in interpreter_and_every_jit_level(&g) {
        let p = b.program.as_mut();
        p.train_minibatches(&clean[..40 * WIDTH], 20, 0.1, 2)
            .unwrap();
        let before = (p.params(), p.values().to_vec(), p.grads().to_vec());
        // Minibatches of 40 (chunks 0-2 of 16, 16 and 8 samples): the bad sample in the first
        // minibatch's first chunk, a later minibatch's second chunk (the other thread's on
        // two), the last sample; and two bad samples, the earlier one reported.
        for (bad_samples, first) in [
            (vec![0], 0),
            (vec![3 * 40 + 20], 3 * 40 + 20),
            (vec![199], 199),
            (vec![130, 121], 121),
        ] {
            for threads in [1, 2] {
                let at = format!("{}: {bad_samples:?} on {threads} threads", b.name);
                let mut inputs = clean.clone();
                for &s in &bad_samples {
                    inputs[s * WIDTH + 4] = f64::NAN;
                }
                match p.train_minibatches(&inputs, 40, 0.1, threads) {
                    Err(Error::NonFinite {
                        what: "input",
                        index,
                        ..
                    }) => assert_eq!(index, first * WIDTH + 4, "{at}"),
                    other => panic!("{at}: expected NonFinite, got {:?}", other.map(|l| l.len())),
                }
                assert_eq!(bits(&p.params()), bits(&before.0), "{at}: params");
                assert_eq!(bits(p.values()), bits(&before.1), "{at}: values");
                assert_eq!(bits(p.grads()), bits(&before.2), "{at}: grads");
            }
        }
    }
}
