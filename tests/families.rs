//! The benchmark's graph families (benches/common/families.rs) and their hand-written
//! yardsticks (benches/common/yardsticks.rs): each family at a tiny size runs bit for bit
//! alike on the interpreter and the JIT (its first tier, and native code at O0 and O2, loop
//! recovery on and off; the math families of families_math.rs also at the benchmark's
//! sizes), and each yardstick ends at the interpreter's params, bit for bit, at tiny sizes
//! and at the benchmark's (the interpreter only there). Performance lives in
//! `examples/families.rs`.

#[path = "../benches/common/families.rs"]
mod families;
#[path = "../benches/common/workload.rs"]
mod workload;
#[path = "../benches/common/yardsticks.rs"]
mod yardsticks;

use families::{Attention, Dag, Family, Lstm, Minibatch, Moons, NBody, Rnn, Springs};
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program, Tier, Tiering};

/// Steps every comparison takes.
const STEPS: usize = 3;

/// Every family at a size that compiles in well under a second straight-line at O2.
fn tiny() -> Vec<Family> {
    vec![
        Family::Moons(Moons {
            points: 8,
            layers: vec![4, 4, 1],
            ..Moons::demo()
        }),
        Family::Minibatch(Minibatch {
            nin: 12,
            hidden: 6,
            classes: 3,
            seed: 0,
            samples: Minibatch::synthetic_samples(12, 3, 4, 1),
        }),
        Family::Rnn(Rnn {
            inputs: 3,
            hidden: 5,
            ..Rnn::new(6)
        }),
        Family::Springs(Springs {
            masses: 4,
            ..Springs::new(5)
        }),
        // Nests of 11 springs and masses: lane groups of two vectors (8 and 3 lanes), whose
        // links add into neighbouring windows across the vectors.
        Family::Springs(Springs {
            masses: 12,
            ..Springs::new(6)
        }),
        Family::Dag(Dag::new(300)),
        Family::Attention(Attention {
            tokens: 5,
            width: 3,
            ..Attention::demo()
        }),
        Family::Lstm(Lstm {
            inputs: 2,
            hidden: 3,
            ..Lstm::new(4)
        }),
        Family::NBody(NBody {
            bodies: 4,
            ..NBody::new(3)
        }),
    ]
}

/// The families with a hand-written yardstick (`yardsticks::for_family`).
fn has_yardstick(family: &Family) -> bool {
    match family {
        Family::Moons(_) | Family::Minibatch(_) | Family::Rnn(_) | Family::Springs(_) => true,
        Family::Dag(_) | Family::Attention(_) | Family::Lstm(_) | Family::NBody(_) => false,
    }
}

/// `STEPS` steps of `program` on the family's inputs: the losses and the params after.
fn run(program: &mut dyn Program, inputs: &[f64], lr: f64) -> (Vec<f64>, Vec<f64>) {
    let losses = (0..STEPS)
        .map(|_| program.step(inputs, lr).expect("the family's inputs"))
        .collect();
    (losses, program.params())
}

fn bits(xs: &[f64]) -> Vec<u64> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn every_family_runs_bit_for_bit_on_the_jit() {
    for family in tiny() {
        let natives = [
            (OptLevel::O0, true),
            (OptLevel::O0, false),
            (OptLevel::O2, true),
            (OptLevel::O2, false),
        ];
        runs_bit_for_bit_on_the_jit(&family, &natives);
    }
}

/// The math families at the benchmark's sizes (`examples/families`' rows, whose loops of
/// `exp`, `tanh`, `sigmoid` and `powf` the benchmark times), at O2 with loop recovery on as
/// the benchmark compiles them (the LSTM's 20,000 nodes straight-line take seconds).
#[test]
fn the_math_families_run_bit_for_bit_at_the_benchmark_sizes() {
    for family in [
        Family::Attention(Attention::demo()),
        Family::Lstm(Lstm::demo()),
        Family::NBody(NBody::demo()),
    ] {
        runs_bit_for_bit_on_the_jit(&family, &[(OptLevel::O2, true)]);
    }
}

/// `STEPS` steps of `family` on the interpreter, on the JIT's first tier, and on native code
/// compiled at each of `natives` (level, loop recovery): the same losses and params, bit for
/// bit.
fn runs_bit_for_bit_on_the_jit(family: &Family, natives: &[(OptLevel, bool)]) {
    let g = Graph::new();
    let built = family.build(&g);
    let name = format!("{} {}", family.kind(), family.size());
    let mut interp = Interpreter::new(&g).unwrap();
    let (want_losses, want_params) = run(&mut interp, &built.inputs, built.lr);
    assert!(
        want_losses.iter().all(|l| l.is_finite()),
        "{name}: losses {want_losses:?}"
    );
    let first_tier = Jit::builder().tiering(Tiering::FirstTierOnly);
    let builders = std::iter::once(("the first tier".to_string(), Tier::Kernels, first_tier))
        .chain(natives.iter().map(|&(level, loops)| {
            let builder = Jit::builder()
                .tiering(Tiering::Off)
                .opt_level(level)
                .loop_recovery(loops);
            let what = format!("{level}, loop recovery {loops}");
            (what, Tier::Native, builder)
        }));
    for (what, tier, builder) in builders {
        let what = format!("{name} at {what}");
        let mut jit = builder
            .compile(&g)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let (losses, params) = run(&mut jit, &built.inputs, built.lr);
        assert_eq!(jit.tier(), tier, "{what}: the tier that ran");
        assert_eq!(bits(&losses), bits(&want_losses), "{what}: losses");
        assert_eq!(bits(&params), bits(&want_params), "{what}: params");
    }
}

/// The yardstick of `family` against the interpreter: the same loss at every step and the
/// same params after, bit for bit (and, the weaker bar the benchmark states, within 1e-9).
fn yardstick_tracks_the_interpreter(family: &Family) {
    let g = Graph::new();
    let built = family.build(&g);
    let name = format!("{} {}", family.kind(), family.size());
    let mut interp = Interpreter::new(&g).unwrap();
    let mut yard = yardsticks::for_family(family, &interp.params(), &built.inputs)
        .unwrap_or_else(|| panic!("{name}: no yardstick"));
    assert_eq!(
        bits(&yard.params()),
        bits(&interp.params()),
        "{name}: params round trip"
    );
    for step in 0..STEPS {
        let want = interp.step(&built.inputs, built.lr).unwrap();
        let got = yard.step(built.lr);
        assert!(
            (got - want).abs() <= 1e-9 * want.abs(),
            "{name}: step {step}: loss {got:e}, interpreter {want:e}"
        );
        assert_eq!(got.to_bits(), want.to_bits(), "{name}: step {step}: loss");
    }
    let (got, want) = (yard.params(), interp.params());
    assert_ne!(
        bits(&want),
        bits(&Interpreter::new(&g).unwrap().params()),
        "{name}: the params must move"
    );
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-9 * b.abs(),
            "{name}: param {i} is {a:e}, interpreter {b:e}"
        );
    }
    assert_eq!(bits(&got), bits(&want), "{name}: params");
}

#[test]
fn yardsticks_track_the_interpreter_at_tiny_sizes() {
    for family in tiny() {
        if has_yardstick(&family) {
            yardstick_tracks_the_interpreter(&family);
        }
    }
}

#[test]
fn yardsticks_track_the_interpreter_at_the_benchmark_sizes() {
    for family in [
        Family::Moons(Moons::demo()),
        Family::Minibatch(Minibatch::mnist(Minibatch::synthetic_samples(
            784, 10, 2, 3,
        ))),
        Family::Rnn(Rnn::new(50)),
        Family::Springs(Springs::new(50)),
    ] {
        yardstick_tracks_the_interpreter(&family);
    }
}

/// The minibatch's params at B = 1 are the MNIST graph's (`workload::mnist_graph`), and its
/// step is the per-sample step (the batch mean of one loss is that loss).
#[test]
fn a_batch_of_one_is_the_per_sample_step() {
    let samples = Minibatch::synthetic_samples(784, 10, 1, 9);
    let (g1, g2) = (Graph::new(), Graph::new());
    let built = Family::Minibatch(Minibatch::mnist(samples.clone())).build(&g1);
    workload::mnist_graph(&g2, workload::HIDDEN);
    let (mut batch, mut single) = (
        Interpreter::new(&g1).unwrap(),
        Interpreter::new(&g2).unwrap(),
    );
    assert_eq!(bits(&batch.params()), bits(&single.params()));
    for _ in 0..STEPS {
        let a = batch.step(&built.inputs, built.lr).unwrap();
        let b = single.step(&samples[0], built.lr).unwrap();
        assert_eq!(a.to_bits(), (b * 1.0).to_bits());
    }
    assert_eq!(bits(&batch.params()), bits(&single.params()));
}

/// micrograd's demo converges: 100 steps at lr 1.0 - 0.9 k / 100 end at 100% accuracy.
#[test]
fn the_moons_demo_reaches_full_accuracy() {
    let moons = Moons::demo();
    let g = Graph::new();
    let built = moons.build(&g);
    let (_, labels) = moons.data();
    let mut yard = {
        let interp = Interpreter::new(&g).unwrap();
        yardsticks::for_family(
            &Family::Moons(moons.clone()),
            &interp.params(),
            &built.inputs,
        )
        .unwrap()
    };
    let mut interp = Interpreter::new(&g).unwrap();
    for k in 0..100 {
        interp.step(&built.inputs, Moons::lr(k)).unwrap();
        yard.step(Moons::lr(k));
    }
    interp.forward();
    let correct = interp
        .outputs()
        .iter()
        .zip(&labels)
        .filter(|(s, y)| (**s > 0.0) == (**y > 0.0))
        .count();
    assert_eq!(correct, labels.len(), "accuracy after 100 steps");
    assert_eq!(bits(&yard.params()), bits(&interp.params()));
}
