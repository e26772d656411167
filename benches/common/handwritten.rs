//! The per-sample SGD step of the 784-50-10 MNIST classifier written by hand in plain `f64`
//! Rust: the yardsticks the tape's backends are measured against.
//!
//! Both compute exactly what the tape of `nn::Classifier::new(&g, 784, &[50], 10, ..)` computes,
//! operation for operation and in the same order, so they track the interpreter bit for bit
//! (IEEE leaves nothing open here; Rust neither reassociates nor contracts into FMAs):
//!
//! - hidden: `h_j = relu(((b_j + w_j0*x_0) + w_j1*x_1) + ...)`, relu being `0 if 0 > h else h`;
//! - logits: `z_k = ((b_k + v_k0*h_0) + v_k1*h_1) + ...`;
//! - loss: `m + ln(sum_k exp(z_k - m)) - z_label` with `m = max_k z_k`, the sum from `k = 0`;
//! - backward as the tape runs it, in reverse build order: `ds = 1/s`, `dd_k = e_k * ds`,
//!   `dm = 1 - dd_9 - ... - dd_0`, `dz_k = (-[k = label] + dd_k) (+ dm at the argmax)`, the
//!   hidden gradient `dh_j = v_9j*dz_9 + ... + v_0j*dz_0` (classes in reverse), times relu's
//!   `[h_j > 0]`;
//! - update `p -= lr * grad`, with `grad = input * output gradient` for a weight.
//!
//! Params come in and go out in the tape's order (`Program::params`): layer by layer, neuron
//! by neuron, the neuron's weights then its bias.
//!
//! - [`Naive`] keeps that layout (row-major weights) and runs one dot-product loop per neuron:
//!   each neuron's sum is one long dependency chain the compiler may not vectorize.
//! - [`Expert`] stores the first layer input-major, so the forward pass is 784 axpys across
//!   the 50 hidden units (every hidden unit's own sum still runs in the order above, so
//!   nothing is reassociated, and the 50 chains run side by side in vector lanes); the
//!   output layer's backward and both updates are axpys too.
//! - [`ExpertSkippingZeros`] is [`Expert`] with one test per input in the first layer: an
//!   input that is 0 adds nothing to the sums and changes no weight, so its axpys are skipped
//!   (`if x_i == 0 { continue }`, as `../shared/baselines/handc_sparse.c` does). That is
//!   exact while the weights and gradients are finite, the learning rate positive and no
//!   sum is -0, as in MNIST training; it checks none of it.

// Each includer (report, benches, test) uses part of this file. Indexed loops spell out the
// formulas (and their summation order) more plainly than zipped iterators.
#![allow(dead_code, clippy::needless_range_loop)]

/// Pixels per image.
pub const INPUTS: usize = 784;
/// Hidden units.
pub const HIDDEN: usize = 50;
/// Classes (digits).
pub const CLASSES: usize = 10;
/// Params of 784-50-10: `HIDDEN * (INPUTS + 1) + CLASSES * (HIDDEN + 1)`.
pub const PARAMS: usize = HIDDEN * (INPUTS + 1) + CLASSES * (HIDDEN + 1);

/// Where the second layer starts in the tape's param order.
const LAYER2: usize = HIDDEN * (INPUTS + 1);

/// A hand-written training step with the tape's semantics.
pub trait HandWritten {
    /// The row's name in reports.
    const NAME: &'static str;
    /// Starts from params in the tape's order (`Program::params` of a compiled Classifier).
    fn from_params(params: &[f64]) -> Self;
    /// One SGD step on `pixels` (784 values, already scaled) labelled `label`; returns the
    /// loss before the update, as `Program::step` does.
    fn step(&mut self, pixels: &[f64], label: usize, lr: f64) -> f64;
    /// The params in the tape's order.
    fn params(&self) -> Vec<f64>;
}

/// micrograd's relu as the tape computes it (`-0` and NaN pass through).
#[inline(always)]
fn relu(h: f64) -> f64 {
    if 0.0 > h {
        0.0
    } else {
        h
    }
}

/// Softmax cross-entropy and its gradient with respect to the logits, in the tape's order.
/// Returns the loss; writes `dz`.
#[inline(always)]
fn softmax_ce(z: &[f64; CLASSES], label: usize, dz: &mut [f64; CLASSES]) -> f64 {
    // m = max(...max(max(z_0, z_1), z_2)..., z_9), keeping the earlier on ties.
    let mut best = 0;
    for k in 1..CLASSES {
        if z[k] > z[best] {
            best = k;
        }
    }
    let m = z[best];
    let mut e = [0.0; CLASSES];
    for k in 0..CLASSES {
        e[k] = tapejit::op::exp(z[k] - m);
    }
    let mut s = e[0];
    for &ek in &e[1..] {
        s += ek;
    }
    let lse = m + tapejit::op::log(s);
    let loss = lse - z[label];

    let ds = 1.0 / s;
    let mut dm = 1.0;
    for k in (0..CLASSES).rev() {
        let dd = e[k] * ds;
        dm -= dd;
        let picked = if k == label { -1.0 } else { 0.0 };
        dz[k] = picked + dd;
    }
    // max passes its gradient to the operand it picked.
    dz[best] += dm;
    loss
}

/// Row-major weights exactly as the tape lays out params; one dot product per neuron.
pub struct Naive {
    p: Vec<f64>,
}

impl HandWritten for Naive {
    const NAME: &'static str = "hand-written naive";

    fn from_params(params: &[f64]) -> Self {
        assert_eq!(params.len(), PARAMS, "params of a 784-50-10 classifier");
        Naive { p: params.to_vec() }
    }

    fn step(&mut self, pixels: &[f64], label: usize, lr: f64) -> f64 {
        let x = &pixels[..INPUTS];
        let (l1, l2) = self.p.split_at_mut(LAYER2);
        let mut h = [0.0; HIDDEN];
        for (hj, neuron) in h.iter_mut().zip(l1.chunks_exact(INPUTS + 1)) {
            let (w, b) = neuron.split_at(INPUTS);
            let mut acc = b[0];
            for i in 0..INPUTS {
                acc += w[i] * x[i];
            }
            *hj = relu(acc);
        }
        let mut z = [0.0; CLASSES];
        for (zk, neuron) in z.iter_mut().zip(l2.chunks_exact(HIDDEN + 1)) {
            let (w, b) = neuron.split_at(HIDDEN);
            let mut acc = b[0];
            for j in 0..HIDDEN {
                acc += w[j] * h[j];
            }
            *zk = acc;
        }
        let mut dz = [0.0; CLASSES];
        let loss = softmax_ce(&z, label, &mut dz);

        // Hidden gradients from the pre-update output weights, classes in reverse.
        let mut dh = [0.0; HIDDEN];
        for j in 0..HIDDEN {
            let mut acc = 0.0;
            for k in (0..CLASSES).rev() {
                acc += l2[k * (HIDDEN + 1) + j] * dz[k];
            }
            dh[j] = if h[j] > 0.0 { acc } else { 0.0 };
        }
        for (neuron, &g) in l2.chunks_exact_mut(HIDDEN + 1).zip(&dz) {
            let (w, b) = neuron.split_at_mut(HIDDEN);
            for j in 0..HIDDEN {
                w[j] -= lr * (h[j] * g);
            }
            b[0] -= lr * g;
        }
        for (neuron, &g) in l1.chunks_exact_mut(INPUTS + 1).zip(&dh) {
            let (w, b) = neuron.split_at_mut(INPUTS);
            for i in 0..INPUTS {
                w[i] -= lr * (x[i] * g);
            }
            b[0] -= lr * g;
        }
        loss
    }

    fn params(&self) -> Vec<f64> {
        self.p.clone()
    }
}

/// Input-major first layer (`w1[i][j]`: input `i` to hidden unit `j`): every inner loop runs
/// across hidden units and vectorizes without reassociating any sum. `SKIP_ZEROS`: the first
/// layer skips inputs that are 0.
pub struct Expert<const SKIP_ZEROS: bool = false> {
    w1: Vec<[f64; HIDDEN]>,
    b1: [f64; HIDDEN],
    /// Row-major: `w2[k][j]`, hidden unit `j` to class `k`.
    w2: [[f64; HIDDEN]; CLASSES],
    b2: [f64; CLASSES],
}

/// [`Expert`], skipping zero inputs in the first layer.
pub type ExpertSkippingZeros = Expert<true>;

impl<const SKIP_ZEROS: bool> HandWritten for Expert<SKIP_ZEROS> {
    const NAME: &'static str = if SKIP_ZEROS {
        "hand-written expert, zero-skipping"
    } else {
        "hand-written expert"
    };

    fn from_params(params: &[f64]) -> Self {
        assert_eq!(params.len(), PARAMS, "params of a 784-50-10 classifier");
        let mut e = Expert {
            w1: vec![[0.0; HIDDEN]; INPUTS],
            b1: [0.0; HIDDEN],
            w2: [[0.0; HIDDEN]; CLASSES],
            b2: [0.0; CLASSES],
        };
        for (j, neuron) in params[..LAYER2].chunks_exact(INPUTS + 1).enumerate() {
            for (i, &w) in neuron[..INPUTS].iter().enumerate() {
                e.w1[i][j] = w;
            }
            e.b1[j] = neuron[INPUTS];
        }
        for (k, neuron) in params[LAYER2..].chunks_exact(HIDDEN + 1).enumerate() {
            e.w2[k].copy_from_slice(&neuron[..HIDDEN]);
            e.b2[k] = neuron[HIDDEN];
        }
        e
    }

    fn step(&mut self, pixels: &[f64], label: usize, lr: f64) -> f64 {
        let x = &pixels[..INPUTS];
        // Forward: h_j = b_j, then h_j += w_ji * x_i for i = 0, 1, ...: per unit, the tape's
        // order; across units, one vector axpy per input.
        let mut h = self.b1;
        for (row, &xi) in self.w1.iter().zip(x) {
            if SKIP_ZEROS && xi == 0.0 {
                continue;
            }
            for j in 0..HIDDEN {
                h[j] += row[j] * xi;
            }
        }
        for hj in &mut h {
            *hj = relu(*hj);
        }
        let mut z = self.b2;
        for (zk, row) in z.iter_mut().zip(&self.w2) {
            for j in 0..HIDDEN {
                *zk += row[j] * h[j];
            }
        }
        let mut dz = [0.0; CLASSES];
        let loss = softmax_ce(&z, label, &mut dz);

        // Backward into the hidden layer: axpys across hidden units, classes in reverse.
        let mut dh = [0.0; HIDDEN];
        for k in (0..CLASSES).rev() {
            for j in 0..HIDDEN {
                dh[j] += self.w2[k][j] * dz[k];
            }
        }
        for j in 0..HIDDEN {
            dh[j] = if h[j] > 0.0 { dh[j] } else { 0.0 };
        }

        // Updates.
        for (row, (bk, &g)) in self.w2.iter_mut().zip(self.b2.iter_mut().zip(&dz)) {
            for j in 0..HIDDEN {
                row[j] -= lr * (h[j] * g);
            }
            *bk -= lr * g;
        }
        for (row, &xi) in self.w1.iter_mut().zip(x) {
            if SKIP_ZEROS && xi == 0.0 {
                continue;
            }
            for j in 0..HIDDEN {
                row[j] -= lr * (xi * dh[j]);
            }
        }
        for j in 0..HIDDEN {
            self.b1[j] -= lr * dh[j];
        }
        loss
    }

    fn params(&self) -> Vec<f64> {
        let mut p = Vec::with_capacity(PARAMS);
        for j in 0..HIDDEN {
            p.extend(self.w1.iter().map(|row| row[j]));
            p.push(self.b1[j]);
        }
        for k in 0..CLASSES {
            p.extend_from_slice(&self.w2[k]);
            p.push(self.b2[k]);
        }
        p
    }
}
