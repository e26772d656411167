//! `tapejit.datasets`: `tapejit::datasets`' seeded generators, so that the Python examples
//! and the Rust ones train on the same numbers.

use pyo3::prelude::*;

/// `make_moons(n_samples, noise, seed)`: the points (each `[x, y]`) and labels (-1.0, +1.0).
#[pyfunction]
#[pyo3(signature = (n_samples = 100, noise = 0.1, seed = 1337))]
pub fn make_moons(n_samples: usize, noise: f64, seed: u64) -> (Vec<[f64; 2]>, Vec<f64>) {
    tapejit::datasets::make_moons(n_samples, noise, seed)
}

/// micrograd's initial params for an MLP of `sizes`, in `parameters()` order, from `seed`.
#[pyfunction]
pub fn micrograd_params(sizes: Vec<usize>, seed: u64) -> Vec<f64> {
    tapejit::datasets::micrograd_params(&sizes, seed)
}
