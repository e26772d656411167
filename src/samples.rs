//! Training samples as they are stored ([`Samples`]): bytes with a scale or a table, `f32`,
//! labels as one-hot inputs, `f64`, and an order over the rows of a dataset. `train_from`
//! and `train_minibatches_from` ([`crate::Program`]) convert them to the graph's `f64`
//! inputs inside the call, a few samples at a time on the thread that reads them, so no
//! converted copy of an epoch is ever made and the numbers are in cache when the step reads
//! them. A conversion is written once here, so each backend and thread count gets the very
//! numbers (the same operation on the same operands): `train` on the converted numbers
//! gives the same bits.
//!
//! Every byte's number is made when the field is added, so a byte field cannot hold a
//! non-finite input and needs no check per sample; `f64` and `f32` fields are checked
//! where a call reads them.

use std::ops::Range;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::finite::all_finite;

/// A dataset's samples in the form they are stored, and the order to train on them in.
///
/// A sample is a row: each field adds the next inputs of the graph (in the order the inputs
/// were created), read from the field's row. Every field has the same number of rows.
///
/// ```
/// use tapejit::Samples;
/// // Two images of 4 pixels, their labels among 3 classes: 4 + 3 inputs per sample.
/// let pixels = [0u8, 255, 51, 0, 10, 20, 30, 40];
/// let labels = [2u8, 0];
/// let samples = Samples::new()
///     .bytes_over(&pixels, 4, 255.0)?
///     .one_hot(&labels, 3)?
///     .in_order(&[1, 0, 1])?;
/// assert_eq!((samples.len(), samples.width()), (3, 7));
/// let mut first = [0.0; 7];
/// samples.convert(0..1, &mut first)?;
/// assert_eq!(first, [10.0 / 255.0, 20.0 / 255.0, 30.0 / 255.0, 40.0 / 255.0, 1.0, 0.0, 0.0]);
/// # Ok::<(), tapejit::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct Samples<'a> {
    fields: Vec<Field<'a>>,
    /// Rows in the dataset (every field's); `None` until a field is added.
    rows: Option<usize>,
    width: usize,
    order: Option<&'a [usize]>,
    /// The samples trained on: positions in the order, or rows (`None`: all of them).
    window: Option<Range<usize>>,
}

/// The next `width` inputs of every sample, read from `data`'s row.
#[derive(Clone, Debug)]
struct Field<'a> {
    data: Data<'a>,
    /// Inputs this field gives a sample, and the first of them.
    width: usize,
    first: usize,
}

#[derive(Clone, Debug)]
enum Data<'a> {
    F64(&'a [f64]),
    F32(&'a [f32]),
    /// Bytes, and how each becomes its number.
    Bytes(&'a [u8], ByteMath),
    /// One label per row: input `k` of the field is 1 where the label is `k`, else 0.
    OneHot(&'a [u8]),
}

impl<'a> Samples<'a> {
    /// No fields yet.
    pub fn new() -> Samples<'a> {
        Samples::default()
    }

    /// `f64` numbers as they are, `width` per row (`Program::train`'s layout).
    pub fn numbers(self, data: &'a [f64], width: usize) -> Result<Samples<'a>> {
        self.with(Data::F64(data), data.len(), width)
    }

    /// `f32` numbers, `width` per row, each widened to `f64` (exact).
    pub fn f32s(self, data: &'a [f32], width: usize) -> Result<Samples<'a>> {
        self.with(Data::F32(data), data.len(), width)
    }

    /// Bytes, `width` per row, each input `byte as f64 / divisor` (how images are usually
    /// scaled to [0, 1]: `divisor` 255).
    pub fn bytes_over(self, data: &'a [u8], width: usize, divisor: f64) -> Result<Samples<'a>> {
        let over = ByteMath::Over {
            divisor,
            recip: 1.0 / divisor,
        };
        let exact = |b: u8| over.number(b).to_bits() == (b as f64 / divisor).to_bits();
        match (0..=255u8).all(exact) {
            true => self.bytes_with(data, width, over),
            false => self.bytes_mapped(data, width, |b| b as f64 / divisor),
        }
    }

    /// Bytes, `width` per row, each input `byte as f64 * scale`.
    pub fn bytes_times(self, data: &'a [u8], width: usize, scale: f64) -> Result<Samples<'a>> {
        self.bytes_with(data, width, ByteMath::Times(scale))
    }

    /// Bytes, `width` per row, each input `convert(byte)`.
    pub fn bytes_mapped(
        self,
        data: &'a [u8],
        width: usize,
        convert: impl Fn(u8) -> f64,
    ) -> Result<Samples<'a>> {
        let table: [f64; 256] = std::array::from_fn(|b| convert(b as u8));
        self.bytes_with(data, width, ByteMath::Table(Arc::new(table)))
    }

    fn bytes_with(self, data: &'a [u8], width: usize, math: ByteMath) -> Result<Samples<'a>> {
        if let Some(b) = (0..=255u8).find(|&b| !math.number(b).is_finite()) {
            return Err(problem(format!(
                "byte {b} converts to {}, not a finite number",
                math.number(b)
            )));
        }
        self.with(Data::Bytes(data, math), data.len(), width)
    }

    /// One label per row, as `classes` inputs: 1 at the label, 0 elsewhere (a classifier's
    /// target). A label of `classes` or more is [`Error::Samples`].
    pub fn one_hot(self, labels: &'a [u8], classes: usize) -> Result<Samples<'a>> {
        if let Some(row) = labels.iter().position(|&l| l as usize >= classes) {
            return Err(problem(format!(
                "label {} of row {row} is not one of {classes} classes",
                labels[row]
            )));
        }
        let len = (labels.len().checked_mul(classes))
            .ok_or_else(|| problem(format!("{} labels of {classes} classes", labels.len())))?;
        self.with(Data::OneHot(labels), len, classes)
    }

    /// The same fields, trained on in `order` (indices of rows, each less than the rows; a
    /// row may come any number of times): a shuffled epoch without a shuffled copy.
    pub fn in_order(&self, order: &'a [usize]) -> Result<Samples<'a>> {
        let rows = self.rows.unwrap_or(0);
        if let Some(i) = order.iter().position(|&r| r >= rows) {
            return Err(problem(format!(
                "order[{i}] is row {}, but the fields have {rows} rows",
                order[i]
            )));
        }
        Ok(Samples {
            order: Some(order),
            window: None,
            ..self.clone()
        })
    }

    /// Samples to train on: the order's length, or every row.
    pub fn len(&self) -> usize {
        match &self.window {
            Some(w) => w.len(),
            None => self.order.map_or(self.rows.unwrap_or(0), <[usize]>::len),
        }
    }

    /// Samples `part` of these (`part` within `0..len()`).
    pub(crate) fn part(&self, part: Range<usize>) -> Samples<'a> {
        let start = self.window.as_ref().map_or(0, |w| w.start);
        debug_assert!(part.end <= self.len());
        Samples {
            window: Some(start + part.start..start + part.end),
            ..self.clone()
        }
    }

    /// The row sample `s` reads.
    fn row(&self, s: usize) -> usize {
        let at = self.window.as_ref().map_or(0, |w| w.start) + s;
        self.order.map_or(at, |o| o[at])
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Inputs per sample (the fields' widths added up).
    pub fn width(&self) -> usize {
        self.width
    }

    /// Samples `samples` as `f64` inputs into `out`, one after another (`width` each): the
    /// numbers `train_from` trains on. Samples beyond [`Samples::len`] are
    /// [`Error::Samples`], an `out` of another length [`Error::WrongLength`].
    pub fn convert(&self, samples: Range<usize>, out: &mut [f64]) -> Result<()> {
        if samples.start > samples.end || samples.end > self.len() {
            return Err(problem(format!(
                "samples {samples:?} of {} samples",
                self.len()
            )));
        }
        if out.len() != samples.len() * self.width {
            return Err(Error::WrongLength {
                what: "converted samples",
                expected: samples.len() * self.width,
                got: out.len(),
            });
        }
        self.fill(samples, out);
        Ok(())
    }

    /// [`Samples::convert`] of samples known to be there into an `out` of their length.
    pub(crate) fn fill(&self, samples: Range<usize>, out: &mut [f64]) {
        self.convert_columns(samples, 0..self.width, out);
    }

    /// [`Samples::convert`] of inputs `columns` of each sample only (`out` laid out as whole
    /// samples; the other inputs left as they are).
    pub(crate) fn convert_columns(
        &self,
        samples: Range<usize>,
        columns: Range<usize>,
        out: &mut [f64],
    ) {
        let width = self.width;
        for field in &self.fields {
            let lo = columns.start.max(field.first);
            let hi = columns.end.min(field.first + field.width);
            if lo >= hi {
                continue;
            }
            let inside = lo - field.first..hi - field.first;
            // The rows' lines read first, each load independent of the others, so that
            // their cache misses overlap (a shuffled epoch's rows come from memory):
            // converting row by row waited on each row's first line, and took 40% of the
            // run of per-sample SGD on MNIST.
            let touched = samples
                .clone()
                .map(|s| field.touch(self.row(s), inside.clone()));
            std::hint::black_box(touched.fold(0u8, |a, b| a ^ b));
            for (s, row_out) in samples.clone().zip(out.chunks_exact_mut(width)) {
                field.convert(self.row(s), inside.clone(), &mut row_out[lo..hi]);
            }
        }
    }

    /// The samples as one slice of numbers in `train`'s layout, where they are stored so
    /// (one `f64` field, no order): nothing to convert.
    pub(crate) fn as_numbers(&self) -> Option<&'a [f64]> {
        let ([field], None) = (&self.fields[..], self.order) else {
            return None;
        };
        let (Data::F64(data), w) = (&field.data, self.width) else {
            return None;
        };
        match &self.window {
            Some(r) => Some(&data[r.start * w..r.end * w]),
            None => Some(data),
        }
    }

    /// That every input is finite; else the first that is not, as `Program::train` reports
    /// it on the converted numbers (its index among them).
    pub(crate) fn check_finite(&self) -> Result<()> {
        self.check_finite_from(0)
    }

    /// [`Samples::check_finite`] from sample `from` on.
    pub(crate) fn check_finite_from(&self, from: usize) -> Result<()> {
        if !self.may_be_non_finite() {
            return Ok(());
        }
        for s in from..self.len() {
            for field in &self.fields {
                if let Some((k, value)) = field.non_finite(self.row(s)) {
                    return Err(Error::NonFinite {
                        what: "input",
                        index: s * self.width + field.first + k,
                        value,
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether a field can hold a non-finite number (bytes cannot).
    fn may_be_non_finite(&self) -> bool {
        let numbers = |f: &Field| matches!(f.data, Data::F64(_) | Data::F32(_));
        self.fields.iter().any(numbers)
    }

    fn with(mut self, data: Data<'a>, len: usize, width: usize) -> Result<Samples<'a>> {
        if width == 0 || len % width != 0 {
            return Err(problem(format!(
                "a field of {len} numbers is not rows of {width}"
            )));
        }
        let rows = len / width;
        if let Some(before) = self.rows.filter(|&r| r != rows) {
            return Err(problem(format!(
                "a field of {rows} rows beside fields of {before}"
            )));
        }
        if let Some(order) = self.order {
            // (Checked again against the new rows.)
            self = Samples {
                rows: Some(rows),
                ..self
            }
            .in_order(order)?;
        }
        self.window = None;
        self.rows = Some(rows);
        let total = (self.width.checked_add(width))
            .ok_or_else(|| problem(format!("fields of {} and {width} inputs", self.width)))?;
        self.fields.push(Field {
            data,
            width,
            first: self.width,
        });
        self.width = total;
        Ok(self)
    }
}

impl Field<'_> {
    /// Inputs `inside` of the field for `row`, into `out`.
    fn convert(&self, row: usize, inside: Range<usize>, out: &mut [f64]) {
        let at = row * self.width + inside.start..row * self.width + inside.end;
        match &self.data {
            Data::F64(data) => out.copy_from_slice(&data[at]),
            Data::F32(data) => {
                for (x, &v) in out.iter_mut().zip(&data[at]) {
                    *x = v as f64;
                }
            }
            Data::Bytes(data, math) => math.convert(&data[at], out),
            Data::OneHot(labels) => {
                let label = labels[row] as usize;
                for (x, k) in out.iter_mut().zip(inside) {
                    *x = if k == label { 1.0 } else { 0.0 };
                }
            }
        }
    }

    /// A byte of each cache line inputs `inside` of `row` lie on (read to bring them into
    /// cache).
    fn touch(&self, row: usize, inside: Range<usize>) -> u8 {
        let at = row * self.width + inside.start..row * self.width + inside.end;
        let lines = |bytes: &[u8]| bytes.iter().step_by(64).fold(0, |a, b| a ^ b);
        match &self.data {
            Data::F64(data) => data[at]
                .iter()
                .step_by(8)
                .fold(0, |a, x| a ^ x.to_bits() as u8),
            Data::F32(data) => data[at]
                .iter()
                .step_by(16)
                .fold(0, |a, x| a ^ x.to_bits() as u8),
            Data::Bytes(data, _) => lines(&data[at]),
            Data::OneHot(labels) => labels[row],
        }
    }

    /// The first non-finite number of `row` (its place in the field), if any.
    fn non_finite(&self, row: usize) -> Option<(usize, f64)> {
        let at = row * self.width..(row + 1) * self.width;
        let first =
            |xs: &mut dyn Iterator<Item = f64>| xs.enumerate().find(|(_, x)| !x.is_finite());
        match &self.data {
            // (Most rows are finite: the vectorized check first.)
            Data::F64(data) if all_finite(&data[at.clone()]) => None,
            Data::F64(data) => first(&mut data[at].iter().copied()),
            Data::F32(data) => first(&mut data[at].iter().map(|&v| v as f64)),
            _ => None,
        }
    }
}

/// How a byte field computes each byte's number: by the field's own operations where they
/// vectorize (a table lookup is a gather, slow in every lane), else from a table made by
/// its conversion. Each gives every byte the very number its conversion gives it.
#[derive(Clone, Debug)]
enum ByteMath {
    /// `b * scale`.
    Times(f64),
    /// `b / divisor`, as `q + (b - q * divisor) * recip` with `q = b * recip`, in fused
    /// multiply-adds: the correctly rounded quotient, which `bytes_over` checked for every
    /// byte (a division per byte took twice the time).
    Over {
        divisor: f64,
        recip: f64,
    },
    Table(Arc<[f64; 256]>),
}

impl ByteMath {
    fn number(&self, b: u8) -> f64 {
        let mut x = [0.0];
        self.convert(&[b], &mut x);
        x[0]
    }

    /// Each of `bytes`' numbers into `out`: a loop per kind, each run several bytes at a
    /// time.
    fn convert(&self, bytes: &[u8], out: &mut [f64]) {
        match self {
            &ByteMath::Times(scale) => each(bytes, out, |x| x * scale),
            &ByteMath::Over { divisor, recip } => each(bytes, out, |x| {
                let q = x * recip;
                (-q).mul_add(divisor, x).mul_add(recip, q)
            }),
            ByteMath::Table(table) => {
                for (x, &b) in out.iter_mut().zip(bytes) {
                    *x = table[b as usize];
                }
            }
        }
    }
}

/// `number(byte as f64)` for each of `bytes`, into `out`.
#[inline(always)]
fn each(bytes: &[u8], out: &mut [f64], number: impl Fn(f64) -> f64) {
    for (x, &b) in out.iter_mut().zip(bytes) {
        *x = number(b as f64);
    }
}

fn problem(problem: String) -> Error {
    Error::Samples { problem }
}
