//! An optimizer's state over a backend's params, and one step of it ([`super`] has the
//! formulas). Crate-private: `Program` owns the state and calls these.

use super::{Adam, Optimizer, State};
use crate::op::MathFn;

/// An optimizer and its state, over the params as a backend lays them out (addresses
/// `0..len`; every formula keeps a gap's 0 at 0, so the gaps are updated as params are).
#[derive(Clone, Debug, Default)]
pub struct Stepper {
    pub optimizer: Optimizer,
    /// Steps taken.
    pub steps: u64,
    /// Per buffer ([`Optimizer::buffer_names`]), one number per address.
    pub buffers: Vec<Vec<f64>>,
}

impl Stepper {
    /// `optimizer` before its first step, over `len` addresses.
    pub fn new(optimizer: Optimizer, len: usize) -> Stepper {
        let buffers = vec![vec![0.0; len]; optimizer.buffer_names().len()];
        Stepper {
            optimizer,
            steps: 0,
            buffers,
        }
    }

    /// One step at rate `lr` of every param (`params` and `grads` at addresses `0..len`).
    pub fn step(&mut self, lr: f64, params: &mut [f64], grads: &[f64]) {
        self.steps += 1;
        let s = Scalars::of(&self.optimizer, self.steps, lr);
        let mut buffers: Vec<&mut [f64]> = self.buffers.iter_mut().map(|b| &mut b[..]).collect();
        update(&self.optimizer, &s, params, grads, &mut buffers);
    }

    /// The state, in creation order: `address(k)` is param `k`'s address.
    pub fn state(&self, params: usize, address: impl Fn(usize) -> usize) -> State {
        let names = self.optimizer.buffer_names();
        let buffers = names
            .iter()
            .zip(&self.buffers)
            .map(|(name, b)| {
                (
                    name.to_string(),
                    (0..params).map(|k| b[address(k)]).collect(),
                )
            })
            .collect();
        State {
            steps: self.steps,
            buffers,
        }
    }

    /// Replaces the state by `state` (in creation order), checked against the optimizer's
    /// buffers: their names, and one finite number per param.
    pub fn set_state(
        &mut self,
        state: &State,
        params: usize,
        address: impl Fn(usize) -> usize,
    ) -> Result<(), String> {
        let names = self.optimizer.buffer_names();
        let given: Vec<&str> = state.buffers.iter().map(|(n, _)| n.as_str()).collect();
        if given != names {
            return Err(format!(
                "{} keeps {names:?}, the state holds {given:?}",
                self.optimizer.name()
            ));
        }
        for (name, b) in &state.buffers {
            if b.len() != params {
                return Err(format!("{name} holds {} numbers, not {params}", b.len()));
            }
            if let Some(x) = b.iter().find(|x| !x.is_finite()) {
                return Err(format!("{name} holds {x}"));
            }
        }
        for (mine, (_, b)) in self.buffers.iter_mut().zip(&state.buffers) {
            for (k, &x) in b.iter().enumerate() {
                mine[address(k)] = x;
            }
        }
        self.steps = state.steps;
        Ok(())
    }
}

/// What every param's update in one step shares, computed once per step.
#[derive(Clone, Copy, Debug)]
pub struct Scalars {
    lr: f64,
    /// Whether this is the first step (SGD's momentum buffer starts as the gradient).
    first: bool,
    /// Adam's `lr / (1 - b1^t)`.
    step_size: f64,
    /// Adam's `(1 - b2^t)^0.5`.
    c2_sqrt: f64,
}

impl Scalars {
    /// Step `t` (from 1) of `optimizer` at rate `lr`.
    pub fn of(optimizer: &Optimizer, t: u64, lr: f64) -> Scalars {
        let (b1, b2) = optimizer.adam().map_or((0.0, 0.0), |(a, _)| a.betas);
        // Python's `beta ** step` and `x ** 0.5`: C's pow, the very function ops call (which
        // LLVM cannot see through, and so cannot turn into a square root).
        let pow = |x: f64, c: f64| MathFn::Pow.eval(&[x, c]);
        let c1 = 1.0 - pow(b1, t as f64);
        let c2 = 1.0 - pow(b2, t as f64);
        Scalars {
            lr,
            first: t == 1,
            step_size: lr / c1,
            c2_sqrt: pow(c2, 0.5),
        }
    }
}

/// One step `s` of `optimizer` for some params: their values `params`, gradients `grads`
/// and buffers (each as long). Whether every new value is finite.
pub fn update(
    optimizer: &Optimizer,
    s: &Scalars,
    params: &mut [f64],
    grads: &[f64],
    buffers: &mut [&mut [f64]],
) -> bool {
    let mut finite = true;
    match *optimizer {
        Optimizer::Sgd(o) => {
            let (mu, damp, wd) = (o.momentum, o.dampening, o.weight_decay);
            let mut momentum = buffers.first_mut();
            for (k, (p, &g)) in params.iter_mut().zip(grads).enumerate() {
                let mut g = if wd != 0.0 { g + wd * *p } else { g };
                if let Some(b) = momentum.as_deref_mut() {
                    let b = &mut b[k];
                    *b = if s.first {
                        g
                    } else {
                        *b * mu + (1.0 - damp) * g
                    };
                    g = if o.nesterov { g + mu * *b } else { *b };
                }
                *p += -s.lr * g;
                finite &= p.is_finite();
            }
        }
        Optimizer::Adam(_) | Optimizer::AdamW(_) => {
            let (
                Adam {
                    betas: (b1, b2),
                    eps,
                    weight_decay,
                },
                decoupled,
            ) = optimizer.adam().expect("Adam or AdamW");
            let (w1, w2) = (1.0 - b1, 1.0 - b2);
            let shrink = 1.0 - s.lr * weight_decay;
            let [m, v] = buffers else {
                unreachable!("Adam keeps two buffers")
            };
            for (((p, &g), m), v) in params
                .iter_mut()
                .zip(grads)
                .zip(m.iter_mut())
                .zip(v.iter_mut())
            {
                let g = if decoupled {
                    *p *= shrink;
                    g
                } else if weight_decay != 0.0 {
                    g + weight_decay * *p
                } else {
                    g
                };
                *m = lerp(*m, g, w1);
                *v = *v * b2 + (w2 * g) * g;
                let denom = v.sqrt() / s.c2_sqrt + eps;
                *p += (-s.step_size * *m) / denom;
                finite &= p.is_finite();
            }
        }
    }
    finite
}

/// ATen's `lerp(a, b, w)` on the CPU: `a + w * (b - a)` for `|w| < 0.5`, else
/// `b - (b - a) * (1 - w)`.
fn lerp(a: f64, b: f64, w: f64) -> f64 {
    let d = b - a;
    if w.abs() < 0.5 {
        a + w * d
    } else {
        b - d * (1.0 - w)
    }
}
