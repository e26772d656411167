//! Buffers of numbers that start on a cache line.
//!
//! The native code loads and stores a layer's weights a vector of eight at a time, and a
//! vector that straddles two cache lines costs two accesses. Where a layer's rows are whole
//! lines, they start on one only if the buffer does; `Vec<f64>` promises 8 bytes (the
//! allocator gave MNIST's buffers 16 or 48 bytes past a line). Measured on `train()` with 48
//! hidden units (rows of 6 lines): 2.82 us per sample from the allocator's address, 2.40 from
//! a line's.

use std::ops::{Deref, DerefMut};

/// Bytes per cache line (x86-64 and AArch64 alike).
const LINE_BYTES: usize = 64;

/// Numbers per cache line.
const LINE: usize = LINE_BYTES / std::mem::size_of::<f64>();

/// A fixed-length buffer of `f64`s whose first number starts a cache line; derefs to its
/// numbers.
#[derive(Debug, Default)]
pub struct AlignedBuf {
    /// `len` numbers from `start`, and up to a line's worth before them.
    storage: Vec<f64>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zeros.
    pub fn zeros(len: usize) -> AlignedBuf {
        let storage = vec![0.0; len + LINE - 1];
        // (`align_offset` may say it cannot align; then the buffer starts where it starts,
        // which costs speed only.)
        let start = match storage.as_ptr().align_offset(LINE_BYTES) {
            k if k < LINE => k,
            _ => 0,
        };
        AlignedBuf {
            storage,
            start,
            len,
        }
    }

    /// A copy of `xs`.
    pub fn from_slice(xs: &[f64]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeros(xs.len());
        buf.copy_from_slice(xs);
        buf
    }
}

impl Clone for AlignedBuf {
    /// A copy that starts on a line of its own.
    fn clone(&self) -> AlignedBuf {
        AlignedBuf::from_slice(self)
    }
}

impl Deref for AlignedBuf {
    type Target = [f64];

    fn deref(&self) -> &[f64] {
        &self.storage[self.start..self.start + self.len]
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [f64] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_line_and_holds_its_numbers() {
        for len in [0, 1, 7, 8, 9, 1000] {
            let xs: Vec<f64> = (0..len).map(|i| i as f64).collect();
            let buf = AlignedBuf::from_slice(&xs);
            let copy = buf.clone();
            for b in [&buf, &copy] {
                assert_eq!(&b[..], &xs[..]);
                assert_eq!(b.as_ptr() as usize % LINE_BYTES, 0, "len {len}");
            }
        }
        assert!(AlignedBuf::zeros(5).iter().all(|&x| x == 0.0));
    }
}
