//! The benchmark's graph families (benches/common/families.rs) and their hand-written
//! yardsticks (benches/common/yardsticks.rs): each family at a tiny size runs bit for bit
//! alike on the interpreter and the JIT (O0 and O2, loop recovery on and off), and each
//! yardstick ends at the interpreter's params, bit for bit, at tiny sizes and at the
//! benchmark's (the interpreter only there). Performance lives in `examples/families.rs`.

#[path = "../benches/common/families.rs"]
mod families;
#[path = "../benches/common/workload.rs"]
mod workload;
#[path = "../benches/common/yardsticks.rs"]
mod yardsticks;

use families::{Dag, Family, Minibatch, Moons, Rnn, Springs};
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program};

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
    ]
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
        let g = Graph::new();
        let built = family.build(&g);
        let name = format!("{} {}", family.kind(), family.size());
        let mut interp = Interpreter::new(&g).unwrap();
        let (want_losses, want_params) = run(&mut interp, &built.inputs, built.lr);
        assert!(
            want_losses.iter().all(|l| l.is_finite()),
            "{name}: losses {want_losses:?}"
        );
        for level in [OptLevel::O0, OptLevel::O2] {
            for loops in [true, false] {
                let mut jit = Jit::builder()
                    .opt_level(level)
                    .loop_recovery(loops)
                    .compile(&g)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                let (losses, params) = run(&mut jit, &built.inputs, built.lr);
                let what = format!("{name} at {level}, loop recovery {loops}");
                assert_eq!(bits(&losses), bits(&want_losses), "{what}: losses");
                assert_eq!(bits(&params), bits(&want_params), "{what}: params");
            }
        }
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
        if !matches!(family, Family::Dag(_)) {
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
