//! Tiered compilation: the first tier (the kernel tier) runs at once, native code takes over
//! between two calls, and every tier gives the interpreter's bits, across the switch too.

mod common;

use common::{build_random_graph, kept_slots, random_inputs, GraphShape, LEARNING_RATE};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tapejit::nn::Classifier;
use tapejit::optim::Adam;
use tapejit::{Cache, Graph, Interpreter, Jit, Program, Tier, Tiering, Value};

/// Bit patterns, every NaN as one (which NaN comes out where two meet is IEEE's choice).
fn bits(xs: &[f64]) -> Vec<u64> {
    xs.iter()
        .map(|x| if x.is_nan() { u64::MAX } else { x.to_bits() })
        .collect()
}

/// A random graph of every op, big enough that its native compile takes a while.
fn random_graph(g: &Graph, seed: u64, nodes: usize) -> Vec<Vec<f64>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let shape = GraphShape {
        nodes,
        inputs: 6,
        params: 12,
        outputs: 3,
        chain_bias: 0.3,
        dead_ends: true,
    };
    build_random_graph(g, &mut rng, shape);
    (0..40).map(|_| random_inputs(&mut rng, 6)).collect()
}

/// A classifier: the layout pass moves its params in the compiled tape.
fn classifier(g: &Graph) -> Vec<Vec<f64>> {
    let c = Classifier::new(g, 12, &[7], 3, &mut StdRng::seed_from_u64(5)).unwrap();
    let _ = c;
    (0..40)
        .map(|i| {
            let mut x: Vec<f64> = (0..12)
                .map(|j| ((i * 12 + j) as f64 * 0.37).sin())
                .collect();
            x.extend([0.0, 0.0, 0.0]);
            x[12 + i % 3] = 1.0;
            x
        })
        .collect()
}

/// Softmaxes written in scalars (max, subtract, exp, sum, divide; the first tier runs each as
/// one unit), of widths 2 to 5 over products of inputs and params, some outputs unread.
fn softmaxes(g: &Graph) -> Vec<Vec<f64>> {
    let x = g.inputs(6);
    let w: Vec<_> = (0..8).map(|i| g.param(0.3 * i as f64 - 1.1)).collect();
    let mut pool: Vec<Value> = (0..6).map(|i| x[i] * w[i]).collect();
    for (width, &scale) in w.iter().enumerate().take(6).skip(2) {
        let operands: Vec<_> = (0..width).map(|i| pool[pool.len() - 1 - i]).collect();
        let m = operands[1..].iter().fold(operands[0], |m, &o| m.max(o));
        let e: Vec<_> = operands.iter().map(|&o| (o - m).exp()).collect();
        let t = g.sum(&e);
        pool.extend(e.iter().skip(width % 2).map(|&ei| (ei / t) * scale));
    }
    g.set_loss(g.sum(&pool[6..])).unwrap();
    (0..40)
        .map(|i| (0..6).map(|j| ((i * 6 + j) as f64 * 0.53).cos()).collect())
        .collect()
}

/// Steps `samples` one by one: the losses, then the params.
fn steps(p: &mut dyn Program, samples: &[Vec<f64>]) -> (Vec<f64>, Vec<f64>) {
    let losses = samples
        .iter()
        .map(|x| p.step(x, LEARNING_RATE).unwrap())
        .collect();
    (losses, p.params())
}

#[test]
fn the_first_tier_alone_computes_the_interpreters_bits() {
    for seed in 0..6 {
        let g = Graph::new();
        let samples = random_graph(&g, seed, 300);
        let mut reference = Interpreter::new(&g).unwrap();
        let mut jit = Jit::builder()
            .tiering(Tiering::FirstTierOnly)
            .compile(&g)
            .unwrap();
        assert_eq!(jit.tier(), Tier::Kernels);
        let want = steps(&mut reference, &samples);
        let got = steps(&mut jit, &samples);
        assert_eq!(bits(&got.0), bits(&want.0), "losses, seed {seed}");
        assert_eq!(bits(&got.1), bits(&want.1), "params, seed {seed}");
        assert_eq!(bits(jit.values()), bits(reference.values()), "seed {seed}");
        assert_eq!(bits(jit.grads()), bits(reference.grads()), "seed {seed}");
        let stats = jit.stats();
        assert!(stats.first_tier_op_runs > 0);
        assert_eq!(
            stats.first_tier_passes,
            samples.len() as u64,
            "a pass per step"
        );
        assert_eq!((stats.native_passes, stats.native_after_secs), (0, None));
        assert_eq!(jit.tier(), Tier::Kernels, "nothing compiles");
    }
}

/// Steps on the first tier, native code takes over (at `wait_for_native`), steps on: the
/// same losses and params as the interpreter, with or without params moved by the layout
/// pass, with plain SGD and with Adam's state carried over.
#[test]
fn a_switch_mid_training_gives_the_params_of_no_switch() {
    for (name, build) in [
        (
            "random graph",
            (|g| random_graph(g, 7, 400)) as fn(&Graph) -> Vec<Vec<f64>>,
        ),
        ("classifier", classifier),
        ("softmaxes", softmaxes),
    ] {
        for adam in [false, true] {
            let g = Graph::new();
            let samples = build(&g);
            let mut reference = Interpreter::new(&g).unwrap();
            let mut jit = Jit::compile(&g).unwrap();
            if adam {
                reference.set_optimizer(Adam::default().into()).unwrap();
                jit.set_optimizer(Adam::default().into()).unwrap();
            }
            if name == "softmaxes" {
                assert_eq!(jit.stats().first_tier_fused, 4, "{name}");
            }
            let (first, rest) = samples.split_at(15);
            let want = (steps(&mut reference, first), steps(&mut reference, rest));
            let before = steps(&mut jit, first);
            jit.wait_for_native().unwrap();
            assert_eq!(jit.tier(), Tier::Native, "{name}");
            // The program speaks the tape as built in every tier.
            let want_values = reference_values(&g, first, adam);
            let kept = kept_slots(&reference, &jit);
            let value = |v: &[f64]| kept.iter().map(|&s| v[s]).collect::<Vec<_>>();
            assert_eq!(
                bits(&value(jit.values())),
                bits(&value(&want_values)),
                "{name}"
            );
            let after = steps(&mut jit, rest);
            let context = format!("{name}, adam {adam}");
            assert_eq!(
                bits(&before.0),
                bits(&want.0 .0),
                "{context}: losses before"
            );
            assert_eq!(bits(&after.0), bits(&want.1 .0), "{context}: losses after");
            assert_eq!(bits(&after.1), bits(&want.1 .1), "{context}: params");
            let kept = kept_slots(&reference, &jit);
            let grad = |p: &dyn Program| kept.iter().map(|&s| p.grads()[s]).collect::<Vec<_>>();
            assert_eq!(
                bits(&grad(&jit)),
                bits(&grad(&reference)),
                "{context}: grads"
            );
            assert_eq!(
                bits(&jit.param_grads()),
                bits(&reference.param_grads()),
                "{context}"
            );
            let stats = jit.stats();
            // (Adam steps as a forward and a backward.)
            assert_eq!(
                stats.first_tier_passes + stats.native_passes,
                (1 + adam as u64) * samples.len() as u64,
                "{context}: passes"
            );
            assert!(stats.native_after_secs.is_some() && stats.compile_secs > 0.0);
        }
    }
}

/// The interpreter's values after stepping on `samples`.
fn reference_values(g: &Graph, samples: &[Vec<f64>], adam: bool) -> Vec<f64> {
    let mut p = Interpreter::new(g).unwrap();
    if adam {
        p.set_optimizer(Adam::default().into()).unwrap();
    }
    steps(&mut p, samples);
    p.values().to_vec()
}

/// One `train` call while native code compiles: it may take over between two samples; the
/// losses and params are the interpreter's either way.
#[test]
fn train_hands_over_between_samples() {
    let g = Graph::new();
    let samples = random_graph(&g, 11, 2_000);
    let inputs: Vec<f64> = samples
        .iter()
        .cycle()
        .take(4_000)
        .flatten()
        .copied()
        .collect();
    let mut reference = Interpreter::new(&g).unwrap();
    let want = reference.train(&inputs, 0.01).unwrap();
    let mut jit = Jit::compile(&g).unwrap();
    let got = jit.train(&inputs, 0.01).unwrap();
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(bits(&jit.params()), bits(&reference.params()));
    // A non-finite input is refused before any step, whatever tier runs.
    let mut bad = inputs.clone();
    bad[6 * 100 + 2] = f64::NAN;
    let before = jit.params();
    let mut fresh = Jit::compile(&g).unwrap();
    assert!(fresh.train(&bad, 0.01).is_err());
    assert!(jit.train(&bad, 0.01).is_err());
    assert_eq!(bits(&jit.params()), bits(&before));
}

#[test]
fn minibatches_run_on_the_first_tier() {
    let g = Graph::new();
    let samples = random_graph(&g, 3, 300);
    let inputs: Vec<f64> = samples.iter().flatten().copied().collect();
    for threads in [1, 2] {
        let mut reference = Interpreter::new(&g).unwrap();
        let want = reference
            .train_minibatches(&inputs, 8, 0.01, threads)
            .unwrap();
        let mut jit = Jit::builder()
            .tiering(Tiering::FirstTierOnly)
            .compile(&g)
            .unwrap();
        let got = jit.train_minibatches(&inputs, 8, 0.01, threads).unwrap();
        assert_eq!(bits(&got), bits(&want), "{threads} threads");
        assert_eq!(bits(&jit.params()), bits(&reference.params()));
    }
}

/// `train_minibatches` while native code compiles: it may take over between two minibatches;
/// the losses and params are the interpreter's either way, with SGD and with Adam.
#[test]
fn minibatches_hand_over_between_minibatches() {
    for adam in [false, true] {
        let g = Graph::new();
        let samples = random_graph(&g, 13, 2_000);
        let inputs: Vec<f64> = samples
            .iter()
            .cycle()
            .take(2_000)
            .flatten()
            .copied()
            .collect();
        let mut reference = Interpreter::new(&g).unwrap();
        let mut jit = Jit::compile(&g).unwrap();
        if adam {
            reference.set_optimizer(Adam::default().into()).unwrap();
            jit.set_optimizer(Adam::default().into()).unwrap();
        }
        let want = reference.train_minibatches(&inputs, 10, 0.01, 2).unwrap();
        let got = jit.train_minibatches(&inputs, 10, 0.01, 2).unwrap();
        assert_eq!(bits(&got), bits(&want), "adam {adam}");
        assert_eq!(
            bits(&jit.params()),
            bits(&reference.params()),
            "adam {adam}"
        );
        // A non-finite input: an error, and nothing changed.
        let mut bad = inputs.clone();
        bad[6 * 500 + 1] = f64::INFINITY;
        let before = jit.params();
        assert!(jit.train_minibatches(&bad, 10, 0.01, 2).is_err());
        assert_eq!(bits(&jit.params()), bits(&before));
    }
}

#[test]
fn tiering_off_runs_native_code_from_the_first_call() {
    let g = Graph::new();
    let samples = classifier(&g);
    let mut jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    assert_eq!(jit.tier(), Tier::Native);
    steps(&mut jit, &samples);
    let stats = jit.stats();
    assert_eq!((stats.first_tier_passes, stats.first_tier_secs), (0, 0.0));
    assert_eq!(stats.native_passes, samples.len() as u64);
    assert!(stats.moved_params > 0, "the classifier's params move");
    // Slots are the tape's as built, params in creation order.
    let built: Vec<usize> = jit.tape().param_slots().iter().map(|s| s.index()).collect();
    assert_eq!(built, (0..g.num_params()).collect::<Vec<_>>());
}

/// Dropping a program whose native code is still compiling returns (the compile is called
/// off between modules) and leaves nothing running.
#[test]
fn a_program_dropped_while_compiling_calls_the_compile_off() {
    let g = Graph::new();
    random_graph(&g, 5, 20_000);
    let jit = Jit::builder().chunk_size(50).compile(&g).unwrap();
    assert_eq!(jit.tier(), Tier::Kernels);
    drop(jit);
}

/// A background compile waits until the program has run on the first tier about as long as
/// LLVM is estimated to take (a graph dropped before that never entered LLVM, so its drop
/// waits for nothing): a program idle after one step gives it no time, and waiting for
/// native code ends the wait; a program that steps on starts it by itself.
#[test]
fn the_compile_waits_until_native_code_is_worth_it() {
    let g = Graph::new();
    random_graph(&g, 6, 5_000);
    let mut jit = Jit::builder().cache(Cache::Off).compile(&g).unwrap();
    let inputs = vec![0.5; g.num_inputs()];
    jit.step(&inputs, 0.01).unwrap();
    // (No call after the first, so no first-tier time: the compile waits until asked.)
    std::thread::sleep(std::time::Duration::from_millis(100));
    jit.wait_for_native().unwrap();
    assert_eq!(jit.tier(), Tier::Native);
    let stats = jit.stats();
    assert!(stats.compile_deferred_secs > 0.0, "{stats:?}");
    assert!(stats.compile_secs > stats.compile_deferred_secs);

    // A program that steps on starts its compile by itself, and switches.
    let mut jit = Jit::builder().cache(Cache::Off).compile(&g).unwrap();
    while jit.tier() == Tier::Kernels {
        jit.step(&inputs, 0.01).unwrap();
    }
    assert!(jit.stats().first_tier_passes > 1, "{:?}", jit.stats());
}

/// `train` (whose merged first layer is a module of its own) and `train_minibatches`
/// (`accumulate`'s) called on the first tier: the background compile links their modules
/// before native code takes over, so no call after the switch waits for LLVM; the numbers
/// are the interpreter's throughout.
#[test]
fn methods_called_on_the_first_tier_are_linked_before_the_switch() {
    let g = Graph::new();
    let samples = classifier(&g);
    let inputs: Vec<f64> = samples.iter().flatten().copied().collect();
    let mut reference = Interpreter::new(&g).unwrap();
    let mut jit = Jit::builder().cache(Cache::Off).compile(&g).unwrap();
    let native_modules = {
        let mut off = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
        off.train(&inputs, 0.01).unwrap();
        assert!(
            off.stats().first_use_compile_secs > 0.0,
            "train has a module"
        );
        Jit::builder()
            .tiering(Tiering::Off)
            .compile(&g)
            .unwrap()
            .stats()
            .modules
    };
    for round in 0..2 {
        let want = reference.train(&inputs, 0.01).unwrap();
        assert_eq!(bits(&jit.train(&inputs, 0.01).unwrap()), bits(&want));
        let want = reference.train_minibatches(&inputs, 8, 0.01, 2).unwrap();
        let got = jit.train_minibatches(&inputs, 8, 0.01, 2).unwrap();
        assert_eq!(bits(&got), bits(&want), "round {round}");
        assert_eq!(bits(&jit.params()), bits(&reference.params()));
        jit.wait_for_native().unwrap();
        assert_eq!(jit.tier(), Tier::Native);
        let stats = jit.stats();
        assert_eq!(stats.first_use_compile_secs, 0.0, "{stats:?}");
        assert_eq!(stats.modules, native_modules + 2, "{stats:?}");
    }
}

/// `train` on native code compiles its merged first layer on a thread of its own, stepping
/// sample by sample meanwhile: the first call returns without waiting for it, native `train`
/// takes over between two samples once it is linked, and the numbers are the interpreter's
/// throughout. With tiering off, the first call compiles it.
#[test]
fn native_train_steps_while_its_module_compiles() {
    let g = Graph::new();
    let samples = classifier(&g);
    let inputs: Vec<f64> = samples.iter().flatten().copied().collect();
    let mut reference = Interpreter::new(&g).unwrap();
    let mut jit = Jit::builder().cache(Cache::Off).compile(&g).unwrap();
    jit.wait_for_native().unwrap();
    assert_eq!(jit.tier(), Tier::Native);
    let modules = jit.stats().modules;
    for round in 0..3 {
        let want = reference.train(&inputs, 0.01).unwrap();
        assert_eq!(bits(&jit.train(&inputs, 0.01).unwrap()), bits(&want));
        assert_eq!(bits(&jit.params()), bits(&reference.params()), "{round}");
    }
    jit.wait_for_native().unwrap();
    let stats = jit.stats();
    assert!(stats.first_use_compile_secs > 0.0, "{stats:?}");
    assert_eq!(stats.modules, modules + 1, "{stats:?}");
    let want = reference.train(&inputs, 0.01).unwrap();
    assert_eq!(bits(&jit.train(&inputs, 0.01).unwrap()), bits(&want));
    assert_eq!(bits(&jit.params()), bits(&reference.params()));

    let mut off = Jit::builder()
        .tiering(Tiering::Off)
        .cache(Cache::Off)
        .compile(&g)
        .unwrap();
    off.train(&inputs, 0.01).unwrap();
    let stats = off.stats();
    assert!(stats.first_use_compile_secs > 0.0, "{stats:?}");
    assert_eq!(stats.modules, modules + 1, "{stats:?}");
}
