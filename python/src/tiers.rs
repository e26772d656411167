//! The JIT's tiers in Python: `tiering=`'s names, `tier`'s, the stats a program shows, and
//! dropping a JIT without the GIL. A JIT runs its first tier at once while native code
//! compiles on a thread of its own (`tapejit::Tiering`); dropped while that compile is
//! inside LLVM, it waits for the module the compile is on.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tapejit::{JitStats, Tier, Tiering};

/// `tiering=`'s names, as `compile` takes them and a pickle holds them.
const TIERINGS: [(&str, Tiering); 3] = [
    ("auto", Tiering::Auto),
    ("off", Tiering::Off),
    ("first_tier_only", Tiering::FirstTierOnly),
];

/// The tiering named `name`; another name is a `ValueError` naming the choices.
pub fn tiering(name: &str) -> PyResult<Tiering> {
    let found = TIERINGS.iter().find(|(n, _)| *n == name);
    found.map(|&(_, t)| t).ok_or_else(|| {
        PyValueError::new_err(format!(
            "tiering={name:?}: expected \"auto\", \"off\" or \"first_tier_only\""
        ))
    })
}

pub fn tiering_name(tiering: Tiering) -> &'static str {
    let found = TIERINGS.iter().find(|(_, t)| *t == tiering);
    found.expect("every tiering is named").0
}

/// `tier`'s name for the tier that runs a JIT's next call.
pub fn tier_name(tier: Tier) -> &'static str {
    match tier {
        Tier::Kernels => "first_tier",
        Tier::Native => "native",
    }
}

/// A JIT's stats as `Program.stats()` shows them: which tier ran how many passes and when
/// native code took over, and what compiling it took.
pub fn stats<'py>(py: Python<'py>, s: &JitStats) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("tape_nodes", s.tape_nodes)?;
    dict.set_item("first_tier_secs", s.first_tier_secs)?;
    dict.set_item("first_tier_op_runs", s.first_tier_op_runs)?;
    dict.set_item("first_tier_fused", s.first_tier_fused)?;
    dict.set_item("first_tier_passes", s.first_tier_passes)?;
    dict.set_item("native_passes", s.native_passes)?;
    dict.set_item("native_after_secs", s.native_after_secs)?;
    let error = s.native_error.as_ref().map(|e| e.to_string());
    dict.set_item("native_error", error)?;
    dict.set_item("compile_secs", s.compile_secs)?;
    dict.set_item("compile_deferred_secs", s.compile_deferred_secs)?;
    dict.set_item("cache_hits", s.cache_hits)?;
    dict.set_item("cache_misses", s.cache_misses)?;
    Ok(dict)
}

/// A value whose drop may wait for LLVM (a JIT's), dropped with the GIL released so that
/// other Python threads run meanwhile (with it held while Python shuts down). Only for
/// values dropped where this thread holds no lock a thread holding the GIL may wait for.
pub struct DropsWithoutGil<T: Send>(Option<T>);

impl<T: Send> DropsWithoutGil<T> {
    pub fn new(value: T) -> Self {
        DropsWithoutGil(Some(value))
    }
}

impl<T: Send> std::ops::Deref for DropsWithoutGil<T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect("taken only by drop")
    }
}

impl<T: Send> std::ops::DerefMut for DropsWithoutGil<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect("taken only by drop")
    }
}

impl<T: Send> Drop for DropsWithoutGil<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            // (Not attached, the closure is dropped, and the value with it, as it is.)
            let _ = Python::try_attach(move |py| py.detach(move || drop(value)));
        }
    }
}
