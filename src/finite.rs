//! Whether numbers are finite, fast: the check every input, param and sample goes through
//! (`Program`'s methods, minibatch threads, `Samples`' fields) and the zero-skipping guard's
//! question about a layer's weights.

/// Running sums per lane in the checks below: four vectors of eight, so that four chains of
/// additions run side by side (one would wait on each addition's latency).
const CHECK_LANES: usize = 32;

/// Whether every number of `xs` is finite. This runs on the samples `train` takes, so it
/// vectorizes: `x - x` is 0 for a finite `x` and NaN otherwise, and [`CHECK_LANES`] running
/// sums of it, one per lane, vectorize without reassociating anything (a fold over bools
/// does not).
pub fn all_finite(xs: &[f64]) -> bool {
    scan::<false>(xs).0
}

/// Whether every number of `xs` is finite, and whether none is -0, in one pass: the
/// zero-skipping guard's question about a layer's weights, asked again after every
/// minibatch's update.
pub fn finite_without_negative_zero(xs: &[f64]) -> (bool, bool) {
    scan::<true>(xs)
}

/// [`all_finite`], and with `NEGATIVE_ZEROS` a count of -0s per lane too (none: `true`).
fn scan<const NEGATIVE_ZEROS: bool>(xs: &[f64]) -> (bool, bool) {
    let negative_zero = (-0.0f64).to_bits();
    let mut lanes = [0.0f64; CHECK_LANES];
    let mut negative_zeros = [0u64; CHECK_LANES];
    let chunks = xs.chunks_exact(CHECK_LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for ((lane, count), x) in lanes.iter_mut().zip(&mut negative_zeros).zip(chunk) {
            #[allow(clippy::eq_op)]
            let zero_if_finite = x - x;
            *lane += zero_if_finite;
            if NEGATIVE_ZEROS {
                *count += (x.to_bits() == negative_zero) as u64;
            }
        }
    }
    let finite = lanes.iter().all(|&l| l == 0.0) && rest.iter().all(|x| x.is_finite());
    let none =
        negative_zeros.iter().all(|&c| c == 0) && rest.iter().all(|x| x.to_bits() != negative_zero);
    (finite, none)
}
