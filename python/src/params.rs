//! Checkpoints for Python models: `tapejit::checkpoint` (safetensors, named from the
//! model's structure), so a model trained by the Rust trainer loads into `tapejit.nn.MLP`
//! and the other way round.

use pyo3::prelude::*;
use tapejit::checkpoint::Checkpoint;

use crate::drop_in::error;

/// Saves `params` (creation order) as a checkpoint of `architecture` at `path`.
#[pyfunction]
pub fn save_params(
    py: Python<'_>,
    path: &str,
    architecture: Vec<usize>,
    params: Vec<f64>,
) -> PyResult<()> {
    let checkpoint = Checkpoint {
        architecture,
        params,
        optimizer: None,
    };
    py.detach(|| checkpoint.save(path)).map_err(error)
}

/// The params of the checkpoint at `path`, which must have been saved for `architecture`
/// and hold `count` params.
#[pyfunction]
pub fn load_params(
    py: Python<'_>,
    path: &str,
    architecture: Vec<usize>,
    count: usize,
) -> PyResult<Vec<f64>> {
    py.detach(|| Checkpoint::load_for(path, &architecture, count))
        .map_err(error)
}
