//! `tapejit.datasets`: `tapejit::datasets`' seeded generators, so that the Python examples
//! and the Rust ones train on the same numbers.

use pyo3::exceptions::{PyMemoryError, PyOverflowError};
use pyo3::prelude::*;

/// `make_moons(n_samples, noise, seed)`: the points (each `[x, y]`) and labels (-1.0, +1.0).
#[pyfunction]
#[pyo3(signature = (n_samples = 100, noise = 0.1, seed = 1337))]
pub fn make_moons(n_samples: usize, noise: f64, seed: u64) -> PyResult<(Vec<[f64; 2]>, Vec<f64>)> {
    // (Points, then labels, then the lists Python builds of them.)
    room_for(n_samples.checked_mul(3), "make_moons' samples")?;
    Ok(tapejit::datasets::make_moons(n_samples, noise, seed))
}

/// micrograd's initial params for an MLP of `sizes`, in `parameters()` order, from `seed`.
#[pyfunction]
pub fn micrograd_params(sizes: Vec<usize>, seed: u64) -> PyResult<Vec<f64>> {
    let count = sizes.windows(2).try_fold(0usize, |n, w| {
        w[0].checked_add(1)?.checked_mul(w[1])?.checked_add(n)
    });
    room_for(count, "micrograd_params' params")?;
    Ok(tapejit::datasets::micrograd_params(&sizes, seed))
}

/// `OverflowError` if `count` numbers (`None`: more than a `usize` counts) cannot be
/// addressed, `MemoryError` if they cannot be allocated: a typed error where the generator
/// would panic or the process be killed.
fn room_for(count: Option<usize>, what: &str) -> PyResult<()> {
    let count = count
        .filter(|&n| {
            n.checked_mul(std::mem::size_of::<f64>())
                .is_some_and(|b| b <= isize::MAX as usize)
        })
        .ok_or_else(|| PyOverflowError::new_err(format!("{what}: too many to address")))?;
    let mut probe: Vec<f64> = Vec::new();
    probe.try_reserve_exact(count).map_err(|_| {
        PyMemoryError::new_err(format!("{what}: {count} numbers do not fit in memory"))
    })
}
