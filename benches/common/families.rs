//! Graph families for measuring structure recovery (issue #10): the graphs micrograd users
//! write, each built through the public API the way a user would write it, at any size.
//!
//! - [`Moons`]: micrograd's `demo.ipynb`: make_moons data, `MLP(2, [16, 16, 1])`, the full
//!   batch as one copy of the MLP per point sharing the params, max-margin loss plus L2.
//! - [`Minibatch`]: B copies of the MNIST classifier (`nn::Classifier`'s arithmetic per
//!   copy) sharing params, the copies' losses averaged.
//! - [`Rnn`]: an Elman RNN unrolled over T steps, MSE of a linear readout at every step.
//! - [`Springs`]: a hanging chain of masses and springs written element by element,
//!   explicit Euler over T steps, MSE of the final positions against targets.
//! - [`Dag`]: `workload::random_dag`, the irregular straight-line case.
//! - [`Attention`], [`Lstm`], [`NBody`]: bodies of `exp`, `tanh`, `sigmoid` and `powf(-1.5)`
//!   (issue #41), in `families_math.rs`.
//!
//! Every builder returns [`Built`]: the inputs of one training step (the family's whole
//! data: the runner repeats that step) and a learning rate. The hand-written versions of the
//! same arithmetic are in `yardsticks.rs`.
//!
//! Included with `#[path]` next to `workload.rs` (as `mod workload`, for `random_dag`).

// Each includer uses part of this file.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::nn::{self, Activation, Layer, Neuron, MLP};
use tapejit::{Graph, Value};

#[path = "families_math.rs"]
mod families_math;
pub use families_math::{Attention, Lstm, NBody};

/// What a runner needs besides the graph.
#[derive(Clone, Debug)]
pub struct Built {
    /// The inputs of one training step, in the graph's input order.
    pub inputs: Vec<f64>,
    /// The learning rate the benchmark trains with.
    pub lr: f64,
}

/// One family at one size: a row of the benchmark.
#[derive(Clone, Debug)]
pub enum Family {
    Moons(Moons),
    Minibatch(Minibatch),
    Rnn(Rnn),
    Springs(Springs),
    Dag(Dag),
    Attention(Attention),
    Lstm(Lstm),
    NBody(NBody),
}

impl Family {
    /// The family's name, as `--family` takes it.
    pub fn kind(&self) -> &'static str {
        match self {
            Family::Moons(_) => "moons",
            Family::Minibatch(_) => "minibatch",
            Family::Rnn(_) => "rnn",
            Family::Springs(_) => "springs",
            Family::Dag(_) => "dag",
            Family::Attention(_) => "attention",
            Family::Lstm(_) => "lstm",
            Family::NBody(_) => "nbody",
        }
    }

    /// The size, for the table: `B = 8`, `T = 200`, ...
    pub fn size(&self) -> String {
        match self {
            Family::Moons(m) => format!("{} points", m.points),
            Family::Minibatch(m) => format!("B = {}", m.samples.len()),
            Family::Rnn(r) => format!("T = {}", r.steps),
            Family::Springs(s) => format!("T = {}", s.steps),
            Family::Dag(d) => format!("{} nodes", d.nodes),
            Family::Attention(a) => format!("T = {}, D = {}", a.tokens, a.width),
            Family::Lstm(l) => format!("T = {}, H = {}", l.steps, l.hidden),
            Family::NBody(b) => format!("N = {}, T = {}", b.bodies, b.steps),
        }
    }

    /// Builds the graph on `g` (params, inputs, loss and any outputs).
    pub fn build(&self, g: &Graph) -> Built {
        match self {
            Family::Moons(m) => m.build(g),
            Family::Minibatch(m) => m.build(g),
            Family::Rnn(r) => r.build(g),
            Family::Springs(s) => s.build(g),
            Family::Dag(d) => d.build(g),
            Family::Attention(a) => a.build(g),
            Family::Lstm(l) => l.build(g),
            Family::NBody(b) => b.build(g),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// moons
// ---------------------------------------------------------------------------------------------

/// micrograd's moons demo: `n` points of `make_moons(n, noise)` labelled -1/+1, `MLP(2,
/// layers)` (relu hidden layers, linear output) initialised as micrograd does (weights
/// uniform in [-1, 1), biases 0), one copy of the MLP per point, and micrograd's loss:
/// `sum(relu(1 - y_i * score_i)) * (1 / n) + alpha * sum(p * p)` (`nn::max_margin`).
///
/// Inputs: the points' coordinates `x_0, y_0, x_1, ...`, then the labels; none needs a
/// gradient. Outputs: the scores, point by point (`score > 0` predicts +1).
#[derive(Clone, Debug)]
pub struct Moons {
    pub points: usize,
    pub noise: f64,
    /// Layer widths after the 2 inputs; the last must be 1.
    pub layers: Vec<usize>,
    pub alpha: f64,
    pub seed: u64,
}

impl Moons {
    /// The notebook's: 100 points, noise 0.1, `MLP(2, [16, 16, 1])`, alpha 1e-4.
    pub fn demo() -> Moons {
        Moons {
            points: 100,
            noise: 0.1,
            layers: vec![16, 16, 1],
            alpha: 1e-4,
            seed: 1337,
        }
    }

    /// scikit-learn's `make_moons(points, noise=noise)`, seeded (`tapejit::datasets`, which
    /// the Python package shares). Returns the points and their labels.
    pub fn data(&self) -> (Vec<[f64; 2]>, Vec<f64>) {
        tapejit::datasets::make_moons(self.points, self.noise, self.seed)
    }

    pub fn build(&self, g: &Graph) -> Built {
        let (points, labels) = self.data();
        let x = g.inputs_without_grad(2 * self.points);
        let y = g.inputs_without_grad(self.points);
        let model = micrograd_mlp(g, 2, &self.layers, self.seed);
        let scores: Vec<Value<'_>> = x
            .chunks(2)
            .map(|xi| model.call(xi).expect("two coordinates")[0])
            .collect();
        for &s in &scores {
            g.add_output(s).expect("one graph");
        }
        let loss =
            nn::max_margin(&scores, &y, &model.params(), self.alpha).expect("one score each");
        g.set_loss(loss).expect("one graph");
        let mut inputs: Vec<f64> = points.iter().flatten().copied().collect();
        inputs.extend(&labels);
        Built { inputs, lr: 0.1 }
    }

    /// The demo's learning rate at step `k` of 100: `1.0 - 0.9 * k / 100`.
    pub fn lr(k: usize) -> f64 {
        1.0 - 0.9 * k as f64 / 100.0
    }
}

/// micrograd's `MLP(nin, nouts)`: relu on every layer but the last, weights uniform in
/// [-1, 1), biases 0, drawn neuron by neuron. (`nn::MLP` scales the weights by
/// `1/sqrt(fan_in)`; its arithmetic, `((b + w0*x0) + w1*x1) + ...`, is micrograd's.)
pub fn micrograd_mlp<'g>(g: &'g Graph, nin: usize, nouts: &[usize], seed: u64) -> MLP<'g> {
    let sizes: Vec<usize> = std::iter::once(nin).chain(nouts.iter().copied()).collect();
    let mut init = tapejit::datasets::micrograd_params(&sizes, seed).into_iter();
    let layers = sizes
        .windows(2)
        .enumerate()
        .map(|(l, w)| {
            let activation = if l + 2 == sizes.len() {
                Activation::Linear
            } else {
                Activation::Relu
            };
            let neurons = (0..w[1])
                .map(|_| {
                    let w: Vec<_> = (0..w[0])
                        .map(|_| g.param(init.next().unwrap_or(0.0)))
                        .collect();
                    let b = g.param(init.next().unwrap_or(0.0));
                    Neuron { w, b, activation }
                })
                .collect();
            Layer { neurons }
        })
        .collect();
    MLP { layers }
}

// ---------------------------------------------------------------------------------------------
// minibatch
// ---------------------------------------------------------------------------------------------

/// A minibatch written as copies: the classifier `nin-hidden-classes` (`nn::MLP`, relu
/// hidden layer, softmax cross-entropy: `nn::Classifier`'s arithmetic and, for the same
/// sizes and seed, its initial params) applied to each sample, one copy per sample sharing
/// the params, and the batch's loss the **mean** of the copies' losses:
/// `sum(loss_b) * (1 / B)`, micrograd's spelling. So the gradient is the batch average, and
/// at B = 1 the step is the per-sample `step` of `workload::mnist_graph` (one `sum` and one
/// `mul` more).
///
/// Inputs: per sample, its `nin` pixels then its one-hot label (the classifier's layout),
/// samples one after the other; none needs a gradient.
#[derive(Clone, Debug)]
pub struct Minibatch {
    pub nin: usize,
    pub hidden: usize,
    pub classes: usize,
    /// Seed of the initial params (`workload::SEED` for the MNIST graph's).
    pub seed: u64,
    /// The batch, each sample `nin + classes` values in the classifier's layout.
    pub samples: Vec<Vec<f64>>,
}

impl Minibatch {
    /// 784-50-10 with `workload::mnist_graph`'s params, on `samples` (B = their number).
    pub fn mnist(samples: Vec<Vec<f64>>) -> Minibatch {
        Minibatch {
            nin: 784,
            hidden: 50,
            classes: 10,
            seed: 0,
            samples,
        }
    }

    /// `n` MNIST-like samples for `nin` pixels and `classes` labels: about 80% of pixels 0,
    /// the rest a random byte / 255; labels uniform. For tests and when MNIST is absent.
    pub fn synthetic_samples(nin: usize, classes: usize, n: usize, seed: u64) -> Vec<Vec<f64>> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let label = rng.gen_range(0..classes);
                let mut x: Vec<f64> = (0..nin)
                    .map(|_| {
                        if rng.gen_bool(0.8) {
                            0.0
                        } else {
                            rng.gen::<u8>() as f64 / 255.0
                        }
                    })
                    .collect();
                x.extend((0..classes).map(|k| if k == label { 1.0 } else { 0.0 }));
                x
            })
            .collect()
    }

    pub fn build(&self, g: &Graph) -> Built {
        let model = MLP::new(
            g,
            self.nin,
            &[self.hidden, self.classes],
            &mut StdRng::seed_from_u64(self.seed),
        );
        let losses: Vec<Value<'_>> = self
            .samples
            .iter()
            .map(|_| {
                let x = g.inputs_without_grad(self.nin);
                let t = g.inputs_without_grad(self.classes);
                let logits = model.call(&x).expect("nin pixels");
                nn::softmax_cross_entropy(&logits, &t).expect("one target per class")
            })
            .collect();
        let loss = g.sum(&losses) * (1.0 / losses.len() as f64);
        g.set_loss(loss).expect("one graph");
        Built {
            inputs: self.samples.concat(),
            lr: 0.01,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Elman RNN
// ---------------------------------------------------------------------------------------------

/// An Elman RNN unrolled over `steps`: `h_t = tanh(W [x_t, h_{t-1}] + b)` (one `nn::Layer`
/// of `hidden` tanh neurons over the step's input concatenated with the previous state, so
/// each neuron sums `((b + w_0 x_0) + ...) + w_{n-1} h_{hidden-1}`), `h_{-1}` = constants 0
/// (the first step reads constants where the others read the previous step), a linear readout
/// `p_t = c + v . h_t` (`nn::Neuron`) at every step, and the loss `nn::mse(p, y)` over all
/// steps: `sum((p_t - y_t)^2) / T`. Params: the cell's neurons (weights over `x` then `h`,
/// then bias), then the readout's.
///
/// Inputs: per step, `x_t` (`inputs` values) then the target `y_t`; none needs a gradient.
/// The data: `x_t` uniform in [-1, 1), `y_t = 0.5 x_{t-1}[0] - 0.5 x_{t-2}[1]` (0 where
/// undefined), a task that needs the state.
#[derive(Clone, Debug)]
pub struct Rnn {
    pub inputs: usize,
    pub hidden: usize,
    pub steps: usize,
    pub seed: u64,
}

impl Rnn {
    /// Input 4, hidden 16.
    pub fn new(steps: usize) -> Rnn {
        Rnn {
            inputs: 4,
            hidden: 16,
            steps,
            seed: 7,
        }
    }

    /// The inputs of one step of training: per step `x_t` then `y_t`.
    pub fn data(&self) -> Vec<f64> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let xs: Vec<Vec<f64>> = (0..self.steps)
            .map(|_| (0..self.inputs).map(|_| rng.gen_range(-1.0..1.0)).collect())
            .collect();
        let mut data = Vec::with_capacity(self.steps * (self.inputs + 1));
        for t in 0..self.steps {
            data.extend(&xs[t]);
            let a = if t >= 1 { xs[t - 1][0] } else { 0.0 };
            let b = if t >= 2 {
                xs[t - 2][1 % self.inputs]
            } else {
                0.0
            };
            data.push(0.5 * a - 0.5 * b);
        }
        data
    }

    pub fn build(&self, g: &Graph) -> Built {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let cell = Layer::new(
            g,
            self.inputs + self.hidden,
            self.hidden,
            Activation::Tanh,
            &mut rng,
        );
        let readout = Neuron::new(g, self.hidden, Activation::Linear, &mut rng);
        let mut h: Vec<Value<'_>> = (0..self.hidden).map(|_| g.constant(0.0)).collect();
        let (mut preds, mut targets) = (Vec::new(), Vec::new());
        for _ in 0..self.steps {
            let mut xh = g.inputs_without_grad(self.inputs);
            targets.push(g.input_without_grad());
            xh.extend(&h);
            h = cell.call(&xh).expect("inputs + hidden values");
            preds.push(readout.call(&h).expect("hidden values"));
        }
        g.set_loss(nn::mse(&preds, &targets).expect("one target per step"))
            .expect("one graph");
        Built {
            inputs: self.data(),
            lr: 0.01,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// mass-spring chain
// ---------------------------------------------------------------------------------------------

/// Time step of [`Springs`].
pub const SPRING_DT: f64 = 0.01;
/// Velocity damping per unit mass.
pub const SPRING_DAMPING: f64 = 1.0;
/// Gravity (downward, per unit mass).
pub const SPRING_GRAVITY: f64 = 1.0;
/// Rest length of every spring.
pub const SPRING_REST: f64 = 1.0;

/// A chain of `masses` unit masses in the plane hanging from a fixed anchor at the origin,
/// written element by element and integrated by explicit Euler for `steps` steps.
///
/// Spring `s` joins mass `s - 1` to mass `s`, spring 0 joins the anchor (two constants made
/// once) to mass 0, so mass `i` has springs `i` and `i + 1` and the last mass only one (the
/// boundaries differ from the interior: the first spring reads the anchor, the last mass has
/// no spring below). Per step, every spring first:
///
/// ```text
/// dx = x_s - x_{s-1}   dy = y_s - y_{s-1}   len = (dx*dx + dy*dy)^0.5
/// f = k_s * (len - REST) / len              tx_s = f * dx   ty_s = f * dy
/// ```
///
/// then every mass (`tx_{i+1}` is absent for the last: `fx = -tx_i`):
///
/// ```text
/// fx = tx_{i+1} - tx_i              fy = (ty_{i+1} - ty_i) - GRAVITY
/// ax = fx - vx * DAMPING            ay = fy - vy * DAMPING
/// x' = x + vx * DT   y' = y + vy * DT   vx' = vx + ax * DT   vy' = vy + ay * DT
/// ```
///
/// (constants written inline, a new constant node at each use, as micrograd users write
/// them). Params: the spring constants `k_s` (10 +- 2). Loss: `nn::mse` of the final
/// positions `x_0, y_0, x_1, ...` against targets.
///
/// Inputs: the initial state per mass `x, y, vx, vy` (the chain at rest length along the x
/// axis, at rest), then the targets per mass `x, y`; none needs a gradient.
#[derive(Clone, Debug)]
pub struct Springs {
    pub masses: usize,
    pub steps: usize,
    pub seed: u64,
}

impl Springs {
    /// 16 masses.
    pub fn new(steps: usize) -> Springs {
        Springs {
            masses: 16,
            steps,
            seed: 11,
        }
    }

    /// The initial spring constants, in param order.
    pub fn initial_k(&self) -> Vec<f64> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        (0..self.masses)
            .map(|_| 10.0 + rng.gen_range(-2.0..2.0))
            .collect()
    }

    /// The inputs: initial state (per mass `x, y, vx, vy`), then targets (per mass `x, y`).
    pub fn data(&self) -> Vec<f64> {
        let n = self.masses;
        let mut data = Vec::with_capacity(6 * n);
        for i in 0..n {
            data.extend([(i + 1) as f64 * SPRING_REST, 0.0, 0.0, 0.0]);
        }
        for i in 0..n {
            data.extend([0.2 * (i + 1) as f64, -1.1 * (i + 1) as f64]);
        }
        data
    }

    pub fn build(&self, g: &Graph) -> Built {
        let n = self.masses;
        let k: Vec<Value<'_>> = self.initial_k().into_iter().map(|k| g.param(k)).collect();
        let state = g.inputs_without_grad(4 * n);
        let targets = g.inputs_without_grad(2 * n);
        let (mut x, mut y, mut vx, mut vy): (Vec<_>, Vec<_>, Vec<_>, Vec<_>) = (
            state.iter().step_by(4).copied().collect(),
            state.iter().skip(1).step_by(4).copied().collect(),
            state.iter().skip(2).step_by(4).copied().collect(),
            state.iter().skip(3).step_by(4).copied().collect(),
        );
        let anchor = (g.constant(0.0), g.constant(0.0));
        for _ in 0..self.steps {
            let mut tx = Vec::with_capacity(n);
            let mut ty = Vec::with_capacity(n);
            for s in 0..n {
                let (ax, ay) = if s == 0 { anchor } else { (x[s - 1], y[s - 1]) };
                let dx = x[s] - ax;
                let dy = y[s] - ay;
                let len = (dx * dx + dy * dy).powf(0.5);
                let f = k[s] * (len - SPRING_REST) / len;
                tx.push(f * dx);
                ty.push(f * dy);
            }
            let (mut x2, mut y2, mut vx2, mut vy2) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for i in 0..n {
                let (fx, fy) = if i + 1 < n {
                    (tx[i + 1] - tx[i], ty[i + 1] - ty[i] - SPRING_GRAVITY)
                } else {
                    (-tx[i], -ty[i] - SPRING_GRAVITY)
                };
                let ax = fx - vx[i] * SPRING_DAMPING;
                let ay = fy - vy[i] * SPRING_DAMPING;
                x2.push(x[i] + vx[i] * SPRING_DT);
                y2.push(y[i] + vy[i] * SPRING_DT);
                vx2.push(vx[i] + ax * SPRING_DT);
                vy2.push(vy[i] + ay * SPRING_DT);
            }
            (x, y, vx, vy) = (x2, y2, vx2, vy2);
        }
        let last: Vec<Value<'_>> = x.iter().zip(&y).flat_map(|(&a, &b)| [a, b]).collect();
        g.set_loss(nn::mse(&last, &targets).expect("one target per coordinate"))
            .expect("one graph");
        Built {
            inputs: self.data(),
            lr: 0.01,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// irregular DAG
// ---------------------------------------------------------------------------------------------

/// `workload::random_dag` with about `nodes` nodes: no repetition to find.
#[derive(Clone, Debug)]
pub struct Dag {
    pub nodes: usize,
    pub seed: u64,
}

impl Dag {
    pub fn new(nodes: usize) -> Dag {
        Dag { nodes, seed: 5 }
    }

    pub fn build(&self, g: &Graph) -> Built {
        crate::workload::random_dag(g, self.nodes, self.seed);
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x5eed);
        Built {
            inputs: (0..g.num_inputs())
                .map(|_| rng.gen_range(-1.0..1.0))
                .collect(),
            lr: 0.001,
        }
    }
}
