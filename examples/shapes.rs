//! Graph shapes nobody here tuned for, written as a new user would write them: the JIT's
//! step (O2, strict, native code) against the interpreter's, and the compile time. Each
//! shape is built twice where it has dot products: with `g.sum` of the products, as
//! `tapejit::nn` builds a neuron, and as a chain `s = s + w * x` (micrograd's `sum(...,
//! self.b)` in Rust), the same operations in the same order.
//!
//! `cargo run --release --example shapes -- [--steps N]` (default 200 timed steps per shape,
//! the median of 5 runs of them).

use std::time::Instant;

use clap::Parser;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program, Tiering, Value};

/// The JIT against the interpreter on graph shapes nobody tuned for.
#[derive(Parser)]
#[command(name = "shapes")]
struct Options {
    /// Timed steps per run (the interpreter runs a tenth of them)
    #[arg(long, default_value_t = 200)]
    steps: usize,
}

/// How a shape adds up a dot product.
#[derive(Clone, Copy, PartialEq)]
enum Dots {
    /// `g.sum(&[b, w0 * x0, w1 * x1, ...])`.
    Sum,
    /// `((b + w0 * x0) + w1 * x1) + ...`.
    Chain,
}

/// `n` affine units over `x`: a bias and a weight per input, summed as `dots` says.
fn linear<'g>(
    g: &'g Graph,
    x: &[Value<'g>],
    n: usize,
    dots: Dots,
    rng: &mut StdRng,
) -> Vec<Value<'g>> {
    (0..n)
        .map(|_| {
            let b = g.param(0.0);
            let products = x.iter().map(|&xi| g.param(rng.gen_range(-0.3..0.3)) * xi);
            match dots {
                Dots::Sum => g.sum(&std::iter::once(b).chain(products).collect::<Vec<_>>()),
                Dots::Chain => products.fold(b, |s, p| s + p),
            }
        })
        .collect()
}

/// `log(sum(exp(l - max))) + max - l[target]`: softmax cross-entropy of `logits`.
fn cross_entropy<'g>(g: &'g Graph, logits: &[Value<'g>], target: usize) -> Value<'g> {
    let max = logits[1..].iter().fold(logits[0], |m, &l| m.max(l));
    let exps: Vec<Value> = logits.iter().map(|&l| (l - max).exp()).collect();
    g.sum(&exps).log() + max - logits[target]
}

/// A GRU over `t` scalar inputs with `h` units, the squared error of its last state.
fn gru(g: &Graph, dots: Dots, rng: &mut StdRng) -> usize {
    let (h_n, t_n) = (16, 40);
    let xs = g.inputs_without_grad(t_n);
    let mut h: Vec<Value> = (0..h_n).map(|_| g.constant(0.0)).collect();
    for &x in &xs {
        let input: Vec<Value> = std::iter::once(x).chain(h.iter().copied()).collect();
        let z: Vec<Value> = linear(g, &input, h_n, dots, rng)
            .into_iter()
            .map(|v| v.sigmoid())
            .collect();
        let r: Vec<Value> = linear(g, &input, h_n, dots, rng)
            .into_iter()
            .map(|v| v.sigmoid())
            .collect();
        let reset: Vec<Value> = std::iter::once(x)
            .chain(h.iter().zip(&r).map(|(&a, &b)| a * b))
            .collect();
        let candidate: Vec<Value> = linear(g, &reset, h_n, dots, rng)
            .into_iter()
            .map(|v| v.tanh())
            .collect();
        h = (0..h_n)
            .map(|k| (1.0 - z[k]) * h[k] + z[k] * candidate[k])
            .collect();
    }
    let errors: Vec<Value> = h.iter().map(|&v| (v - 0.5).powf(2.0)).collect();
    g.set_loss(g.sum(&errors)).expect("a loss");
    t_n
}

/// 32 -> 64 -> 64 -> 1, each hidden layer normalized (mean, variance, `sqrt`), then relu.
fn layer_norm_mlp(g: &Graph, dots: Dots, rng: &mut StdRng) -> usize {
    let mut h = g.inputs_without_grad(32);
    for _ in 0..2 {
        let a = linear(g, &h, 64, dots, rng);
        let n = a.len() as f64;
        let mean = g.sum(&a) / n;
        let squares: Vec<Value> = a.iter().map(|&v| (v - mean).powf(2.0)).collect();
        let sd = (g.sum(&squares) / n + 1e-5).sqrt();
        h = a.iter().map(|&v| ((v - mean) / sd).relu()).collect();
    }
    let out = linear(g, &h, 1, dots, rng)[0];
    g.set_loss((out - 1.0).powf(2.0)).expect("a loss");
    32
}

/// A 12x12 image, four 3x3 filters (relu), 2x2 max-pooling, 10 classes.
fn conv(g: &Graph, dots: Dots, rng: &mut StdRng) -> usize {
    let x = g.inputs_without_grad(144);
    let mut features = Vec::new();
    for _ in 0..4 {
        let kernel: Vec<Value> = (0..9).map(|_| g.param(rng.gen_range(-0.3..0.3))).collect();
        let bias = g.param(0.0);
        let at = |i: usize, j: usize| {
            let products = (0..9).map(|k| kernel[k] * x[(i + k / 3) * 12 + j + k % 3]);
            match dots {
                Dots::Sum => g.sum(&std::iter::once(bias).chain(products).collect::<Vec<_>>()),
                Dots::Chain => products.fold(bias, |s, p| s + p),
            }
            .relu()
        };
        let maps: Vec<Vec<Value>> = (0..10)
            .map(|i| (0..10).map(|j| at(i, j)).collect())
            .collect();
        for i in 0..5 {
            for j in 0..5 {
                let (a, b) = (maps[2 * i][2 * j], maps[2 * i][2 * j + 1]);
                let (c, d) = (maps[2 * i + 1][2 * j], maps[2 * i + 1][2 * j + 1]);
                features.push(a.max(b).max(c).max(d));
            }
        }
    }
    let logits = linear(g, &features, 10, dots, rng);
    g.set_loss(cross_entropy(g, &logits, 3)).expect("a loss");
    144
}

/// 256 classes from 32 features.
fn wide_softmax(g: &Graph, dots: Dots, rng: &mut StdRng) -> usize {
    let x = g.inputs_without_grad(32);
    let logits = linear(g, &x, 256, dots, rng);
    g.set_loss(cross_entropy(g, &logits, 17)).expect("a loss");
    32
}

/// Full-batch Huber regression: 200 samples of 8 features (`abs`, `min`).
fn huber(g: &Graph, dots: Dots, rng: &mut StdRng) -> usize {
    let w: Vec<Value> = (0..8).map(|_| g.param(rng.gen_range(-0.3..0.3))).collect();
    let b = g.param(0.0);
    let xs = g.inputs_without_grad(200 * 9);
    let one = g.constant(1.0);
    let terms: Vec<Value> = (0..200)
        .map(|s| {
            let products = (0..8).map(|k| w[k] * xs[s * 9 + k]);
            let p = match dots {
                Dots::Sum => g.sum(&std::iter::once(b).chain(products).collect::<Vec<_>>()),
                Dots::Chain => products.fold(b, |s, p| s + p),
            };
            let r = (p - xs[s * 9 + 8]).abs();
            let h = r.min(one);
            h * (r - 0.5 * h)
        })
        .collect();
    g.set_loss(g.sum(&terms) / 200.0).expect("a loss");
    200 * 9
}

/// Median microseconds per `step` over `runs` runs of `steps` steps.
fn per_step(p: &mut dyn Program, x: &[f64], steps: usize, runs: usize) -> f64 {
    for _ in 0..3 {
        p.step(x, 1e-3).expect("a step");
    }
    let mut us: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..steps {
                p.step(x, 1e-3).expect("a step");
            }
            start.elapsed().as_secs_f64() * 1e6 / steps as f64
        })
        .collect();
    us.sort_by(f64::total_cmp);
    us[us.len() / 2]
}

type Shape = fn(&Graph, Dots, &mut StdRng) -> usize;

fn main() {
    let Options { steps } = Options::parse();
    let shapes: [(&str, Shape); 5] = [
        ("GRU, 16 units, 40 steps", gru),
        ("layer-norm MLP 32-64-64-1", layer_norm_mlp),
        ("conv 12x12, 4 filters 3x3, max-pool", conv),
        ("softmax over 256 classes", wide_softmax),
        ("Huber regression, 200 x 8", huber),
    ];
    println!("| shape | dots | tape nodes | compile s | JIT us/step | interpreter us/step | interpreter / JIT |");
    println!("|---|---|--:|--:|--:|--:|--:|");
    for (name, build) in shapes {
        for dots in [Dots::Sum, Dots::Chain] {
            let g = Graph::new();
            let inputs = build(&g, dots, &mut StdRng::seed_from_u64(7));
            let x: Vec<f64> = (0..inputs)
                .map(|i| (i * 37 % 101) as f64 / 101.0 - 0.5)
                .collect();
            let start = Instant::now();
            let builder = Jit::builder().opt_level(OptLevel::O2).tiering(Tiering::Off);
            let mut jit = builder.compile(&g).expect("compiles");
            let compile = start.elapsed().as_secs_f64();
            let mut interpreter = Interpreter::new(&g).expect("a tape");
            let jit_us = per_step(&mut jit, &x, steps, 5);
            let interpreter_us = per_step(&mut interpreter, &x, (steps / 10).max(1), 5);
            let dots = match dots {
                Dots::Sum => "`g.sum`",
                Dots::Chain => "chain of `+`",
            };
            println!(
                "| {name} | {dots} | {} | {compile:.3} | {jit_us:.1} | {interpreter_us:.1} | {:.1}x |",
                jit.tape().len(),
                interpreter_us / jit_us
            );
        }
    }
}
