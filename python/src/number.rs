//! A value's numbers: `f64`s ([`Number`]), `data` read as micrograd's would be.
//!
//! micrograd stores whatever number it is given, and Python's arithmetic keeps ints for `+`,
//! `*` and `**` of a non-negative int: `Value(1) + 2` has data `3`, an int, and `relu`
//! (`0 if x < 0 else x`) gives the int `0` for any negative number. So a value's data is an
//! int where micrograd's would be one ([`int_result`]; every op micrograd computes in
//! floats gives a float), computed in `f64` all the same (the tape's numbers): an
//! int is held exactly below 2^53 in magnitude, where an `f64` holds every integer and `+`,
//! `*` and `pow` of integers are exact. An int of 2^53 or more is held as the nearest `f64`
//! and reads back as a float.

use std::sync::atomic::{AtomicU64, Ordering};

use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt};
use tapejit::op::Op;

use crate::value::flag;

/// An `f64` that Python may read and write through a shared reference.
pub struct Number(AtomicU64);

impl Number {
    pub fn new(x: f64) -> Number {
        Number(AtomicU64::new(x.to_bits()))
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }

    pub fn set(&self, x: f64) {
        self.0.store(x.to_bits(), Ordering::Relaxed)
    }
}

/// Whether `x` is held exactly as an int: below 2^53 in magnitude ("safe integers", as
/// JavaScript calls them).
pub fn exact_int(x: f64) -> bool {
    x.abs() < 9_007_199_254_740_992.0
}

/// [`flag::INT`] if `int` and `x` holds it exactly (see [`exact_int`]), else 0.
pub fn int_flag(x: f64, int: bool) -> u64 {
    match int && exact_int(x) {
        true => flag::INT,
        false => 0,
    }
}

/// Whether `op` of one or two operands (their data `x`, and whether each is an int, the
/// second an int for an op of one) gives an int where micrograd's arithmetic does (Python's
/// on its data). A power is decided by `value.rs`'s `power`, which knows how its exponent
/// was written.
#[inline]
pub fn int_result(op: Op, x: [f64; 2], int: impl Fn(usize) -> bool) -> bool {
    match op {
        Op::Add | Op::Sub | Op::Mul | Op::Neg | Op::Sum => int(0) && int(1),
        // `0 if x < 0 else x`: the int 0 for any negative number.
        Op::Relu => int(0) || x[0] < 0.0,
        // `b if b > a else a`: the one it picks.
        Op::Max => int((x[1] > x[0]) as usize),
        // `b if b < a else a`, and Python's abs of an int.
        Op::Min => int((x[1] < x[0]) as usize),
        Op::Abs => int(0),
        Op::Powf(_) | Op::Div | Op::Exp | Op::Log | Op::Tanh | Op::Sigmoid => false,
        Op::Softplus | Op::Log1p | Op::Sin | Op::Cos | Op::Sqrt => false,
        Op::Input(_) | Op::Param(_) | Op::Const(_) => false,
    }
}

/// A Python number as a value holds it: its `f64`, and whether it is an int.
pub fn number(x: &Bound<'_, PyAny>) -> PyResult<(f64, bool)> {
    // A float, the most common, told by its type's address (an int's check is a call).
    if let Ok(x) = x.cast_exact::<PyFloat>() {
        return Ok((x.value(), false));
    }
    Ok((x.extract()?, x.is_instance_of::<PyInt>()))
}

/// `x` as Python reads it: an int if `int`, else a float.
pub fn to_python(py: Python<'_>, x: f64, int: bool) -> Bound<'_, PyAny> {
    match int {
        true => PyInt::new(py, x as i64).into_any(),
        false => PyFloat::new(py, x).into_any(),
    }
}

/// `x` as Python's `repr` prints it: an int if `int`, else a float.
pub fn repr(x: f64, int: bool) -> String {
    match int {
        true => format!("{}", x as i64),
        false => python_float(x),
    }
}

/// `x` as Python's `repr` prints a float: Python's own (the shortest digits that read back
/// as `x`, a tie between two of them going to the even one, where Rust's go up).
pub fn python_float(x: f64) -> String {
    Python::attach(|py| {
        let repr = PyFloat::new(py, x).repr();
        repr.map_or_else(|_| format!("{x:?}"), |r| r.to_string())
    })
}
