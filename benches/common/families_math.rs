//! Graph families whose bodies are dominated by `exp`, `log`, `tanh`, `sigmoid` and `powf`
//! (issue #41): the math-heavy graphs micrograd users write, built through the public API.
//!
//! - [`Attention`]: one head of softmax attention over T tokens of width D, the softmax
//!   written in scalars (max, subtract, exp, sum, divide), MSE against targets.
//! - [`Lstm`]: an LSTM cell (sigmoid gates, tanh cell) unrolled over T steps, the squared
//!   error of a readout at the end.
//! - [`NBody`]: a softened gravity rollout of N bodies in the plane over T steps, the
//!   pairwise forces through `powf(-1.5)`, symplectic Euler; the params are the initial
//!   velocities.
//!
//! Every family draws its params and data from [`Draws`] (splitmix64), which
//! `benches/jax/families_math.py` implements too, so JAX runs the same step from the same
//! numbers. Builders return [`Built`] as `families.rs`' do.
//!
//! Included by `families.rs` with `#[path]`; its `Family` has a variant for each.

use super::Built;
use tapejit::nn::{self, Activation, Layer, Neuron};
use tapejit::{Graph, Value};

/// A seeded stream of numbers: splitmix64, the same in `benches/jax/families_math.py`.
pub struct Draws(u64);

impl Draws {
    pub fn new(seed: u64) -> Draws {
        Draws(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`: the top 53 bits as a fraction, `lo + (hi - lo) * u`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let u = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * u
    }

    /// `n` draws uniform in `[lo, hi)`.
    pub fn uniforms(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// `w . x`, as a user writes it: `((w0*x0 + w1*x1) + ...)`, one sum node.
fn dot<'g>(g: &'g Graph, w: &[Value<'g>], x: &[Value<'g>]) -> Value<'g> {
    g.sum(w.iter().zip(x).map(|(&w, &x)| w * x))
}

// ---------------------------------------------------------------------------------------------
// softmax attention
// ---------------------------------------------------------------------------------------------

/// One head of softmax attention over `tokens` tokens of width `width` (T and D):
///
/// ```text
/// q_i = Wq x_i   k_i = Wk x_i   v_i = Wv x_i            (each row a dot, no bias)
/// s_ij = (q_i . k_j) / sqrt(D)
/// m_i = max(max(s_i0, s_i1), ...)   e_ij = exp(s_ij - m_i)   a_ij = e_ij / sum_j(e_ij)
/// o_i = sum_j(a_ij * v_j)           loss = nn::mse(o, y) over every o_ic
/// ```
///
/// (`sqrt(D)` a constant written inline). Params: `Wq`, `Wk`, `Wv`, each `D x D` row by row
/// (row `c`: output unit `c`), uniform in `[-1/sqrt(D), 1/sqrt(D))` from `Draws(seed)`.
///
/// Inputs: the tokens `x_i` row by row, then the targets `y_i` row by row, all uniform in
/// `[-1, 1)` from `Draws(seed + 1)`; none needs a gradient.
#[derive(Clone, Debug)]
pub struct Attention {
    pub tokens: usize,
    pub width: usize,
    pub seed: u64,
}

impl Attention {
    /// T = 16, D = 8.
    pub fn demo() -> Attention {
        Attention {
            tokens: 16,
            width: 8,
            seed: 41,
        }
    }

    /// The initial params: `Wq`, `Wk`, `Wv`, each row by row.
    pub fn initial_params(&self) -> Vec<f64> {
        let s = 1.0 / (self.width as f64).sqrt();
        Draws::new(self.seed).uniforms(3 * self.width * self.width, -s, s)
    }

    /// The inputs: the tokens, then the targets, row by row.
    pub fn data(&self) -> Vec<f64> {
        Draws::new(self.seed + 1).uniforms(2 * self.tokens * self.width, -1.0, 1.0)
    }

    pub fn build<'g>(&self, g: &'g Graph) -> Built {
        let (t, d) = (self.tokens, self.width);
        let p: Vec<Value<'_>> = self
            .initial_params()
            .into_iter()
            .map(|w| g.param(w))
            .collect();
        let mut matrices = p.chunks(d * d).map(|m| m.chunks(d).collect::<Vec<_>>());
        let (wq, wk, wv) = (
            matrices.next().expect("Wq"),
            matrices.next().expect("Wk"),
            matrices.next().expect("Wv"),
        );
        let x: Vec<Vec<Value<'_>>> = (0..t).map(|_| g.inputs_without_grad(d)).collect();
        let y = g.inputs_without_grad(t * d);
        let project = |w: &[&[Value<'g>]]| -> Vec<Vec<Value<'g>>> {
            x.iter()
                .map(|xi| w.iter().map(|row| dot(g, row, xi)).collect())
                .collect()
        };
        let (q, k, v) = (project(&wq), project(&wk), project(&wv));
        let sqrt_d = (d as f64).sqrt();
        let mut out = Vec::with_capacity(t * d);
        for qi in &q {
            let s: Vec<Value<'_>> = k.iter().map(|kj| dot(g, qi, kj) / sqrt_d).collect();
            let m = s[1..].iter().fold(s[0], |m, &sj| m.max(sj));
            let e: Vec<Value<'_>> = s.iter().map(|&sj| (sj - m).exp()).collect();
            let z = g.sum(&e);
            let a: Vec<Value<'_>> = e.iter().map(|&ej| ej / z).collect();
            out.extend((0..d).map(|c| g.sum(a.iter().zip(&v).map(|(&aj, vj)| aj * vj[c]))));
        }
        g.set_loss(nn::mse(&out, &y).expect("one target per output"))
            .expect("one graph");
        Built {
            inputs: self.data(),
            lr: 0.1,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// LSTM
// ---------------------------------------------------------------------------------------------

/// An LSTM cell unrolled over `steps` (T) steps of `inputs` values each, hidden width
/// `hidden` (H). Each gate is an `nn::Layer` of H linear neurons over `[x_t, h_{t-1}]`
/// (`((b + w_0 x_0) + ...) + w_{n-1} h_{H-1}`), then
///
/// ```text
/// i = sigmoid(z_i)   f = sigmoid(z_f)   u = tanh(z_u)   o = sigmoid(z_o)
/// c_t = f * c_{t-1} + i * u             h_t = o * tanh(c_t)
/// p = c + v . h_{T-1}  (an nn::Neuron)  loss = (p - y)^2
/// ```
///
/// with `h_{-1}` and `c_{-1}` constants 0 (the first step reads constants where the others
/// read the previous step). Params: the gates' neurons in the order i, f, u, o (each
/// neuron's weights over `x` then `h`, then its bias), then the readout's; all uniform in
/// `[-1/sqrt(H), 1/sqrt(H))` (PyTorch's `nn.LSTM` initialisation) from `Draws(seed)`.
///
/// Inputs: `x_t` per step, uniform in `[-1, 1)` from `Draws(seed + 1)`, then the target `y`,
/// the first step's first input (the task: remember it over T steps); none needs a
/// gradient.
#[derive(Clone, Debug)]
pub struct Lstm {
    pub inputs: usize,
    pub hidden: usize,
    pub steps: usize,
    pub seed: u64,
}

impl Lstm {
    /// One input per step, H = 8.
    pub fn new(steps: usize) -> Lstm {
        Lstm {
            inputs: 1,
            hidden: 8,
            steps,
            seed: 42,
        }
    }

    /// T = 50.
    pub fn demo() -> Lstm {
        Lstm::new(50)
    }

    /// The initial params, in creation order.
    pub fn initial_params(&self) -> Vec<f64> {
        let (n, h) = (self.inputs + self.hidden, self.hidden);
        let s = 1.0 / (h as f64).sqrt();
        Draws::new(self.seed).uniforms(4 * h * (n + 1) + h + 1, -s, s)
    }

    /// The inputs: `x_t` per step, then the target.
    pub fn data(&self) -> Vec<f64> {
        let mut data = Draws::new(self.seed + 1).uniforms(self.steps * self.inputs, -1.0, 1.0);
        data.push(data[0]);
        data
    }

    pub fn build<'g>(&self, g: &'g Graph) -> Built {
        let (n, h) = (self.inputs + self.hidden, self.hidden);
        let mut init = self.initial_params().into_iter();
        let mut neuron = |fan_in: usize| {
            let w = (0..fan_in)
                .map(|_| g.param(init.next().expect("a weight")))
                .collect();
            let b = g.param(init.next().expect("a bias"));
            Neuron {
                w,
                b,
                activation: Activation::Linear,
            }
        };
        let mut gate = || Layer {
            neurons: (0..h).map(|_| neuron(n)).collect(),
        };
        let (gate_i, gate_f, gate_u, gate_o) = (gate(), gate(), gate(), gate());
        let readout = neuron(h);
        let zeros: Vec<Value<'_>> = (0..h).map(|_| g.constant(0.0)).collect();
        let (mut hs, mut cs) = (zeros.clone(), zeros);
        for _ in 0..self.steps {
            let mut xh = g.inputs_without_grad(self.inputs);
            xh.extend(&hs);
            let call = |layer: &Layer<'g>| layer.call(&xh).expect("inputs + hidden values");
            let i: Vec<Value<'_>> = call(&gate_i).into_iter().map(|z| z.sigmoid()).collect();
            let f: Vec<Value<'_>> = call(&gate_f).into_iter().map(|z| z.sigmoid()).collect();
            let u: Vec<Value<'_>> = call(&gate_u).into_iter().map(|z| z.tanh()).collect();
            let o: Vec<Value<'_>> = call(&gate_o).into_iter().map(|z| z.sigmoid()).collect();
            cs = (0..h).map(|j| f[j] * cs[j] + i[j] * u[j]).collect();
            hs = (0..h).map(|j| o[j] * cs[j].tanh()).collect();
        }
        let y = g.input_without_grad();
        let p = readout.call(&hs).expect("hidden values");
        g.set_loss((p - y).powf(2.0)).expect("one graph");
        Built {
            inputs: self.data(),
            lr: 0.1,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// n-body gravity
// ---------------------------------------------------------------------------------------------

/// Time step of [`NBody`].
pub const NBODY_DT: f64 = 0.01;
/// Added to every squared distance, so close encounters stay finite.
pub const NBODY_SOFTENING: f64 = 0.05;

/// `bodies` (N) bodies in the plane under softened gravity (G = 1), integrated by symplectic
/// Euler for `steps` (T) steps. Per step, every pair `i < j` once:
///
/// ```text
/// dx = x_j - x_i   dy = y_j - y_i   w = (dx*dx + dy*dy + SOFTENING)^-1.5
/// fx = dx * w      fy = dy * w      (-fx, -fy for body j)
/// ```
///
/// then every body, its terms in order of the other body:
///
/// ```text
/// vx' = vx + sum_j(fx_ij * m_j) * DT    x' = x + vx' * DT    (y likewise)
/// ```
///
/// (constants written inline). Params: the initial velocities `vx, vy` per body, uniform in
/// `[-0.5, 0.5)` from `Draws(seed)`. Loss: the summed squared distance of the final
/// positions to the targets, `sum((x - tx)^2 + (y - ty)^2)`.
///
/// Inputs: the initial positions `x, y` per body (uniform in `[-1, 1)`), the masses (in
/// `[0.5, 1.5)`), then the targets `x, y` per body (in `[-1, 1)`), drawn in that order from
/// `Draws(seed + 1)`; none needs a gradient.
#[derive(Clone, Debug)]
pub struct NBody {
    pub bodies: usize,
    pub steps: usize,
    pub seed: u64,
}

impl NBody {
    /// 8 bodies.
    pub fn new(steps: usize) -> NBody {
        NBody {
            bodies: 8,
            steps,
            seed: 43,
        }
    }

    /// N = 8, T = 20.
    pub fn demo() -> NBody {
        NBody::new(20)
    }

    /// The initial velocities, per body `vx, vy`.
    pub fn initial_params(&self) -> Vec<f64> {
        Draws::new(self.seed).uniforms(2 * self.bodies, -0.5, 0.5)
    }

    /// The inputs: positions, masses, targets.
    pub fn data(&self) -> Vec<f64> {
        let n = self.bodies;
        let mut draws = Draws::new(self.seed + 1);
        let mut data = draws.uniforms(2 * n, -1.0, 1.0);
        data.extend(draws.uniforms(n, 0.5, 1.5));
        data.extend(draws.uniforms(2 * n, -1.0, 1.0));
        data
    }

    pub fn build(&self, g: &Graph) -> Built {
        let n = self.bodies;
        let v0: Vec<Value<'_>> = self
            .initial_params()
            .into_iter()
            .map(|v| g.param(v))
            .collect();
        let pos = g.inputs_without_grad(2 * n);
        let m = g.inputs_without_grad(n);
        let targets = g.inputs_without_grad(2 * n);
        let (mut x, mut y): (Vec<_>, Vec<_>) = (
            pos.iter().step_by(2).copied().collect(),
            pos.iter().skip(1).step_by(2).copied().collect(),
        );
        let (mut vx, mut vy): (Vec<_>, Vec<_>) = (
            v0.iter().step_by(2).copied().collect(),
            v0.iter().skip(1).step_by(2).copied().collect(),
        );
        for _ in 0..self.steps {
            let mut ax: Vec<Vec<Value<'_>>> = vec![Vec::with_capacity(n - 1); n];
            let mut ay: Vec<Vec<Value<'_>>> = vec![Vec::with_capacity(n - 1); n];
            for i in 0..n {
                for j in i + 1..n {
                    let dx = x[j] - x[i];
                    let dy = y[j] - y[i];
                    let w = (dx * dx + dy * dy + NBODY_SOFTENING).powf(-1.5);
                    let (fx, fy) = (dx * w, dy * w);
                    ax[i].push(fx * m[j]);
                    ay[i].push(fy * m[j]);
                    ax[j].push(-fx * m[i]);
                    ay[j].push(-fy * m[i]);
                }
            }
            for i in 0..n {
                vx[i] += g.sum(&ax[i]) * NBODY_DT;
                vy[i] += g.sum(&ay[i]) * NBODY_DT;
                x[i] += vx[i] * NBODY_DT;
                y[i] += vy[i] * NBODY_DT;
            }
        }
        let errors: Vec<Value<'_>> = (0..n)
            .map(|i| (x[i] - targets[2 * i]).powf(2.0) + (y[i] - targets[2 * i + 1]).powf(2.0))
            .collect();
        g.set_loss(g.sum(&errors)).expect("one graph");
        Built {
            inputs: self.data(),
            lr: 0.1,
        }
    }
}
