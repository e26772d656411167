//! Optimizers: how a step moves each param from its gradient, with PyTorch's definitions.
//!
//! Plain SGD (`p -= lr * g`) is what every backend's own update does (the JIT fuses it into
//! `step` and `train`). [`Sgd`] with momentum, Nesterov or weight decay, [`Adam`] and
//! [`AdamW`] keep state per param (moments, a step count) and update after the backward
//! pass, one param at a time, by the code below: the same for every backend (the gradients
//! it reads are the JIT's, computed natively), so every backend gives the same bits.
//!
//! The formulas and their order of operations are `torch.optim`'s single-tensor ones
//! (`foreach=False`), for a param `p` with gradient `g` at step `t` (from 1) and rate `lr`:
//!
//! - **SGD**: `g = g + wd * p` (if `wd != 0`); with momentum `mu`, `b = g` at the first
//!   step, else `b = b * mu + (1 - dampening) * g`, then `g = g + mu * b` (Nesterov) or
//!   `g = b`; `p = p + (-lr) * g`.
//! - **Adam**: `g = g + wd * p` (if `wd != 0`); `m = m + (1 - b1) * (g - m)` (`lerp`, as
//!   ATen computes it for a weight below 0.5; `m + ...` becomes `g - (g - m) * b1` above);
//!   `v = v * b2 + ((1 - b2) * g) * g`; `c1 = 1 - b1^t`, `c2 = 1 - b2^t` (`pow`);
//!   `denom = sqrt(v) / c2^0.5 + eps`; `p = p + ((-(lr / c1)) * m) / denom`.
//! - **AdamW**: `p = p * (1 - lr * wd)` first, then Adam without the `wd * p` term.
//!
//! A minibatch's update ([`crate::Program::train_minibatches`]) gives these the mean
//! gradient, `g / m`.

mod stepper;

pub(crate) use stepper::{update, update_one, Scalars, Stepper};

/// SGD, PyTorch's `torch.optim.SGD`: momentum, dampening, Nesterov momentum and weight decay
/// (all 0 / off by default: plain `p -= lr * g`, what the backends fuse into their steps).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sgd {
    pub momentum: f64,
    pub dampening: f64,
    pub nesterov: bool,
    pub weight_decay: f64,
}

/// Adam, PyTorch's `torch.optim.Adam` (L2 weight decay: added to the gradient).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adam {
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

/// AdamW, PyTorch's `torch.optim.AdamW` (decoupled weight decay: the param shrinks by
/// `1 - lr * weight_decay` before Adam's step).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for Adam {
    /// PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, no weight decay.
    fn default() -> Adam {
        Adam {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

impl Default for AdamW {
    /// PyTorch's defaults: betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
    fn default() -> AdamW {
        AdamW {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// One of the optimizers; what a program is given ([`crate::Program::set_optimizer`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    Sgd(Sgd),
    Adam(Adam),
    AdamW(AdamW),
}

impl Default for Optimizer {
    /// Plain SGD.
    fn default() -> Optimizer {
        Optimizer::Sgd(Sgd::default())
    }
}

impl From<Sgd> for Optimizer {
    fn from(o: Sgd) -> Optimizer {
        Optimizer::Sgd(o)
    }
}

impl From<Adam> for Optimizer {
    fn from(o: Adam) -> Optimizer {
        Optimizer::Adam(o)
    }
}

impl From<AdamW> for Optimizer {
    fn from(o: AdamW) -> Optimizer {
        Optimizer::AdamW(o)
    }
}

impl Optimizer {
    /// Plain SGD, which keeps no state: the backends' own (fused) update.
    pub fn is_plain(&self) -> bool {
        *self == Optimizer::default()
    }

    /// Adam's settings (AdamW's are the same three), and whether the weight decay is
    /// decoupled (AdamW); `None` for SGD.
    pub(crate) fn adam(&self) -> Option<(Adam, bool)> {
        match *self {
            Optimizer::Adam(a) => Some((a, false)),
            Optimizer::AdamW(AdamW {
                betas,
                eps,
                weight_decay,
            }) => Some((
                Adam {
                    betas,
                    eps,
                    weight_decay,
                },
                true,
            )),
            Optimizer::Sgd(_) => None,
        }
    }

    /// Its name, as checkpoints and errors give it: `sgd`, `adam`, `adamw`.
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd(_) => "sgd",
            Optimizer::Adam(_) => "adam",
            Optimizer::AdamW(_) => "adamw",
        }
    }

    /// The names of the buffers it keeps per param (PyTorch's state names).
    pub fn buffer_names(&self) -> &'static [&'static str] {
        match self {
            Optimizer::Sgd(s) if s.momentum == 0.0 => &[],
            _ => buffers_of(self.name()).unwrap_or(&[]),
        }
    }

    /// The hyperparameters that would turn params non-finite or are not what PyTorch
    /// accepts: each must be finite, betas in `[0, 1)`, eps above 0, weight decay at least 0,
    /// momentum at least 0, Nesterov with momentum and no dampening. The first one wrong,
    /// as PyTorch names it.
    pub fn check(&self) -> Result<(), String> {
        let finite = |name: &str, x: f64| match x.is_finite() {
            true => Ok(()),
            false => Err(format!("{name} must be finite, not {x}")),
        };
        let at_least_zero = |name: &str, x: f64| {
            finite(name, x)?;
            match x >= 0.0 {
                true => Ok(()),
                false => Err(format!("{name} must be at least 0, not {x}")),
            }
        };
        match *self {
            Optimizer::Sgd(s) => {
                at_least_zero("momentum", s.momentum)?;
                finite("dampening", s.dampening)?;
                at_least_zero("weight_decay", s.weight_decay)?;
                if s.nesterov && (s.momentum <= 0.0 || s.dampening != 0.0) {
                    return Err("Nesterov momentum requires a momentum and zero dampening".into());
                }
                Ok(())
            }
            Optimizer::Adam(_) | Optimizer::AdamW(_) => {
                let (
                    Adam {
                        betas,
                        eps,
                        weight_decay,
                    },
                    _,
                ) = self.adam().expect("Adam or AdamW");
                for (name, beta) in [("betas[0]", betas.0), ("betas[1]", betas.1)] {
                    at_least_zero(name, beta)?;
                    if beta >= 1.0 {
                        return Err(format!("{name} must be below 1, not {beta}"));
                    }
                }
                // (eps 0: a param whose first gradient is 0 would take 0 / 0.)
                at_least_zero("eps", eps)?;
                if eps == 0.0 {
                    return Err("eps must be above 0 (0 / 0 where a gradient is 0)".into());
                }
                at_least_zero("weight_decay", weight_decay)
            }
        }
    }
}

/// The buffers the optimizer named `name` keeps when it keeps any (SGD: with momentum).
pub fn buffers_of(name: &str) -> Option<&'static [&'static str]> {
    match name {
        "sgd" => Some(&["momentum_buffer"]),
        "adam" | "adamw" => Some(&["exp_avg", "exp_avg_sq"]),
        _ => None,
    }
}

/// What an optimizer carries from step to step: how many steps it took and its buffers
/// ([`Optimizer::buffer_names`]), one number per param in the params' creation order.
/// Plain SGD keeps none (as PyTorch's): no buffers, and its steps are not counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub steps: u64,
    pub buffers: Vec<(String, Vec<f64>)>,
}
