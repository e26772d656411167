//! The shapes of the code that carries out the other decisions: thresholds and block sizes
//! the emitter reads, so that it decides nothing. None changes a result, only the machine
//! code; each is a measured trade-off, said beside it.

/// The emitter's code shapes ([`super::Plan::tactics`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tactics {
    /// The longest run of gradients zeroed with stores rather than a memset.
    pub inline_zeros: usize,
    /// A loop over an item's elements of at most this many iterations is emitted as its
    /// iterations one after the other. A short loop's counter, compare, branch and the φ of
    /// each carried sum are a large part of its body, and with constant indices instruction
    /// combining and early CSE see through its loads: a value stored by one item and loaded
    /// by the next (an RNN cell's input terms, stored in lanes and summed right after) is
    /// forwarded in registers.
    pub unrolled_iterations: u32,
    /// Independent vectors of sums in `train`'s check that a sample's inputs are finite (one
    /// chain of additions would wait on each addition's latency).
    pub finite_sums: u32,
    /// Zero-skipping ([`super::ZeroSkip`]): how many samples run dense without looking after
    /// one too dense to skip (so dense data builds the list of steps once in
    /// `dense_wait + 1` samples).
    pub dense_wait: u64,
    /// Zero-skipping: whether each chunk of steps is packed in a register and stored as one
    /// vector (AVX-512 VL's `vpcompressd`, in its quick register form), where the host has
    /// it; else the list is built branch-free, without a compress-store, which AVX-512
    /// machines run slowly.
    pub compress_steps: bool,
    /// Zero-skipping: how many of `train`'s merged dot's vectors (of 8 sums) one pass over
    /// the list of steps carries. Each carries its sums and the gradients it updates by in
    /// registers across the pass: MNIST's 7 take 28 of AVX2's 16 registers and spilled every
    /// step, so there the list is walked once per vector (docs/benchmarks.md: 4-5% of
    /// `train`'s time on Zen 4; two per pass ran slower than one). AVX-512's 32 hold them.
    pub merged_vectors_per_pass: usize,
}

impl Tactics {
    /// The tactics for a host with or without AVX-512 (`host_avx512`).
    pub fn new(host_avx512: bool) -> Tactics {
        Tactics {
            inline_zeros: 128,
            unrolled_iterations: 4,
            finite_sums: 4,
            dense_wait: 8,
            compress_steps: host_avx512,
            merged_vectors_per_pass: if host_avx512 { usize::MAX } else { 1 },
        }
    }
}
