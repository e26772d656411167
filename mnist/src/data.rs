//! Images, labels, and the helpers that turn them into `f64` inputs. Nothing here knows how
//! a model lays out its inputs: the caller places the pixels and the one-hot label.

use std::fmt;

use crate::error::{Error, Result};

/// A set of equally sized greyscale images, one byte per pixel.
#[derive(Clone, PartialEq, Eq)]
pub struct Images {
    pub count: usize,
    pub rows: usize,
    pub cols: usize,
    /// Row-major; image `i` is `pixels[i * rows * cols..(i + 1) * rows * cols]`.
    pub pixels: Vec<u8>,
}

impl Images {
    /// The number of images.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether there are no images.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// `rows * cols`.
    pub fn pixels_per_image(&self) -> usize {
        self.rows * self.cols
    }

    /// The pixels of image `i`, row-major.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`, like slice indexing.
    pub fn image(&self, i: usize) -> &[u8] {
        assert!(i < self.count, "image {i} of {} images", self.count);
        let size = self.pixels_per_image();
        &self.pixels[i * size..(i + 1) * size]
    }
}

/// Summarizes rather than printing every pixel, so a failed `assert_eq!` stays readable.
impl fmt::Debug for Images {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Images")
            .field("count", &self.count)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("pixels.len()", &self.pixels.len())
            .finish()
    }
}

/// One digit 0-9 per example.
#[derive(Clone, PartialEq, Eq)]
pub struct Labels {
    pub labels: Vec<u8>,
}

impl Labels {
    /// The number of labels.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no labels.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Summarizes rather than printing every label, so a failed `assert_eq!` stays readable.
impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Labels")
            .field("labels.len()", &self.labels.len())
            .finish()
    }
}

/// Images and their labels; `images.len() == labels.len()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataset {
    pub images: Images,
    pub labels: Labels,
}

impl Dataset {
    pub fn len(&self) -> usize {
        self.images.len()
    }

    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
    }

    /// The pixels of example `i`, row-major.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`, like slice indexing.
    pub fn pixels(&self, i: usize) -> &[u8] {
        self.images.image(i)
    }

    /// The label of example `i`, a digit 0-9.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`, like slice indexing.
    pub fn label(&self, i: usize) -> u8 {
        self.labels.labels[i]
    }
}

/// Writes `pixels` into `out` scaled from `0..=255` to `[0, 1]` (`p as f64 / 255.0`, so a
/// given pixel always becomes the same `f64`). `out` must be exactly as long as `pixels`.
pub fn write_normalized(pixels: &[u8], out: &mut [f64]) -> Result<()> {
    if out.len() != pixels.len() {
        return Err(Error::WrongLength {
            what: "normalized pixels",
            expected: pixels.len(),
            got: out.len(),
        });
    }
    // The division itself, which LLVM runs eight pixels at a time: with AVX-512 a table
    // lookup became a gather, and an image took 420 ns against 245 for the division
    // (Zen 4, `target-cpu=native` as every build here; the same correctly rounded quotient).
    for (x, &p) in out.iter_mut().zip(pixels) {
        *x = p as f64 / 255.0;
    }
    Ok(())
}

/// Writes `label` one-hot into `out`: 1 at index `label`, 0 elsewhere. `out` has one value
/// per class, so `label` must be below `out.len()`.
pub fn write_one_hot(label: u8, out: &mut [f64]) -> Result<()> {
    let index = label as usize;
    if index >= out.len() {
        return Err(Error::NoSlotForLabel {
            label,
            classes: out.len(),
        });
    }
    out.fill(0.0);
    out[index] = 1.0;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_table_is_the_division() {
        let pixels: Vec<u8> = (0..=255).collect();
        let mut out = vec![0.0; 256];
        super::write_normalized(&pixels, &mut out).unwrap();
        for (&p, x) in pixels.iter().zip(out) {
            assert_eq!(x.to_bits(), (p as f64 / 255.0).to_bits(), "pixel {p}");
        }
    }
}
