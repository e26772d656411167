//! An optimizer's state over a backend's params, and one step of it ([`super`] has the
//! formulas). Crate-private: `Program` owns the state and calls these.

use super::{Adam, Optimizer, State};
use crate::op::{Arith, MathFn, F64};

/// Steps a state may have taken: below 2^53, where a step's number is an exact `f64`.
pub const MAX_STEPS: u64 = 1 << 53;

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
            // (A second moment is a mean of squares: a negative one makes its root NaN.)
            if let Some(x) = b.iter().find(|&&x| name == "exp_avg_sq" && x < 0.0) {
                return Err(format!("{name} holds {x}, below 0"));
            }
        }
        // The next step counts on: it must stay a step number (and below 2^53 an exact
        // float, as the bias correction takes it).
        if state.steps >= MAX_STEPS {
            return Err(format!("steps {} is not below {MAX_STEPS}", state.steps));
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

/// What every param's update in one step shares, computed once per step: numbers for the
/// interpreter and the JIT (`f64`), IR values for an exported step.
#[derive(Clone, Copy, Debug)]
pub struct Scalars<V = f64> {
    lr: V,
    /// The step's number `t`, from 1 (SGD's momentum buffer starts as the gradient at 1).
    t: V,
    /// Adam's `lr / (1 - b1^t)`.
    step_size: V,
    /// Adam's `(1 - b2^t)^0.5`.
    c2_sqrt: V,
    /// AdamW's `1 - lr * weight_decay`.
    shrink: V,
}

impl Scalars<f64> {
    /// Step `t` (from 1) of `optimizer` at rate `lr`.
    pub fn of(optimizer: &Optimizer, t: u64, lr: f64) -> Scalars<f64> {
        Scalars::compute(&mut F64, optimizer, t as f64, lr)
    }
}

impl<V: Copy> Scalars<V> {
    /// Step `t` (from 1) of `optimizer` at rate `lr`, computed by `ar`.
    pub fn compute<A: Arith<V = V>>(ar: &mut A, optimizer: &Optimizer, t: V, lr: V) -> Self {
        let (b1, b2, weight_decay) = optimizer.adam().map_or((0.0, 0.0, 0.0), |(a, _)| {
            (a.betas.0, a.betas.1, a.weight_decay)
        });
        // Python's `beta ** step` and `x ** 0.5`: C's pow, the very function ops call (which
        // LLVM cannot see through, and so cannot turn into a square root).
        let one = ar.constant(1.0);
        let one_minus_pow = |ar: &mut A, b: f64| {
            let b = ar.constant(b);
            let p = ar.call(MathFn::Pow, &[b, t]);
            ar.sub(one, p)
        };
        let c1 = one_minus_pow(ar, b1);
        let c2 = one_minus_pow(ar, b2);
        let half = ar.constant(0.5);
        let wd = ar.constant(weight_decay);
        let lr_wd = ar.mul(lr, wd);
        Scalars {
            lr,
            t,
            step_size: ar.div(lr, c1),
            c2_sqrt: ar.call(MathFn::Pow, &[c2, half]),
            shrink: ar.sub(one, lr_wd),
        }
    }
}

/// One step `s` of `optimizer` for some params: their values `params`, gradients `grads`
/// and buffers (each as long). Whether every new value is finite.
pub fn update(
    optimizer: &Optimizer,
    s: &Scalars<f64>,
    params: &mut [f64],
    grads: &[f64],
    buffers: &mut [&mut [f64]],
) -> bool {
    // One loop per optimizer and count of buffers, each with its optimizer a constant, so
    // that `update_one`'s choices fold away: the loop is the formula alone (a match per
    // param, and buffers of a length unknown, made Adam's step 3.5x as slow).
    match (*optimizer, buffers) {
        (o @ Optimizer::Sgd(_), []) => update_with(&o, s, params, grads, []),
        (o @ Optimizer::Sgd(_), [b]) => update_with(&o, s, params, grads, [b]),
        (o @ Optimizer::Adam(_), [m, v]) => update_with(&o, s, params, grads, [m, v]),
        (o @ Optimizer::AdamW(_), [m, v]) => update_with(&o, s, params, grads, [m, v]),
        _ => unreachable!("an optimizer keeps the buffers buffer_names names"),
    }
}

/// [`update`] with `N` buffers.
#[inline(always)]
fn update_with<const N: usize>(
    optimizer: &Optimizer,
    s: &Scalars<f64>,
    params: &mut [f64],
    grads: &[f64],
    buffers: [&mut [f64]; N],
) -> bool {
    let mut finite = true;
    // (Each buffer as long as the params: no bounds check per param.)
    let n = params.len().min(grads.len());
    let mut buffers = buffers.map(|b| &mut b[..n]);
    for (k, (p, &g)) in params[..n].iter_mut().zip(&grads[..n]).enumerate() {
        let mut state: [f64; N] = std::array::from_fn(|j| buffers[j][k]);
        *p = update_one(&mut F64, optimizer, s, *p, g, &mut state);
        for (b, x) in buffers.iter_mut().zip(state) {
            b[k] = x;
        }
        finite &= p.is_finite();
    }
    finite
}

/// One param's step: its new value from its value `p` and gradient `g`, its buffers'
/// entries (`state`, [`Optimizer::buffer_names`]) updated in place. torch.optim's formulas,
/// written once over [`Arith`] for every backend and for exported code.
#[inline(always)]
pub fn update_one<A: Arith>(
    ar: &mut A,
    optimizer: &Optimizer,
    s: &Scalars<A::V>,
    p: A::V,
    g: A::V,
    state: &mut [A::V],
) -> A::V {
    match *optimizer {
        Optimizer::Sgd(o) => {
            let (mu, damp, wd) = (o.momentum, o.dampening, o.weight_decay);
            let mut g = match wd != 0.0 {
                true => {
                    let wd = ar.constant(wd);
                    let decay = ar.mul(wd, p);
                    ar.add(g, decay)
                }
                false => g,
            };
            if let Some(b) = state.first_mut() {
                let (mu_c, keep) = (ar.constant(mu), ar.constant(1.0 - damp));
                let old = ar.mul(*b, mu_c);
                let new = ar.mul(keep, g);
                let later = ar.add(old, new);
                // (The first step's buffer is the gradient itself.)
                let first_after = ar.constant(1.5);
                *b = ar.select_gt(s.t, first_after, later, g);
                g = match o.nesterov {
                    true => {
                        let ahead = ar.mul(mu_c, *b);
                        ar.add(g, ahead)
                    }
                    false => *b,
                };
            }
            let minus_lr = ar.neg(s.lr);
            let delta = ar.mul(minus_lr, g);
            ar.add(p, delta)
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
            let (p, g) = if decoupled {
                (ar.mul(p, s.shrink), g)
            } else if weight_decay != 0.0 {
                let wd = ar.constant(weight_decay);
                let decay = ar.mul(wd, p);
                (p, ar.add(g, decay))
            } else {
                (p, g)
            };
            let [m, v] = state else {
                unreachable!("Adam keeps two buffers")
            };
            *m = lerp(ar, *m, g, 1.0 - b1);
            let (b2, w2) = (ar.constant(b2), ar.constant(1.0 - b2));
            let kept = ar.mul(*v, b2);
            let wg = ar.mul(w2, g);
            let added = ar.mul(wg, g);
            *v = ar.add(kept, added);
            let root = ar.call(MathFn::Sqrt, &[*v]);
            let scaled = ar.div(root, s.c2_sqrt);
            let eps = ar.constant(eps);
            let denom = ar.add(scaled, eps);
            let minus_step = ar.neg(s.step_size);
            let numerator = ar.mul(minus_step, *m);
            let delta = ar.div(numerator, denom);
            ar.add(p, delta)
        }
    }
}

/// ATen's `lerp(a, b, w)` on the CPU: `a + w * (b - a)` for `|w| < 0.5`, else
/// `b - (b - a) * (1 - w)`.
fn lerp<A: Arith>(ar: &mut A, a: A::V, b: A::V, w: f64) -> A::V {
    let d = ar.sub(b, a);
    if w.abs() < 0.5 {
        let w = ar.constant(w);
        let step = ar.mul(w, d);
        ar.add(a, step)
    } else {
        let w = ar.constant(1.0 - w);
        let back = ar.mul(d, w);
        ar.sub(b, back)
    }
}
