//! `Program::train_from` and `train_minibatches_from`: samples as they are stored (bytes,
//! `f32`, labels, a row order) give the bits `train` and `train_minibatches` give on the
//! converted numbers, on every backend and thread count; bad samples are typed errors that
//! change nothing.

mod common;

use common::interpreter_and_every_jit_level;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::{Error, Graph, Interpreter, Jit, OptLevel, Program, Samples, Tiering};

const NIN: usize = 12;
const CLASSES: usize = 3;
const WIDTH: usize = NIN + CLASSES;
/// The first `BYTES` inputs are bytes, the rest of the `NIN` `f32`s.
const BYTES: usize = 7;

fn classifier(g: &Graph) {
    Classifier::new(g, NIN, &[13], CLASSES, &mut StdRng::seed_from_u64(21)).unwrap();
}

/// A dataset of `rows` rows: `BYTES` pixels (half of them 0), `NIN - BYTES` `f32`s (a
/// third 0), a label.
struct Dataset {
    pixels: Vec<u8>,
    floats: Vec<f32>,
    labels: Vec<u8>,
}

fn dataset(rows: usize, seed: u64) -> Dataset {
    let mut rng = StdRng::seed_from_u64(seed);
    let pixels = (0..rows * BYTES)
        .map(|_| if rng.gen_bool(0.5) { 0 } else { rng.gen() })
        .collect();
    let floats = (0..rows * (NIN - BYTES))
        .map(|_| match rng.gen_range(0..3) {
            0 => 0.0,
            _ => rng.gen_range(-1.0f32..1.0),
        })
        .collect();
    let labels = (0..rows).map(|_| rng.gen_range(0..CLASSES as u8)).collect();
    Dataset {
        pixels,
        floats,
        labels,
    }
}

impl Dataset {
    fn samples(&self) -> Samples<'_> {
        Samples::new()
            .bytes_over(&self.pixels, BYTES, 255.0)
            .unwrap()
            .f32s(&self.floats, NIN - BYTES)
            .unwrap()
            .one_hot(&self.labels, CLASSES)
            .unwrap()
    }
}

/// A shuffled order of `rows` rows with some rows twice.
fn order(rows: usize, seed: u64) -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..rows).chain(0..rows / 4).collect();
    order.shuffle(&mut rng);
    order
}

/// The samples as `train` takes them, converted by hand.
fn by_hand(data: &Dataset, order: &[usize]) -> Vec<f64> {
    let mut out = Vec::with_capacity(order.len() * WIDTH);
    for &r in order {
        let pixels = &data.pixels[r * BYTES..(r + 1) * BYTES];
        out.extend(pixels.iter().map(|&b| b as f64 / 255.0));
        let floats = &data.floats[r * (NIN - BYTES)..(r + 1) * (NIN - BYTES)];
        out.extend(floats.iter().map(|&x| x as f64));
        out.extend((0..CLASSES).map(|k| (k == data.labels[r] as usize) as u8 as f64));
    }
    out
}

fn bits(xs: &[f64]) -> Vec<u64> {
    xs.iter().map(|x| x.to_bits()).collect()
}

/// Losses, params, and every kept value and gradient: what a run leaves.
fn state(p: &dyn Program, losses: &[f64]) -> [Vec<u64>; 4] {
    [
        bits(losses),
        bits(&p.params()),
        bits(p.values()),
        bits(p.grads()),
    ]
}

#[test]
fn converts_as_documented() {
    let data = dataset(3, 1);
    let order = [2, 0, 2];
    let samples = data.samples().in_order(&order).unwrap();
    assert_eq!((samples.len(), samples.width()), (3, WIDTH));
    let mut out = vec![0.0; 3 * WIDTH];
    samples.convert(0..3, &mut out).unwrap();
    assert_eq!(bits(&out), bits(&by_hand(&data, &order)));
    // A table, and a scale.
    let bytes = [0u8, 1, 2, 255];
    let mapped = Samples::new()
        .bytes_mapped(&bytes, 2, |b| (b as f64).sqrt())
        .unwrap()
        .bytes_times(&bytes, 2, 0.5)
        .unwrap();
    let mut out = vec![0.0; 8];
    mapped.convert(0..2, &mut out).unwrap();
    let want = [0.0, 1.0, 0.0, 0.5, 2f64.sqrt(), 255f64.sqrt(), 1.0, 127.5];
    assert_eq!(bits(&out), bits(&want));
}

#[test]
fn train_from_gives_trains_bits_on_every_backend() {
    let g = Graph::new();
    classifier(&g);
    let data = dataset(60, 2);
    let order = order(60, 3);
    let samples = data.samples().in_order(&order).unwrap();
    let inputs = by_hand(&data, &order);
    let mut backends = interpreter_and_every_jit_level(&g);
    // And the first tier, handing over to native code as it goes.
    let tiered = Jit::builder().opt_level(OptLevel::O2).compile(&g).unwrap();
    backends.push(common::Backend {
        name: "tiered".into(),
        program: Box::new(tiered),
    });
    for mut b in backends {
        let mut reference = Interpreter::new(&g).unwrap();
        let want_losses = reference.train(&inputs, 0.05).unwrap();
        let want = state(&reference, &want_losses);
        let p = b.program.as_mut();
        let losses = p.train_from(&samples, 0.05).unwrap();
        let [l, params, ..] = state(p, &losses);
        assert_eq!(l, want[0], "{}: losses", b.name);
        assert_eq!(params, want[1], "{}: params", b.name);
    }
}

#[test]
fn train_minibatches_from_gives_the_same_bits_on_every_thread_count() {
    let g = Graph::new();
    classifier(&g);
    let data = dataset(75, 4);
    let order = order(75, 5);
    let samples = data.samples().in_order(&order).unwrap();
    let inputs = by_hand(&data, &order);
    for batch in [1, 5, 16, 40] {
        for threads in [1, 2, 3] {
            for mut b in interpreter_and_every_jit_level(&g) {
                let at = format!("{}, batch {batch}, {threads} threads", b.name);
                let mut reference = common::jit(&g, OptLevel::O1).program;
                let want_losses = reference
                    .train_minibatches(&inputs, batch, 0.1, threads)
                    .unwrap();
                let want = state(reference.as_ref(), &want_losses);
                let p = b.program.as_mut();
                let losses = p
                    .train_minibatches_from(&samples, batch, 0.1, threads)
                    .unwrap();
                let [l, params, ..] = state(p, &losses);
                assert_eq!(l, want[0], "{at}: losses");
                assert_eq!(params, want[1], "{at}: params");
                // The last sample's values, and the gradients (the params' the mean).
                let kept = common::kept_slots(reference.as_ref(), p);
                for s in kept {
                    let (v, w) = (p.values()[s], reference.values()[s]);
                    assert_eq!(v.to_bits(), w.to_bits(), "{at}: value {s}");
                    let (v, w) = (p.grads()[s], reference.grads()[s]);
                    assert_eq!(v.to_bits(), w.to_bits(), "{at}: gradient {s}");
                }
            }
        }
    }
}

/// More samples than `train_from` converts at a time.
#[test]
fn train_from_runs_many_samples_in_chunks() {
    let g = Graph::new();
    classifier(&g);
    let data = dataset(5000, 6);
    let order = order(5000, 7);
    let samples = data.samples().in_order(&order).unwrap();
    let inputs = by_hand(&data, &order);
    let mut reference = Interpreter::new(&g).unwrap();
    let want = reference.train(&inputs, 0.01).unwrap();
    let mut jit = Jit::builder().tiering(Tiering::Off).compile(&g).unwrap();
    let got = jit.train_from(&samples, 0.01).unwrap();
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(bits(&jit.params()), bits(&reference.params()));
}

#[test]
fn numbers_as_samples_are_trains_own() {
    let g = Graph::new();
    classifier(&g);
    let data = dataset(20, 8);
    let inputs = by_hand(&data, &(0..20).collect::<Vec<_>>());
    let samples = Samples::new().numbers(&inputs, WIDTH).unwrap();
    let mut a = Interpreter::new(&g).unwrap();
    let mut b = Interpreter::new(&g).unwrap();
    assert_eq!(
        bits(&a.train_from(&samples, 0.1).unwrap()),
        bits(&b.train(&inputs, 0.1).unwrap())
    );
}

#[test]
fn bad_samples_are_typed_errors() {
    let bytes = [1u8; 12];
    let samples_err = |r: tapejit::Result<Samples<'_>>| match r {
        Err(Error::Samples { problem }) => problem,
        other => panic!("expected Error::Samples, got {other:?}"),
    };
    let p = samples_err(Samples::new().bytes_over(&bytes, 5, 255.0));
    assert!(p.contains("rows of 5"), "{p}");
    let p = samples_err(
        Samples::new()
            .bytes_over(&bytes, 4, 255.0)
            .unwrap()
            .one_hot(&[0, 1], 3),
    );
    assert!(p.contains("2 rows beside fields of 3"), "{p}");
    let p = samples_err(Samples::new().one_hot(&[0, 3], 3));
    assert!(p.contains("label 3 of row 1"), "{p}");
    let p = samples_err(Samples::new().bytes_over(&bytes, 4, 0.0));
    assert!(p.contains("byte 0 converts to NaN"), "{p}");
    let p = samples_err(Samples::new().bytes_times(&bytes, 4, f64::MAX));
    assert!(p.contains("byte 2 converts to inf"), "{p}");
    let p = samples_err(Samples::new().bytes_mapped(&bytes, 4, |b| 1.0 / (b as f64 - 7.0)));
    assert!(p.contains("byte 7"), "{p}");
    let three = Samples::new().bytes_over(&bytes, 4, 255.0).unwrap();
    let mut out = [0.0; 8];
    assert!(matches!(
        three.convert(2..4, &mut out),
        Err(Error::Samples { .. })
    ));
    assert!(matches!(
        three.convert(0..1, &mut out),
        Err(Error::WrongLength {
            expected: 4,
            got: 8,
            ..
        })
    ));
    let p = samples_err(three.in_order(&[0, 3]));
    assert!(p.contains("order[1] is row 3"), "{p}");
    assert_eq!(Samples::new().len(), 0);
}

#[test]
fn bad_training_samples_are_typed_errors_and_change_nothing() {
    let g = Graph::new();
    classifier(&g);
    let data = dataset(10, 9);
    for mut b in interpreter_and_every_jit_level(&g) {
        let p = b.program.as_mut();
        let before = bits(&p.params());
        // Samples of another width.
        let narrow = Samples::new()
            .bytes_over(&data.pixels, BYTES, 255.0)
            .unwrap();
        let wrong = |e| {
            matches!(
                e,
                Err(Error::WrongLength {
                    expected: WIDTH,
                    ..
                })
            )
        };
        assert!(wrong(p.train_from(&narrow, 0.1)), "{}", b.name);
        assert!(wrong(p.train_minibatches_from(&narrow, 4, 0.1, 2)));
        // No samples.
        let none = data.samples().in_order(&[]).unwrap();
        assert!(matches!(
            p.train_from(&none, 0.1),
            Err(Error::WrongLength { .. })
        ));
        // A non-finite f32 in row 6, sample 2 of the order: its index among the numbers.
        let mut floats = data.floats.clone();
        floats[6 * (NIN - BYTES) + 1] = f32::NAN;
        let bad = Samples::new()
            .bytes_over(&data.pixels, BYTES, 255.0)
            .unwrap()
            .f32s(&floats, NIN - BYTES)
            .unwrap()
            .one_hot(&data.labels, CLASSES)
            .unwrap();
        let bad = bad.in_order(&[0, 1, 6, 2]).unwrap();
        let index = 2 * WIDTH + BYTES + 1;
        for result in [
            p.train_from(&bad, 0.1),
            p.train_minibatches_from(&bad, 2, 0.1, 2),
        ] {
            match result {
                Err(Error::NonFinite {
                    index: i, value, ..
                }) => {
                    assert_eq!(i, index, "{}", b.name);
                    assert!(value.is_nan());
                }
                other => panic!("{}: expected NonFinite, got {other:?}", b.name),
            }
        }
        assert!(matches!(
            p.train_from(&data.samples(), f64::NAN),
            Err(Error::NonFiniteLearningRate { .. })
        ));
        assert!(matches!(
            p.train_minibatches_from(&data.samples(), 0, 0.1, 1),
            Err(Error::EmptyMinibatch)
        ));
        assert_eq!(bits(&p.params()), before, "{}: unchanged", b.name);
    }
}
