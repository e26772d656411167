//! What a compiled program's `train` and `train_minibatches` take from Python: a numpy array
//! of rows as it is stored (float64 as it is, float32 widened, uint8 as it is or divided by
//! `divide`), labels one-hot over `classes` after each row, and an `order` of rows. The Rust
//! crate's `Samples`: the call converts them where it trains on them, so an epoch of uint8
//! images is never widened to float64 in Python.

use numpy::{PyReadonlyArrayDyn, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use tapejit::Samples;

/// The rows, as stored.
enum Rows<'py> {
    F64(PyReadonlyArrayDyn<'py, f64>),
    F32(PyReadonlyArrayDyn<'py, f32>),
    U8(PyReadonlyArrayDyn<'py, u8>),
}

/// Samples from Python's arguments, borrowed for one call.
pub(crate) struct Stored<'py> {
    rows: Rows<'py>,
    /// The rows' second dimension, if they have two.
    columns: Option<usize>,
    divide: Option<f64>,
    labels: Option<(Vec<u8>, usize)>,
    order: Option<Vec<usize>>,
}

impl<'py> Stored<'py> {
    /// `x` and the keywords as given (`labels` and `classes` together or neither).
    pub(crate) fn extract(
        x: &Bound<'py, PyAny>,
        divide: Option<f64>,
        labels: Option<&Bound<'py, PyAny>>,
        classes: Option<usize>,
        order: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Stored<'py>> {
        let np = x.py().import("numpy")?;
        let array = np.call_method1("ascontiguousarray", (x,))?;
        let kind: String = array.getattr("dtype")?.getattr("kind")?.extract()?;
        let size: usize = array.getattr("itemsize")?.extract()?;
        let rows = match (kind.as_str(), size) {
            ("u", 1) => Rows::U8(array.extract()?),
            // (In the machine's byte order: numpy's own if stored the other way.)
            ("f", 4) => Rows::F32(
                np.call_method1("ascontiguousarray", (x, "float32"))?
                    .extract()?,
            ),
            _ => {
                let wide = np.call_method1("ascontiguousarray", (x, "float64"))?;
                Rows::F64(wide.extract()?)
            }
        };
        if divide.is_some() && !matches!(rows, Rows::U8(_)) {
            return Err(PyTypeError::new_err(
                "divide= scales uint8 samples; these are not uint8",
            ));
        }
        let shape = match &rows {
            Rows::F64(a) => a.shape().to_vec(),
            Rows::F32(a) => a.shape().to_vec(),
            Rows::U8(a) => a.shape().to_vec(),
        };
        let labels = match (labels, classes) {
            (None, None) => None,
            (Some(labels), Some(classes)) => Some((bytes_of(labels, "labels", 255)?, classes)),
            _ => {
                return Err(PyTypeError::new_err(
                    "labels= and classes= go together (labels one-hot over classes)",
                ))
            }
        };
        let order = match order {
            None => None,
            Some(order) => Some(indices(order)?),
        };
        Ok(Stored {
            rows,
            columns: (shape.len() == 2).then(|| shape[1]),
            divide,
            labels,
            order,
        })
    }

    /// The samples of a program with `inputs` inputs per sample.
    pub(crate) fn samples(&self, inputs: usize) -> PyResult<Samples<'_>> {
        let classes = self.labels.as_ref().map_or(0, |(_, c)| *c);
        let width = inputs
            .checked_sub(classes)
            .filter(|&w| w > 0)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{classes} classes leave no room among the program's {inputs} inputs"
                ))
            })?;
        if let Some(columns) = self.columns.filter(|&c| c != width) {
            return Err(PyValueError::new_err(format!(
                "rows of {columns} numbers, but the program takes {width} per sample before \
                 the labels"
            )));
        }
        let slice = |e: numpy::AsSliceError| PyValueError::new_err(e.to_string());
        let samples = match &self.rows {
            Rows::F64(a) => Samples::new().numbers(a.as_slice().map_err(slice)?, width),
            Rows::F32(a) => Samples::new().f32s(a.as_slice().map_err(slice)?, width),
            Rows::U8(a) => {
                let bytes = a.as_slice().map_err(slice)?;
                match self.divide {
                    Some(d) => Samples::new().bytes_over(bytes, width, d),
                    None => Samples::new().bytes_times(bytes, width, 1.0),
                }
            }
        };
        let mut samples = samples.map_err(crate::drop_in::error)?;
        if let Some((labels, classes)) = &self.labels {
            samples = samples
                .one_hot(labels, *classes)
                .map_err(crate::drop_in::error)?;
        }
        if let Some(order) = &self.order {
            samples = samples.in_order(order).map_err(crate::drop_in::error)?;
        }
        Ok(samples)
    }
}

/// An array of integers from 0 to `max` as bytes (`what` names it in errors).
fn bytes_of(x: &Bound<'_, PyAny>, what: &str, max: i64) -> PyResult<Vec<u8>> {
    let values = integers(x, what)?;
    match values.iter().position(|&v| !(0..=max).contains(&v)) {
        Some(i) => Err(PyValueError::new_err(format!(
            "{what}[{i}] is {}, not from 0 to {max}",
            values[i]
        ))),
        None => Ok(values.into_iter().map(|v| v as u8).collect()),
    }
}

/// An array of row indices (not a mask of booleans, which numpy would read as rows to
/// pick, and which as integers would be rows 0 and 1).
fn indices(x: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    let np = x.py().import("numpy")?;
    let kind: String = (np.call_method1("asarray", (x,))?.getattr("dtype")?)
        .getattr("kind")?
        .extract()?;
    if kind == "b" {
        return Err(PyTypeError::new_err(
            "order must be row indices, not booleans (for a mask, order=numpy.flatnonzero(mask))",
        ));
    }
    let values = integers(x, "order")?;
    match values.iter().position(|&v| v < 0) {
        Some(i) => Err(PyValueError::new_err(format!(
            "order[{i}] is {}, not a row",
            values[i]
        ))),
        None => Ok(values.into_iter().map(|v| v as usize).collect()),
    }
}

/// The integers of an array (or sequence) of integers, flattened.
fn integers(x: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<i64>> {
    let np = x.py().import("numpy")?;
    let array = np.call_method1("asarray", (x,))?;
    let kind: String = array.getattr("dtype")?.getattr("kind")?.extract()?;
    if !matches!(kind.as_str(), "i" | "u" | "b") {
        // (An empty list is an array of floats: no numbers.)
        if array.getattr("size")?.extract::<usize>()? == 0 {
            return Ok(Vec::new());
        }
        return Err(PyTypeError::new_err(format!("{what} must be integers")));
    }
    let flat = np.call_method1("ascontiguousarray", (array.call_method0("ravel")?, "int64"))?;
    let flat: PyReadonlyArrayDyn<'_, i64> = flat.extract()?;
    Ok(flat
        .as_slice()
        .map_err(|e| PyValueError::new_err(e.to_string()))?
        .to_vec())
}
