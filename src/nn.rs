//! Blueprints in micrograd's spirit: [`Neuron`], [`Layer`], [`MLP`] create their params on a
//! graph; calling them on values builds the graph. Plus the losses people need.
//!
//! Initialisation: weights uniform in `±1/sqrt(fan_in)` (PyTorch's `nn.Linear` default scale),
//! biases 0, drawn from the caller's seeded `rng` in creation order (neuron by neuron, weights
//! then bias). It trains MNIST-sized MLPs well with plain SGD.

use rand::Rng;

use crate::error::{Error, Result};
use crate::graph::{Graph, Value};

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got && got > 0 {
        Ok(())
    } else {
        Err(Error::WrongLength {
            what,
            expected: expected.max(1),
            got,
        })
    }
}

/// The nonlinearity after a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Tanh,
    Linear,
}

impl Activation {
    fn apply(self, v: Value<'_>) -> Value<'_> {
        match self {
            Activation::Relu => v.relu(),
            Activation::Tanh => v.tanh(),
            Activation::Linear => v,
        }
    }
}

/// One neuron: `act(b + w0*x0 + w1*x1 + ...)`, summed in that order as micrograd does.
pub struct Neuron<'g> {
    pub w: Vec<Value<'g>>,
    pub b: Value<'g>,
    pub activation: Activation,
}

impl<'g> Neuron<'g> {
    pub fn new(g: &'g Graph, nin: usize, activation: Activation, rng: &mut impl Rng) -> Self {
        let scale = 1.0 / (nin.max(1) as f64).sqrt();
        let w = (0..nin)
            .map(|_| g.param(rng.gen_range(-scale..=scale)))
            .collect();
        Neuron {
            w,
            b: g.param(0.0),
            activation,
        }
    }

    /// `x` must have one value per weight.
    pub fn call(&self, x: &[Value<'g>]) -> Result<Value<'g>> {
        if x.len() != self.w.len() {
            return Err(Error::WrongLength {
                what: "neuron inputs",
                expected: self.w.len(),
                got: x.len(),
            });
        }
        let g = self.b.graph();
        let mut terms = Vec::with_capacity(x.len() + 1);
        terms.push(self.b);
        terms.extend(self.w.iter().zip(x).map(|(&w, &x)| w * x));
        Ok(self.activation.apply(g.sum(&terms)))
    }

    pub fn params(&self) -> Vec<Value<'g>> {
        let mut p = self.w.clone();
        p.push(self.b);
        p
    }
}

/// `nout` neurons over the same inputs.
pub struct Layer<'g> {
    pub neurons: Vec<Neuron<'g>>,
}

impl<'g> Layer<'g> {
    pub fn new(
        g: &'g Graph,
        nin: usize,
        nout: usize,
        activation: Activation,
        rng: &mut impl Rng,
    ) -> Self {
        Layer {
            neurons: (0..nout)
                .map(|_| Neuron::new(g, nin, activation, rng))
                .collect(),
        }
    }

    pub fn call(&self, x: &[Value<'g>]) -> Result<Vec<Value<'g>>> {
        self.neurons.iter().map(|n| n.call(x)).collect()
    }

    pub fn params(&self) -> Vec<Value<'g>> {
        self.neurons.iter().flat_map(Neuron::params).collect()
    }
}

/// A multi-layer perceptron: `hidden` activation on every layer but the last, which is linear
/// (micrograd's `MLP(nin, nouts)` with relu).
pub struct MLP<'g> {
    pub layers: Vec<Layer<'g>>,
}

impl<'g> MLP<'g> {
    /// micrograd's `MLP(nin, nouts)`: relu hidden layers, linear output.
    pub fn new(g: &'g Graph, nin: usize, nouts: &[usize], rng: &mut impl Rng) -> Self {
        Self::with_activation(g, nin, nouts, Activation::Relu, rng)
    }

    pub fn with_activation(
        g: &'g Graph,
        nin: usize,
        nouts: &[usize],
        hidden: Activation,
        rng: &mut impl Rng,
    ) -> Self {
        let sizes: Vec<usize> = std::iter::once(nin).chain(nouts.iter().copied()).collect();
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, w)| {
                let last = i + 1 == nouts.len();
                let act = if last { Activation::Linear } else { hidden };
                Layer::new(g, w[0], w[1], act, rng)
            })
            .collect();
        MLP { layers }
    }

    /// Builds the network on `x` (one value per input); returns the last layer's values.
    pub fn call(&self, x: &[Value<'g>]) -> Result<Vec<Value<'g>>> {
        self.layers
            .iter()
            .try_fold(x.to_vec(), |h, layer| layer.call(&h))
    }

    pub fn params(&self) -> Vec<Value<'g>> {
        self.layers.iter().flat_map(Layer::params).collect()
    }
}

/// Softmax cross-entropy of `logits` against a probability vector `target` (usually one-hot
/// inputs), computed stably: `lse(z) - sum(t_i * z_i)` with `lse(z) = m + log(sum(exp(z_i -
/// m)))` and `m = max(z)`, so no `exp` overflows. Lengths must agree and be non-zero.
pub fn softmax_cross_entropy<'g>(logits: &[Value<'g>], target: &[Value<'g>]) -> Result<Value<'g>> {
    check_len("softmax targets", logits.len(), target.len())?;
    let g = logits[0].graph();
    let m = logits[1..].iter().fold(logits[0], |m, &z| m.max(z));
    let exps: Vec<Value<'g>> = logits.iter().map(|&z| (z - m).exp()).collect();
    let lse = m + g.sum(&exps).log();
    let picked: Vec<Value<'g>> = logits.iter().zip(target).map(|(&z, &t)| t * z).collect();
    Ok(lse - g.sum(&picked))
}

/// Mean squared error: `sum((p - t)^2) / n`.
pub fn mse<'g>(pred: &[Value<'g>], target: &[Value<'g>]) -> Result<Value<'g>> {
    check_len("mse targets", pred.len(), target.len())?;
    let g = pred[0].graph();
    let sq: Vec<Value<'g>> = pred
        .iter()
        .zip(target)
        .map(|(&p, &t)| (p - t).powf(2.0))
        .collect();
    Ok(g.sum(&sq) / pred.len() as f64)
}

/// micrograd's max-margin (SVM) loss for labels ±1: `mean(relu(1 - y_i * s_i))`, plus
/// `alpha * sum(p^2)` over `params` when `alpha > 0` (L2 regularisation).
pub fn max_margin<'g>(
    scores: &[Value<'g>],
    labels: &[Value<'g>],
    params: &[Value<'g>],
    alpha: f64,
) -> Result<Value<'g>> {
    check_len("max-margin labels", scores.len(), labels.len())?;
    let g = scores[0].graph();
    let losses: Vec<Value<'g>> = scores
        .iter()
        .zip(labels)
        .map(|(&s, &y)| (1.0 + -y * s).relu())
        .collect();
    let data_loss = g.sum(&losses) * (1.0 / losses.len() as f64);
    if alpha > 0.0 && !params.is_empty() {
        let squares: Vec<Value<'g>> = params.iter().map(|&p| p * p).collect();
        Ok(data_loss + alpha * g.sum(&squares))
    } else {
        Ok(data_loss)
    }
}

/// An MLP classifier graph ready to train per sample: `nin` inputs, then one-hot label
/// inputs, micrograd's MLP (relu hidden layers) with one linear output per class, the logits
/// marked as outputs (in class order) and softmax cross-entropy as the loss.
///
/// The graph's input vector is `[x_0 .. x_{nin-1}, onehot_0 .. onehot_{classes-1}]`, all
/// made without gradient ([`Graph::input_without_grad`]): training reads the params'
/// gradients only. Params are created layer by layer, neuron by neuron, weights then bias.
pub struct Classifier<'g> {
    pub model: MLP<'g>,
    pub logits: Vec<Value<'g>>,
    pub loss: Value<'g>,
}

impl<'g> Classifier<'g> {
    pub fn new(
        g: &'g Graph,
        nin: usize,
        hidden: &[usize],
        classes: usize,
        rng: &mut impl Rng,
    ) -> Result<Self> {
        let x = g.inputs_without_grad(nin);
        let y = g.inputs_without_grad(classes);
        let sizes: Vec<usize> = hidden.iter().copied().chain([classes]).collect();
        let model = MLP::new(g, nin, &sizes, rng);
        let logits = model.call(&x)?;
        for &l in &logits {
            g.add_output(l)?;
        }
        let loss = softmax_cross_entropy(&logits, &y)?;
        g.set_loss(loss)?;
        Ok(Classifier {
            model,
            logits,
            loss,
        })
    }
}
