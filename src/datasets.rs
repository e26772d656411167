//! Data the demos train on, generated here so that they need nothing else (micrograd's demo
//! takes its moons from scikit-learn), with seeded generators that the Rust examples and the
//! Python package share: the same seed gives the same numbers in both.

use std::f64::consts::PI;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// scikit-learn's `make_moons(n, noise=noise)`, seeded: the upper half circle (label -1) at
/// `linspace(0, pi)`, the lower one shifted to (1, 0.5) (label +1), shuffled, plus Gaussian
/// noise. Returns the points and their labels.
pub fn make_moons(n: usize, noise: f64, seed: u64) -> (Vec<[f64; 2]>, Vec<f64>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let outer = n / 2;
    let inner = n - outer;
    let angle = |i: usize, n: usize| {
        if n > 1 {
            PI * i as f64 / (n - 1) as f64
        } else {
            0.0
        }
    };
    let mut points: Vec<([f64; 2], f64)> = (0..outer)
        .map(|i| ([angle(i, outer).cos(), angle(i, outer).sin()], -1.0))
        .chain((0..inner).map(|i| {
            let t = angle(i, inner);
            ([1.0 - t.cos(), 1.0 - t.sin() - 0.5], 1.0)
        }))
        .collect();
    points.shuffle(&mut rng);
    for (p, _) in &mut points {
        for c in p.iter_mut() {
            *c += noise * standard_normal(&mut rng);
        }
    }
    points.into_iter().unzip()
}

/// A standard normal draw (Box-Muller), so the data need nothing beyond `rand`.
fn standard_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>(); // (0, 1]
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()
}

/// micrograd's initial params for an MLP of `sizes` (`[nin, h1, ..., nout]`), in creation
/// order (layer by layer, neuron by neuron: weights uniform in [-1, 1), then a bias of 0),
/// drawn from a generator seeded with `seed`.
pub fn micrograd_params(sizes: &[usize], seed: u64) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut params = Vec::new();
    for w in sizes.windows(2) {
        for _ in 0..w[1] {
            params.extend((0..w[0]).map(|_| rng.gen_range(-1.0..1.0)));
            params.push(0.0);
        }
    }
    params
}
