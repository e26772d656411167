//! The hand-written yardsticks of the benchmarks (benches/common/handwritten.rs) compute what
//! the tape computes: run side by side with the interpreter on the 784-50-10 MNIST classifier,
//! from the same initial params over the same synthetic samples, they report the same
//! per-sample losses and end at the same params (within 1e-9 relative).

#[path = "../benches/common/handwritten.rs"]
mod handwritten;

use handwritten::{
    Expert, ExpertSkippingZeros, HandWritten, Naive, CLASSES, HIDDEN, INPUTS, PARAMS,
};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::{Graph, Interpreter, Program};

const SAMPLES: usize = 2_000;
const LR: f64 = 0.01;
const TOLERANCE: f64 = 1e-9;

/// MNIST-like samples: about 80% of pixels black, the rest a random byte, scaled by 1/255 as
/// `tapejit_mnist::write_normalized` does; labels uniform. Returned in the Classifier's input
/// layout (pixels, then the one-hot label) with the label beside it.
fn synthetic_samples(seed: u64) -> Vec<(Vec<f64>, usize)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..SAMPLES)
        .map(|_| {
            let label = rng.gen_range(0..CLASSES);
            let mut inputs: Vec<f64> = (0..INPUTS)
                .map(|_| {
                    if rng.gen_bool(0.8) {
                        0.0
                    } else {
                        rng.gen::<u8>() as f64 / 255.0
                    }
                })
                .collect();
            inputs.extend((0..CLASSES).map(|k| if k == label { 1.0 } else { 0.0 }));
            (inputs, label)
        })
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= TOLERANCE * a.abs().max(b.abs())
}

/// The 784-50-10 classifier every hand-written version is compared with, seed 0.
fn build_classifier(g: &Graph) {
    Classifier::new(g, INPUTS, &[HIDDEN], CLASSES, &mut StdRng::seed_from_u64(0)).unwrap();
}

/// Trains `H` and the interpreter side by side and checks losses and final params.
fn tracks_the_interpreter<H: HandWritten>() {
    let g = Graph::new();
    build_classifier(&g);
    let mut interp = Interpreter::new(&g).unwrap();
    assert_eq!(interp.params().len(), PARAMS);
    let mut hand = H::from_params(&interp.params());
    assert_eq!(
        hand.params(),
        interp.params(),
        "{}: params round trip",
        H::NAME
    );

    let mut bit_identical = 0;
    for (n, (inputs, label)) in synthetic_samples(1).iter().enumerate() {
        let want = interp.step(inputs, LR).unwrap();
        let got = hand.step(&inputs[..INPUTS], *label, LR);
        assert!(
            close(got, want),
            "{}: sample {n}: loss {got:e}, interpreter {want:e}",
            H::NAME
        );
        bit_identical += (got.to_bits() == want.to_bits()) as usize;
    }
    let (got, want) = (hand.params(), interp.params());
    let mismatched: Vec<usize> = (0..PARAMS).filter(|&i| !close(got[i], want[i])).collect();
    assert!(
        mismatched.is_empty(),
        "{}: {} params differ after {SAMPLES} steps, the first: param {} is {:e}, interpreter {:e}",
        H::NAME,
        mismatched.len(),
        mismatched[0],
        got[mismatched[0]],
        want[mismatched[0]]
    );
    // Not required (the bar is 1e-9), but worth seeing when it changes.
    let same_params = (0..PARAMS).filter(|&i| got[i] == want[i]).count();
    println!(
        "{}: {bit_identical}/{SAMPLES} losses bit-identical, {same_params}/{PARAMS} params equal",
        H::NAME
    );
}

#[test]
fn naive_tracks_the_interpreter() {
    tracks_the_interpreter::<Naive>();
}

#[test]
fn expert_tracks_the_interpreter() {
    tracks_the_interpreter::<Expert>();
}

#[test]
fn expert_skipping_zeros_tracks_the_interpreter() {
    // The synthetic pixels are 0 four times in five.
    tracks_the_interpreter::<ExpertSkippingZeros>();
}

/// The params must actually move, or tracking them would prove little.
#[test]
fn the_synthetic_run_changes_the_params() {
    let g = Graph::new();
    build_classifier(&g);
    let params = Interpreter::new(&g).unwrap().params().to_vec();
    let mut hand: Expert = Expert::from_params(&params);
    let samples = synthetic_samples(1);
    let losses: Vec<f64> = samples
        .iter()
        .map(|(inputs, label)| hand.step(&inputs[..INPUTS], *label, LR))
        .collect();
    assert!(losses.iter().all(|l| l.is_finite() && *l >= 0.0));
    assert_ne!(hand.params(), params);
}
