//! Hand-written Rust yardsticks for the graph families of `families.rs`: for each family the
//! training step an expert would write by hand (forward, backward, SGD update) as plain loops
//! over `f64` arrays laid out for the loops that read them (input-major weights where the
//! forward pass runs axpys across a layer's neurons, row-major where backward runs them across
//! a neuron's inputs), from the same params and data.
//!
//! Each one performs the tape's operations in the interpreter's order, so it tracks the
//! interpreter **bit for bit** (checked by `tests/families.rs`): forward in build order;
//! backward in reverse build order, each op's local derivative written as `op.rs` writes it
//! (`d tanh = (1 - t*t) * g`, `d relu = [out > 0] * g`, `d (a*b)/da = b * g`,
//! `d pow(a, c) = (c * pow(a, c - 1)) * g`, `d sqrt(a) = (0.5 / sqrt(a)) * g`, ...), every
//! gradient summed in the order the interpreter adds to it: a param's contributions copy by
//! copy or step by step from the last, a hidden unit's from the last neuron reading it. Where an
//! accumulator has only two contributions (and those start from 0) the order is free, since
//! addition commutes. Signs of zero may differ (`0 * g` against a skipped term) and never
//! show: a gradient accumulator starts at +0, to which adding either zero gives +0.
//!
//! `tanh` and `exp` are tapejit's (`tapejit::op::tanh` and `exp`, what `Op::Tanh` and `Op::Exp`
//! compute; glibc's agree with them on most inputs, within 2 and 1 ULP),
//! as a hand-written loop calls libm's. The loss value is
//! computed the same way; params are taken and given in `Program::params` order (creation
//! order). There is no yardstick for the random DAG: nobody writes one by hand.
//!
//! Included with `#[path]` next to `families.rs` (as `mod families`).

// Each includer uses part of this file. Indexed loops spell out the formulas (and their
// summation order) more plainly than zipped iterators.
#![allow(dead_code, clippy::needless_range_loop)]

use crate::families::{
    Family, Minibatch, Moons, Rnn, Springs, SPRING_DAMPING, SPRING_DT, SPRING_GRAVITY, SPRING_REST,
};

/// A hand-written training step on a family's fixed data.
pub trait Yardstick {
    /// `zero_grad`, forward, backward, `p -= lr * grad`; returns the loss before the update.
    fn step(&mut self, lr: f64) -> f64;
    /// The params in creation order.
    fn params(&self) -> Vec<f64>;
    fn set_params(&mut self, params: &[f64]);
}

/// The yardstick of `family`, starting from `params` (creation order) on the step inputs
/// `inputs` (what `Family::build` returned); `None` for the random DAG, for the math
/// families of `families_math.rs` (none written yet) and for a minibatch whose hidden width
/// is not one of [`MINIBATCH_HIDDEN`].
pub fn for_family(family: &Family, params: &[f64], inputs: &[f64]) -> Option<Box<dyn Yardstick>> {
    let mut y: Box<dyn Yardstick> = match family {
        Family::Moons(m) => Box::new(MoonsStep::new(m, inputs)),
        Family::Minibatch(m) => minibatch_step(m, inputs)?,
        Family::Rnn(r) => Box::new(RnnStep::new(r, inputs)),
        Family::Springs(s) => Box::new(SpringsStep::new(s, inputs)),
        Family::Dag(_) | Family::Attention(_) | Family::Lstm(_) | Family::NBody(_) => return None,
    };
    y.set_params(params);
    Some(y)
}

/// micrograd's relu as the tape computes it.
#[inline(always)]
fn relu(a: f64) -> f64 {
    if 0.0 > a {
        0.0
    } else {
        a
    }
}

/// relu's local derivative times `g`, as `op.rs` writes it.
#[inline(always)]
fn relu_grad(out: f64, g: f64) -> f64 {
    (if out > 0.0 { 1.0 } else { 0.0 }) * g
}

/// `y[j] += x[j] * a`: one accumulator per element, so any order across `j` is the same.
#[inline(always)]
fn axpy(y: &mut [f64], a: f64, x: &[f64]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += x * a;
    }
}

/// SGD on one flat array.
#[inline(always)]
fn sgd(p: &mut [f64], g: &[f64], lr: f64) {
    for (p, g) in p.iter_mut().zip(g) {
        *p -= lr * g;
    }
}

// ---------------------------------------------------------------------------------------------
// moons
// ---------------------------------------------------------------------------------------------

/// One dense layer: row-major weights (`w[j * nin + i]`: input `i` to neuron `j`) for the
/// backward pass, and an input-major copy (`wt[i * nout + j]`) for the forward pass.
#[derive(Clone)]
struct Dense {
    nin: usize,
    nout: usize,
    relu: bool,
    w: Vec<f64>,
    wt: Vec<f64>,
    b: Vec<f64>,
    gw: Vec<f64>,
    gb: Vec<f64>,
}

impl Dense {
    /// `wt` from `w`.
    fn transpose(&mut self) {
        for j in 0..self.nout {
            for i in 0..self.nin {
                self.wt[i * self.nout + j] = self.w[j * self.nin + i];
            }
        }
    }
}

/// The moons demo, point by point: forward as axpys across a layer's neurons (each neuron's
/// sum still `((b + w0*x0) + w1*x1) + ...`), backward as axpys across a neuron's inputs.
pub struct MoonsStep {
    points: Vec<[f64; 2]>,
    labels: Vec<f64>,
    alpha: f64,
    layers: Vec<Dense>,
    /// Per layer, the layer's outputs for every point (`acts[l][p * nout + j]`).
    acts: Vec<Vec<f64>>,
    /// The gradient of the current layer's outputs, and of its inputs.
    g_out: Vec<f64>,
    g_in: Vec<f64>,
}

impl MoonsStep {
    pub fn new(m: &Moons, inputs: &[f64]) -> MoonsStep {
        let n = m.points;
        let points = inputs[..2 * n].chunks(2).map(|c| [c[0], c[1]]).collect();
        let labels = inputs[2 * n..3 * n].to_vec();
        let mut nin = 2;
        let layers: Vec<Dense> = m
            .layers
            .iter()
            .enumerate()
            .map(|(l, &nout)| {
                let d = Dense {
                    nin,
                    nout,
                    relu: l + 1 < m.layers.len(),
                    w: vec![0.0; nin * nout],
                    wt: vec![0.0; nin * nout],
                    b: vec![0.0; nout],
                    gw: vec![0.0; nin * nout],
                    gb: vec![0.0; nout],
                };
                nin = nout;
                d
            })
            .collect();
        let acts = layers.iter().map(|d| vec![0.0; n * d.nout]).collect();
        let widest = m.layers.iter().copied().max().unwrap_or(1).max(2);
        MoonsStep {
            points,
            labels,
            alpha: m.alpha,
            layers,
            acts,
            g_out: vec![0.0; widest],
            g_in: vec![0.0; widest],
        }
    }
}

impl Yardstick for MoonsStep {
    fn step(&mut self, lr: f64) -> f64 {
        let n = self.points.len();
        // Forward, point by point: out = b, then out += wt[i] * x_i for i = 0, 1, ...
        for p in 0..n {
            for l in 0..self.layers.len() {
                let (done, rest) = self.acts.split_at_mut(l);
                let d = &self.layers[l];
                let x: &[f64] = if l == 0 {
                    &self.points[p]
                } else {
                    &done[l - 1][p * d.nin..(p + 1) * d.nin]
                };
                let out = &mut rest[0][p * d.nout..(p + 1) * d.nout];
                out.copy_from_slice(&d.b);
                for i in 0..d.nin {
                    axpy(out, x[i], &d.wt[i * d.nout..(i + 1) * d.nout]);
                }
                if d.relu {
                    for o in out.iter_mut() {
                        *o = relu(*o);
                    }
                }
            }
        }
        let scores = self.acts.last().expect("a layer");
        // data = sum(relu(1 + (-y) * s)) * (1 / n); reg = alpha * sum(p * p).
        let margins: Vec<f64> = (0..n)
            .map(|p| relu(1.0 + -self.labels[p] * scores[p]))
            .collect();
        let mut data = margins[0];
        for &m in &margins[1..] {
            data += m;
        }
        let scale = 1.0 / n as f64;
        let data = data * scale;
        let mut squares = 0.0;
        let mut first = true;
        for d in &self.layers {
            for j in 0..d.nout {
                for &w in d.w[j * d.nin..(j + 1) * d.nin].iter().chain([&d.b[j]]) {
                    squares = if first { w * w } else { squares + w * w };
                    first = false;
                }
            }
        }
        let loss = data + self.alpha * squares;

        // Backward. The L2 term was built last: each param starts at (0 + p*alpha) + p*alpha.
        for d in &mut self.layers {
            for (g, &w) in d.gw.iter_mut().zip(&d.w) {
                *g = w * self.alpha + w * self.alpha;
            }
            for (g, &b) in d.gb.iter_mut().zip(&d.b) {
                *g = b * self.alpha + b * self.alpha;
            }
        }
        // Then the points' MLPs, the last point first, each from its last layer back.
        let last = self.layers.len() - 1;
        for p in (0..n).rev() {
            let margin_grad = relu_grad(margins[p], scale);
            self.g_out[0] = -self.labels[p] * margin_grad;
            for l in (0..=last).rev() {
                let d = &mut self.layers[l];
                let x: &[f64] = if l == 0 {
                    &self.points[p]
                } else {
                    &self.acts[l - 1][p * d.nin..(p + 1) * d.nin]
                };
                let out = &self.acts[l][p * d.nout..(p + 1) * d.nout];
                self.g_in[..d.nin].fill(0.0);
                for j in (0..d.nout).rev() {
                    let g = if d.relu {
                        relu_grad(out[j], self.g_out[j])
                    } else {
                        self.g_out[j]
                    };
                    d.gb[j] += g;
                    let (w, gw) = (
                        &d.w[j * d.nin..(j + 1) * d.nin],
                        &mut d.gw[j * d.nin..(j + 1) * d.nin],
                    );
                    axpy(gw, g, x);
                    axpy(&mut self.g_in[..d.nin], g, w);
                }
                std::mem::swap(&mut self.g_out, &mut self.g_in);
            }
        }
        for d in &mut self.layers {
            sgd(&mut d.w, &d.gw, lr);
            sgd(&mut d.b, &d.gb, lr);
            d.transpose();
        }
        loss
    }

    fn params(&self) -> Vec<f64> {
        let mut out = Vec::new();
        for d in &self.layers {
            for j in 0..d.nout {
                out.extend_from_slice(&d.w[j * d.nin..(j + 1) * d.nin]);
                out.push(d.b[j]);
            }
        }
        out
    }

    fn set_params(&mut self, params: &[f64]) {
        let mut it = params.iter().copied();
        for d in &mut self.layers {
            for j in 0..d.nout {
                for i in 0..d.nin {
                    d.w[j * d.nin + i] = it.next().expect("enough params");
                }
                d.b[j] = it.next().expect("enough params");
            }
            d.transpose();
        }
        assert!(it.next().is_none(), "too many params for the moons MLP");
    }
}

// ---------------------------------------------------------------------------------------------
// minibatch
// ---------------------------------------------------------------------------------------------

/// The hidden widths [`MinibatchStep`] is compiled for (an expert writes for the model at
/// hand; a fixed width keeps a sample's hidden sums in registers): MNIST's 50, and the tests'.
pub const MINIBATCH_HIDDEN: [usize; 2] = [50, 6];

/// The minibatch of classifiers as an expert writes it: `benches/common/handwritten.rs`'s
/// expert, batched. Per sample, the forward pass is 784 axpys across the `H` hidden units
/// over input-major first-layer weights (each unit's sum still in the tape's order, the `H`
/// sums in registers). In backward, each weight's gradient is summed over the batch (the last
/// sample first, as the interpreter adds them) and applied at once, in one pass over the
/// first layer's weights: no gradient buffer for them. At B = 1 this is the expert's step.
pub struct MinibatchStep<const H: usize> {
    nin: usize,
    classes: usize,
    batch: usize,
    /// Per sample: pixels then one-hot label.
    samples: Vec<f64>,
    /// Input-major: `w1[i][j]`, input `i` to hidden unit `j`.
    w1: Vec<[f64; H]>,
    b1: [f64; H],
    /// Row-major: `w2[k][j]`, hidden unit `j` to class `k`.
    w2: Vec<[f64; H]>,
    b2: Vec<f64>,
    /// Per sample: hidden outputs, their gradients, the logits' gradients.
    h: Vec<[f64; H]>,
    gh: Vec<[f64; H]>,
    dz: Vec<f64>,
}

/// The yardstick of `m` if its hidden width is one of [`MINIBATCH_HIDDEN`].
fn minibatch_step(m: &Minibatch, inputs: &[f64]) -> Option<Box<dyn Yardstick>> {
    Some(match m.hidden {
        50 => Box::new(MinibatchStep::<50>::new(m, inputs)),
        6 => Box::new(MinibatchStep::<6>::new(m, inputs)),
        _ => return None,
    })
}

impl<const H: usize> MinibatchStep<H> {
    pub fn new(m: &Minibatch, inputs: &[f64]) -> Self {
        assert_eq!(
            m.hidden, H,
            "the hidden width the yardstick is compiled for"
        );
        let (nin, classes) = (m.nin, m.classes);
        let batch = inputs.len() / (nin + classes);
        assert_eq!(batch * (nin + classes), inputs.len(), "whole samples");
        MinibatchStep {
            nin,
            classes,
            batch,
            samples: inputs.to_vec(),
            w1: vec![[0.0; H]; nin],
            b1: [0.0; H],
            w2: vec![[0.0; H]; classes],
            b2: vec![0.0; classes],
            h: vec![[0.0; H]; batch],
            gh: vec![[0.0; H]; batch],
            dz: vec![0.0; batch * classes],
        }
    }
}

/// Softmax cross-entropy of `z` against the probability vector `t` with the loss's gradient
/// `g`, in the tape's order (`nn::softmax_cross_entropy`); returns the loss, writes `dz`.
fn softmax_ce(z: &[f64], t: &[f64], g: f64, dz: &mut [f64]) -> f64 {
    // m = max(...max(max(z_0, z_1), z_2)...), keeping the earlier on ties.
    let mut best = 0;
    for k in 1..z.len() {
        if z[k] > z[best] {
            best = k;
        }
    }
    let m = z[best];
    let mut s = 0.0;
    for k in 0..z.len() {
        let e = tapejit::op::exp(z[k] - m);
        s = if k == 0 { e } else { s + e };
    }
    let lse = m + tapejit::op::log(s);
    let mut picked = t[0] * z[0];
    for k in 1..z.len() {
        picked += t[k] * z[k];
    }
    let loss = lse - picked;

    // lse - picked: lse gets g, the picked products -g; lse = m + log(s).
    let ds = g / s;
    let mut dm = g;
    for k in (0..z.len()).rev() {
        let dd = tapejit::op::exp(z[k] - m) * ds;
        dm -= dd;
        dz[k] = t[k] * -g + dd;
    }
    // max passes its gradient to the operand it picked.
    dz[best] += dm;
    loss
}

impl<const H: usize> Yardstick for MinibatchStep<H> {
    fn step(&mut self, lr: f64) -> f64 {
        let (nin, classes, batch) = (self.nin, self.classes, self.batch);
        let width = nin + classes;
        let scale = 1.0 / batch as f64;
        let mut loss = 0.0;
        let mut z = vec![0.0; classes];
        for b in 0..batch {
            let x = &self.samples[b * width..b * width + nin];
            // h = b1, then h += w1[i] * x_i for i = 0, 1, ...
            let mut h = self.b1;
            for (row, &xi) in self.w1.iter().zip(x) {
                for j in 0..H {
                    h[j] += row[j] * xi;
                }
            }
            for hj in &mut h {
                *hj = relu(*hj);
            }
            for k in 0..classes {
                z[k] = self.b2[k];
                for j in 0..H {
                    z[k] += self.w2[k][j] * h[j];
                }
            }
            let t = &self.samples[b * width + nin..(b + 1) * width];
            let l = softmax_ce(&z, t, scale, &mut self.dz[b * classes..(b + 1) * classes]);
            loss = if b == 0 { l } else { loss + l };
            // The hidden units' gradients (pre-update output weights, classes in reverse).
            let dz = &self.dz[b * classes..(b + 1) * classes];
            let mut gh = [0.0; H];
            for k in (0..classes).rev() {
                for j in 0..H {
                    gh[j] += self.w2[k][j] * dz[k];
                }
            }
            for j in 0..H {
                gh[j] = relu_grad(h[j], gh[j]);
            }
            self.h[b] = h;
            self.gh[b] = gh;
        }
        let loss = loss * scale;

        // The output layer's gradients, summed over the batch from the last sample, applied.
        for k in 0..classes {
            let (mut gw, mut gb) = ([0.0; H], 0.0);
            for b in (0..batch).rev() {
                let g = self.dz[b * classes + k];
                gb += g;
                for j in 0..H {
                    gw[j] += self.h[b][j] * g;
                }
            }
            for j in 0..H {
                self.w2[k][j] -= lr * gw[j];
            }
            self.b2[k] -= lr * gb;
        }
        // The first layer's, in one pass over its weights.
        let mut gb = [0.0; H];
        for gh in self.gh.iter().rev() {
            for j in 0..H {
                gb[j] += gh[j];
            }
        }
        for j in 0..H {
            self.b1[j] -= lr * gb[j];
        }
        for (i, row) in self.w1.iter_mut().enumerate() {
            let mut gw = [0.0; H];
            for b in (0..batch).rev() {
                let xi = self.samples[b * width + i];
                for j in 0..H {
                    gw[j] += xi * self.gh[b][j];
                }
            }
            for j in 0..H {
                row[j] -= lr * gw[j];
            }
        }
        loss
    }

    fn params(&self) -> Vec<f64> {
        let mut p = Vec::with_capacity((self.nin + 1) * H + (H + 1) * self.classes);
        for j in 0..H {
            p.extend(self.w1.iter().map(|row| row[j]));
            p.push(self.b1[j]);
        }
        for k in 0..self.classes {
            p.extend_from_slice(&self.w2[k]);
            p.push(self.b2[k]);
        }
        p
    }

    fn set_params(&mut self, params: &[f64]) {
        let nin = self.nin;
        assert_eq!(
            params.len(),
            (nin + 1) * H + (H + 1) * self.classes,
            "params of the classifier"
        );
        let (l1, l2) = params.split_at(H * (nin + 1));
        for (j, neuron) in l1.chunks_exact(nin + 1).enumerate() {
            for i in 0..nin {
                self.w1[i][j] = neuron[i];
            }
            self.b1[j] = neuron[nin];
        }
        for (k, neuron) in l2.chunks_exact(H + 1).enumerate() {
            self.w2[k].copy_from_slice(&neuron[..H]);
            self.b2[k] = neuron[H];
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Elman RNN
// ---------------------------------------------------------------------------------------------

/// The RNN: forward through time keeping every state (each step's cell as axpys across the
/// hidden units over input-major weights), backward through time (axpys across a neuron's
/// inputs over row-major weights).
pub struct RnnStep {
    nx: usize,
    nh: usize,
    /// Per step: `x_t` then `y_t`.
    data: Vec<f64>,
    /// Row-major over `[x, h]`: `w[j * (nx + nh) + i]`; `wt[i * nh + j]` the same, input-major.
    w: Vec<f64>,
    wt: Vec<f64>,
    b: Vec<f64>,
    v: Vec<f64>,
    c: f64,
    gw: Vec<f64>,
    gb: Vec<f64>,
    gv: Vec<f64>,
    /// `h[t * nh + j]`, and each step's prediction.
    h: Vec<f64>,
    pred: Vec<f64>,
}

impl RnnStep {
    pub fn new(r: &Rnn, inputs: &[f64]) -> RnnStep {
        let (nx, nh) = (r.inputs, r.hidden);
        assert_eq!(inputs.len(), r.steps * (nx + 1), "per step x_t and y_t");
        RnnStep {
            nx,
            nh,
            data: inputs.to_vec(),
            w: vec![0.0; nh * (nx + nh)],
            wt: vec![0.0; nh * (nx + nh)],
            b: vec![0.0; nh],
            v: vec![0.0; nh],
            c: 0.0,
            gw: vec![0.0; nh * (nx + nh)],
            gb: vec![0.0; nh],
            gv: vec![0.0; nh],
            h: vec![0.0; r.steps * nh],
            pred: vec![0.0; r.steps],
        }
    }
}

impl Yardstick for RnnStep {
    fn step(&mut self, lr: f64) -> f64 {
        let (nx, nh) = (self.nx, self.nh);
        let n = nx + nh;
        let steps = self.pred.len();
        for t in 0..steps {
            let x = &self.data[t * (nx + 1)..t * (nx + 1) + nx];
            let (before, now) = self.h.split_at_mut(t * nh);
            let now = &mut now[..nh];
            now.copy_from_slice(&self.b);
            for i in 0..n {
                // h_{-1} is the constant 0.
                let input = if i < nx {
                    x[i]
                } else if t == 0 {
                    0.0
                } else {
                    before[(t - 1) * nh + i - nx]
                };
                axpy(now, input, &self.wt[i * nh..(i + 1) * nh]);
            }
            for h in now.iter_mut() {
                *h = tapejit::op::tanh(*h);
            }
            let mut p = self.c;
            for k in 0..nh {
                p += self.v[k] * now[k];
            }
            self.pred[t] = p;
        }
        let mut sum = 0.0;
        for t in 0..steps {
            let sq = (self.pred[t] - self.data[t * (nx + 1) + nx]).powf(2.0);
            sum = if t == 0 { sq } else { sum + sq };
        }
        let loss = sum / steps as f64;

        self.gw.fill(0.0);
        self.gb.fill(0.0);
        self.gv.fill(0.0);
        let mut gc = 0.0;
        let g_sum = 1.0 / steps as f64;
        let mut gh = vec![0.0; nh];
        let mut gh_prev = vec![0.0; nh];
        for t in (0..steps).rev() {
            let diff = self.pred[t] - self.data[t * (nx + 1) + nx];
            let gp = (2.0 * diff.powf(1.0)) * g_sum;
            let x = &self.data[t * (nx + 1)..t * (nx + 1) + nx];
            let h = &self.h[t * nh..(t + 1) * nh];
            // The readout, built after this step's cell and before the next one's.
            gc += gp;
            axpy(&mut self.gv, gp, h);
            axpy(&mut gh, gp, &self.v);
            gh_prev.fill(0.0);
            for j in (0..nh).rev() {
                let gs = (1.0 - h[j] * h[j]) * gh[j];
                self.gb[j] += gs;
                let (row, grow) = (
                    &self.w[j * n..(j + 1) * n],
                    &mut self.gw[j * n..(j + 1) * n],
                );
                axpy(&mut grow[..nx], gs, x);
                if t > 0 {
                    axpy(&mut grow[nx..], gs, &self.h[(t - 1) * nh..t * nh]);
                    axpy(&mut gh_prev, gs, &row[nx..]);
                } else {
                    for k in 0..nh {
                        grow[nx + k] += 0.0 * gs;
                    }
                }
            }
            std::mem::swap(&mut gh, &mut gh_prev);
        }
        sgd(&mut self.w, &self.gw, lr);
        sgd(&mut self.b, &self.gb, lr);
        sgd(&mut self.v, &self.gv, lr);
        self.c -= lr * gc;
        self.transpose();
        loss
    }

    fn params(&self) -> Vec<f64> {
        let n = self.nx + self.nh;
        let mut p = Vec::new();
        for j in 0..self.nh {
            p.extend_from_slice(&self.w[j * n..(j + 1) * n]);
            p.push(self.b[j]);
        }
        p.extend_from_slice(&self.v);
        p.push(self.c);
        p
    }

    fn set_params(&mut self, params: &[f64]) {
        let n = self.nx + self.nh;
        assert_eq!(params.len(), self.nh * (n + 1) + self.nh + 1, "RNN params");
        for j in 0..self.nh {
            self.w[j * n..(j + 1) * n].copy_from_slice(&params[j * (n + 1)..j * (n + 1) + n]);
            self.b[j] = params[j * (n + 1) + n];
        }
        let readout = &params[self.nh * (n + 1)..];
        self.v.copy_from_slice(&readout[..self.nh]);
        self.c = readout[self.nh];
        self.transpose();
    }
}

impl RnnStep {
    /// `wt` from `w`.
    fn transpose(&mut self) {
        let n = self.nx + self.nh;
        for j in 0..self.nh {
            for i in 0..n {
                self.wt[i * self.nh + j] = self.w[j * n + i];
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// mass-spring chain
// ---------------------------------------------------------------------------------------------

/// The chain: explicit Euler forward keeping every state and every spring's geometry, then
/// the adjoint of each step, masses then springs, the last first.
pub struct SpringsStep {
    n: usize,
    steps: usize,
    /// Initial state per mass `x, y, vx, vy`, then targets per mass `x, y`.
    data: Vec<f64>,
    k: Vec<f64>,
    /// Per step `t` in `0..=steps`, per mass: `state[(t * n + i) * 4 + {0: x, 1: y, 2: vx, 3: vy}]`.
    state: Vec<f64>,
    /// Per step, per spring: `dx, dy, len, f` (`f = k * (len - REST) / len`).
    springs: Vec<[f64; 4]>,
}

impl SpringsStep {
    pub fn new(s: &Springs, inputs: &[f64]) -> SpringsStep {
        let n = s.masses;
        assert_eq!(inputs.len(), 6 * n, "state and targets per mass");
        SpringsStep {
            n,
            steps: s.steps,
            data: inputs.to_vec(),
            k: vec![0.0; n],
            state: vec![0.0; (s.steps + 1) * n * 4],
            springs: vec![[0.0; 4]; s.steps * n],
        }
    }
}

impl Yardstick for SpringsStep {
    fn step(&mut self, lr: f64) -> f64 {
        let n = self.n;
        self.state[..4 * n].copy_from_slice(&self.data[..4 * n]);
        let mut tx = vec![0.0; n];
        let mut ty = vec![0.0; n];
        for t in 0..self.steps {
            let (done, next) = self.state.split_at_mut((t + 1) * n * 4);
            let now = &done[t * n * 4..];
            for s in 0..n {
                let (ax, ay) = if s == 0 {
                    (0.0, 0.0)
                } else {
                    (now[(s - 1) * 4], now[(s - 1) * 4 + 1])
                };
                let dx = now[s * 4] - ax;
                let dy = now[s * 4 + 1] - ay;
                let len = (dx * dx + dy * dy).powf(0.5);
                let f = self.k[s] * (len - SPRING_REST) / len;
                tx[s] = f * dx;
                ty[s] = f * dy;
                self.springs[t * n + s] = [dx, dy, len, f];
            }
            for i in 0..n {
                let (fx, fy) = if i + 1 < n {
                    (tx[i + 1] - tx[i], ty[i + 1] - ty[i] - SPRING_GRAVITY)
                } else {
                    (-tx[i], -ty[i] - SPRING_GRAVITY)
                };
                let [x, y, vx, vy] = [now[i * 4], now[i * 4 + 1], now[i * 4 + 2], now[i * 4 + 3]];
                let ax = fx - vx * SPRING_DAMPING;
                let ay = fy - vy * SPRING_DAMPING;
                next[i * 4..i * 4 + 4].copy_from_slice(&[
                    x + vx * SPRING_DT,
                    y + vy * SPRING_DT,
                    vx + ax * SPRING_DT,
                    vy + ay * SPRING_DT,
                ]);
            }
        }
        let last = &self.state[self.steps * n * 4..];
        let targets = &self.data[4 * n..];
        let mut sum = 0.0;
        for c in 0..2 * n {
            let sq = (last[(c / 2) * 4 + c % 2] - targets[c]).powf(2.0);
            sum = if c == 0 { sq } else { sum + sq };
        }
        let loss = sum / (2 * n) as f64;

        // The final positions' gradients (velocities: nothing reads them).
        let g_sum = 1.0 / (2 * n) as f64;
        let mut g_next = vec![[0.0f64; 4]; n];
        for c in 0..2 * n {
            let diff = last[(c / 2) * 4 + c % 2] - targets[c];
            g_next[c / 2][c % 2] = (2.0 * diff.powf(1.0)) * g_sum;
        }
        let mut gk = vec![0.0; n];
        let mut g_now = vec![[0.0f64; 4]; n];
        let (mut gtx, mut gty) = (vec![0.0; n], vec![0.0; n]);
        for t in (0..self.steps).rev() {
            g_now.fill([0.0; 4]);
            gtx.fill(0.0);
            gty.fill(0.0);
            // Masses, the last first; in each, the adjoint of its statements in reverse.
            for i in (0..n).rev() {
                let [gx2, gy2, gvx2, gvy2] = g_next[i];
                let g = &mut g_now[i];
                g[3] += gvy2; // vy' = vy + ay * DT
                let gay = SPRING_DT * gvy2;
                g[2] += gvx2; // vx' = vx + ax * DT
                let gax = SPRING_DT * gvx2;
                g[1] += gy2; // y' = y + vy * DT
                g[3] += SPRING_DT * gy2;
                g[0] += gx2; // x' = x + vx * DT
                g[2] += SPRING_DT * gx2;
                g[3] += SPRING_DAMPING * -gay; // ay = fy - vy * DAMPING
                g[2] += SPRING_DAMPING * -gax; // ax = fx - vx * DAMPING
                                               // fy = (ty_{i+1} - ty_i) - GRAVITY, fx = tx_{i+1} - tx_i (the last: -ty_i, -tx_i)
                if i + 1 < n {
                    gty[i + 1] += gay;
                    gtx[i + 1] += gax;
                }
                gty[i] += -gay;
                gtx[i] += -gax;
            }
            // Springs, the last first.
            for s in (0..n).rev() {
                let [dx, dy, len, f] = self.springs[t * n + s];
                let (gtx, gty) = (gtx[s], gty[s]);
                let gf = dy * gty + dx * gtx;
                let mut gdy = f * gty;
                let mut gdx = f * gtx;
                let gnum = gf / len;
                let ext = len - SPRING_REST;
                gk[s] += ext * gnum;
                let glen = -(f / len) * gf + self.k[s] * gnum;
                let gsq = (0.5 / len) * glen;
                gdy += dy * gsq;
                gdy += dy * gsq;
                gdx += dx * gsq;
                gdx += dx * gsq;
                g_now[s][1] += gdy;
                g_now[s][0] += gdx;
                if s > 0 {
                    g_now[s - 1][1] += -gdy;
                    g_now[s - 1][0] += -gdx;
                }
            }
            std::mem::swap(&mut g_now, &mut g_next);
        }
        sgd(&mut self.k, &gk, lr);
        loss
    }

    fn params(&self) -> Vec<f64> {
        self.k.clone()
    }

    fn set_params(&mut self, params: &[f64]) {
        self.k.copy_from_slice(params);
    }
}
