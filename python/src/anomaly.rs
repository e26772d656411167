//! Anomaly mode for Python (`tapejit.detect_anomaly()`, as `torch.autograd.detect_anomaly`):
//! while it is on, every value made remembers where (the file and line of the innermost
//! Python frame outside the tapejit package), an op that makes a NaN or an infinity from
//! finite operands raises `FloatingPointError` there and then (micrograd raises where a
//! number goes wrong: `math.log(-1)`), and `backward` and compiled programs name the value
//! whose derivative was not finite, with where it was made.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use pyo3::exceptions::PyFloatingPointError;
use pyo3::prelude::*;

static ON: AtomicBool = AtomicBool::new(false);

/// Where values made while the mode was on were made, by serial.
static SITES: Mutex<Option<HashMap<u64, String>>> = Mutex::new(None);

/// Whether the mode is on.
pub fn on() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Turns the mode on or off; returns whether it was on. Turning it off forgets the sites.
#[pyfunction]
pub fn set_detect_anomaly(on: bool) -> bool {
    let was = ON.swap(on, Ordering::Relaxed);
    if !on {
        *SITES.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
    was
}

/// Records where the value `serial` is being made (the mode is on); whether it did (the
/// value then [`forget`]s it when dropped, so the record holds the living values only).
pub fn record(py: Python<'_>, serial: u64) -> bool {
    let Ok(site) = caller(py) else {
        return false;
    };
    let mut sites = SITES.lock().unwrap_or_else(|e| e.into_inner());
    sites.get_or_insert_with(HashMap::new).insert(serial, site);
    true
}

/// Forgets where the value `serial` was made (it is being dropped).
pub fn forget(serial: u64) {
    let mut sites = SITES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(sites) = sites.as_mut() {
        sites.remove(&serial);
    }
}

/// Where the value `serial` was made, if the mode recorded it.
pub fn site(serial: u64) -> Option<String> {
    let sites = SITES.lock().unwrap_or_else(|e| e.into_inner());
    sites.as_ref()?.get(&serial).cloned()
}

/// ` (made at file:line)`, or nothing.
pub fn made_at(serial: u64) -> String {
    site(serial).map_or(String::new(), |s| format!(" (made at {s})"))
}

/// The file and line of the innermost Python frame outside the tapejit package.
fn caller(py: Python<'_>) -> PyResult<String> {
    let package = py.import("tapejit")?.getattr("__path__")?.get_item(0)?;
    let package: String = package.extract()?;
    let mut frame = py.import("sys")?.call_method1("_getframe", (0,))?;
    while !frame.is_none() {
        let code = frame.getattr("f_code")?;
        let file: String = code.getattr("co_filename")?.extract()?;
        if !file.starts_with(&package) {
            let line: u32 = frame.getattr("f_lineno")?.extract()?;
            return Ok(format!("{file}:{line}"));
        }
        frame = frame.getattr("f_back")?;
    }
    Ok("?".into())
}

/// In the mode, the error for an op `name` that made `data` from the finite `operands`
/// (none if `data` is finite or an operand is not: the first value to go wrong is named).
pub fn check_made(name: &str, operands: &[f64], data: f64) -> PyResult<()> {
    if data.is_finite() || !operands.iter().all(|x| x.is_finite()) {
        return Ok(());
    }
    Err(PyFloatingPointError::new_err(format!(
        "anomaly: {name} of {operands:?} gave {data}"
    )))
}
