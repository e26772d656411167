//! Buffers of numbers that start on a cache line.
//!
//! The native code loads and stores a layer's weights a vector of eight at a time, and a
//! vector that straddles two cache lines costs two accesses. Where a layer's rows are whole
//! lines, they start on one only if the buffer does; `Vec<f64>` promises 8 bytes (the
//! allocator gave MNIST's buffers 16 or 48 bytes past a line). Measured on `train()` with 48
//! hidden units (rows of 6 lines): 2.82 us per sample from the allocator's address, 2.40 from
//! a line's.

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

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

/// Buffers a program keeps from one call to the next (`Program::train_minibatches`' copies
/// and gradient buffers), so that a call reuses memory it has touched before: fresh memory
/// costs the kernel a page fault per 4 KB on first touch, and freed memory goes back to it.
/// Measured on MNIST 784-50-10 (minibatches of 32 on 1 or 2 threads): some 0.7-0.9 ms per
/// call went to fresh pages, against about 1 us per sample of work.
#[derive(Debug, Default)]
pub struct Spares(Mutex<Vec<AlignedBuf>>);

impl Spares {
    /// The most buffers kept (a few per thread); more are freed.
    const KEPT: usize = 32;

    /// `len` zeros.
    pub fn zeros(&self, len: usize) -> AlignedBuf {
        match self.take(len) {
            Some(mut buf) => {
                buf.fill(0.0);
                buf
            }
            None => AlignedBuf::zeros(len),
        }
    }

    /// `len` numbers, whatever a kept buffer held (zeros if none was kept): for a caller that
    /// writes what it reads.
    pub fn any(&self, len: usize) -> AlignedBuf {
        self.take(len).unwrap_or_else(|| AlignedBuf::zeros(len))
    }

    /// A copy of `xs`.
    pub fn copy_of(&self, xs: &[f64]) -> AlignedBuf {
        match self.take(xs.len()) {
            Some(mut buf) => {
                buf.copy_from_slice(xs);
                buf
            }
            None => AlignedBuf::from_slice(xs),
        }
    }

    /// Keeps `buf` for a later call.
    pub fn keep(&self, buf: AlignedBuf) {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < Self::KEPT && buf.len > 0 {
            kept.push(buf);
        }
    }

    fn take(&self, len: usize) -> Option<AlignedBuf> {
        let mut kept = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let at = kept.iter().position(|b| b.len == len)?;
        Some(kept.swap_remove(at))
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

    #[test]
    fn spares_hand_back_kept_buffers_of_the_length_asked() {
        let spares = Spares::default();
        let buf = spares.copy_of(&[1.0, 2.0, 3.0]);
        let at = buf.as_ptr();
        spares.keep(buf);
        assert_eq!(&spares.zeros(2)[..], &[0.0, 0.0]);
        let again = spares.zeros(3);
        assert_eq!((&again[..], again.as_ptr()), (&[0.0; 3][..], at));
        spares.keep(again);
        let copy = spares.copy_of(&[4.0, 5.0, 6.0]);
        assert_eq!((&copy[..], copy.as_ptr()), (&[4.0, 5.0, 6.0][..], at));
    }
}
