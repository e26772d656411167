//! tapejit for Python: micrograd's `Value` (`value.rs`), whose `backward` runs the graph's
//! tape, natively once a structure repeats (`drop_in.rs`). The Python package around this
//! module (`tapejit/`) adds micrograd's `nn`.

mod anomaly;
mod attrs;
mod compiled;
mod custom;
mod datasets;
mod dot;
mod drop_in;
mod number;
mod params;
mod pickle;
mod release;
mod samples;
mod tiers;
mod value;

use pyo3::prelude::*;

#[pymodule]
fn _tapejit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<value::Value>()?;
    m.add_class::<custom::Backward>()?;
    m.add_class::<attrs::Attribute>()?;
    m.add_function(wrap_pyfunction!(pickle::rebuild, m)?)?;
    m.add_class::<compiled::Compiled>()?;
    m.add_function(wrap_pyfunction!(compiled::compile, m)?)?;
    m.add_function(wrap_pyfunction!(compiled::restore_program, m)?)?;
    m.add_function(wrap_pyfunction!(anomaly::set_detect_anomaly, m)?)?;
    m.add_function(wrap_pyfunction!(dot::to_dot, m)?)?;
    m.add_function(wrap_pyfunction!(params::save_params, m)?)?;
    m.add_function(wrap_pyfunction!(params::load_params, m)?)?;
    m.add_function(wrap_pyfunction!(datasets::make_moons, m)?)?;
    m.add_function(wrap_pyfunction!(datasets::micrograd_params, m)?)?;
    // (Python's exit handlers run before C's, which tear down LLVM.)
    let drop_cached = wrap_pyfunction!(drop_in::drop_cached, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (drop_cached,))?;
    Ok(())
}
