//! What the benchmarks and `examples/report.rs` measure, defined once so their numbers are
//! comparable: the MNIST classifier graph, the backends ("modes") it runs on, real MNIST
//! samples in the classifier's input layout, the step loop that is timed, and a family of
//! random DAGs for compile-time scaling.

// Each includer uses part of this file.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::{
    Graph, Interpreter, Jit, JitBuilder, JitStats, OptLevel, Program, Tiering, Value, ZeroSkipping,
};
use tapejit_mnist::{self as mnist, Dataset};

/// Pixels per MNIST image.
pub const INPUTS: usize = 784;
/// Digits.
pub const CLASSES: usize = 10;
/// The hidden layer of the MNIST graph.
pub const HIDDEN: usize = 50;
/// Per-sample SGD learning rate (the `mnist` example's default).
pub const LR: f64 = 0.01;
/// Seed of the classifier's initial params.
pub const SEED: u64 = 0;

/// Builds the MNIST classifier `784-hidden-10` (relu hidden layer, linear output, softmax
/// cross-entropy) on `g` with the benchmark's fixed seed.
pub fn mnist_graph(g: &Graph, hidden: usize) {
    Classifier::new(
        g,
        INPUTS,
        &[hidden],
        CLASSES,
        &mut StdRng::seed_from_u64(SEED),
    )
    .expect("a well-formed classifier");
}

/// How a mode runs a graph.
#[derive(Clone, Debug)]
pub enum Engine {
    Interpreter,
    Jit(JitBuilder),
}

/// One way of running the tape: a row of the report and a step benchmark.
#[derive(Clone, Debug)]
pub struct Mode {
    pub name: String,
    pub engine: Engine,
    /// Whether results must be bit-identical to the interpreter's (false for fast-math).
    pub exact: bool,
    /// Trained with one `Program::train` call per pass over the samples instead of a `step`
    /// per sample (same results).
    pub whole_pass: bool,
}

impl Mode {
    pub fn interpreter() -> Mode {
        Mode {
            name: "interpreter".into(),
            engine: Engine::Interpreter,
            exact: true,
            whole_pass: false,
        }
    }

    pub fn jit(name: impl Into<String>, builder: JitBuilder) -> Mode {
        Mode {
            name: name.into(),
            engine: Engine::Jit(builder),
            exact: true,
            whole_pass: false,
        }
    }

    /// The mode trained by `Program::train`, one call per pass over the samples.
    pub fn whole_pass(self) -> Mode {
        Mode {
            whole_pass: true,
            ..self
        }
    }

    /// A mode whose results agree with the interpreter's only to rounding.
    pub fn inexact(self) -> Mode {
        Mode {
            exact: false,
            ..self
        }
    }

    /// Linearizes (and for the JIT compiles) `g`; this is what "compile time" measures.
    pub fn build(&self, g: &Graph) -> tapejit::Result<Box<dyn Program>> {
        Ok(self.build_with_stats(g)?.0)
    }

    /// [`Mode::build`], plus the JIT's account of where compilation spent its time.
    pub fn build_with_stats(
        &self,
        g: &Graph,
    ) -> tapejit::Result<(Box<dyn Program>, Option<JitStats>)> {
        Ok(match &self.engine {
            Engine::Interpreter => (Box::new(Interpreter::new(g)?), None),
            Engine::Jit(builder) => {
                let jit = builder.compile(g)?;
                let stats = jit.stats().clone();
                (Box::new(jit), Some(stats))
            }
        })
    }
}

/// Every mode the report has a row for and the step benchmark measures, interpreter first:
/// the JIT's defaults at each level (loop recovery on), then the default level with each
/// option flipped. A new JIT option is one more entry here.
pub fn modes() -> Vec<Mode> {
    let mut modes = vec![Mode::interpreter()];
    modes.extend(OptLevel::ALL.iter().map(|&level| {
        Mode::jit(
            level.to_string(),
            Jit::builder().tiering(Tiering::Off).opt_level(level),
        )
    }));
    let o2 = Jit::builder().tiering(Tiering::Off).opt_level(OptLevel::O2);
    modes.push(Mode::jit("O2 train()", o2.clone()).whole_pass());
    modes.push(
        Mode::jit(
            "O2 train(), zero-skipping off",
            o2.clone().zero_skipping(ZeroSkipping::Never),
        )
        .whole_pass(),
    );
    modes.push(Mode::jit(
        "O2 straight-line",
        o2.clone().loop_recovery(false),
    ));
    modes.push(Mode::jit("O2 fast-math", o2.clone().fast_math(true)).inexact());
    modes.push(
        Mode::jit("O2 fast-math train()", o2.fast_math(true))
            .inexact()
            .whole_pass(),
    );
    modes
}

/// Training samples in the classifier's input layout (pixels / 255, then the one-hot label),
/// converted up front so the timed loop runs nothing but steps.
pub struct Samples {
    pub inputs: Vec<Vec<f64>>,
    pub labels: Vec<usize>,
}

impl Samples {
    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// The samples' inputs laid end to end, as `Program::train` takes them.
    pub fn concatenated(&self) -> Vec<f64> {
        self.inputs.concat()
    }

    /// The first `n` samples (all if there are fewer).
    pub fn first(&self, n: usize) -> Samples {
        let n = n.min(self.len());
        Samples {
            inputs: self.inputs[..n].to_vec(),
            labels: self.labels[..n].to_vec(),
        }
    }

    /// The first `n` samples of `data`.
    pub fn from_dataset(data: &Dataset, n: usize) -> Result<Samples, mnist::Error> {
        let n = n.min(data.len());
        let inputs = (0..n)
            .map(|i| classifier_inputs(data, i))
            .collect::<Result<_, _>>()?;
        let labels = (0..n).map(|i| data.label(i) as usize).collect();
        Ok(Samples { inputs, labels })
    }

    /// The first `n` samples of MNIST's training set in `dir`.
    pub fn mnist(dir: &Path, n: usize) -> Result<Samples, String> {
        let data = mnist::load_train(dir).map_err(|e| {
            format!(
                "cannot load MNIST's training set from {}: {e} (scripts/fetch-mnist puts it in \
                 data/mnist)",
                dir.display()
            )
        })?;
        Samples::from_dataset(&data, n).map_err(|e| e.to_string())
    }
}

/// Example `i` of `data` in the classifier's input layout: the pixels scaled to [0, 1], then
/// the label one-hot over the digits.
fn classifier_inputs(data: &Dataset, i: usize) -> Result<Vec<f64>, mnist::Error> {
    let mut x = vec![0.0; INPUTS + CLASSES];
    let (pixels, one_hot) = x.split_at_mut(INPUTS);
    mnist::write_normalized(data.pixels(i), pixels)?;
    mnist::write_one_hot(data.label(i), one_hot)?;
    Ok(x)
}

/// One SGD step per sample, in order; returns the time taken and the sum of the losses.
pub fn time_steps(program: &mut dyn Program, samples: &Samples, lr: f64) -> (Duration, f64) {
    let start = Instant::now();
    let mut loss = 0.0;
    for x in &samples.inputs {
        loss += program
            .step(x, lr)
            .expect("finite inputs of the right length");
    }
    (start.elapsed(), loss)
}

/// One `Program::train` call over `inputs` (the samples laid end to end); the time it took
/// and the sum of the losses.
pub fn time_train(program: &mut dyn Program, inputs: &[f64], lr: f64) -> (Duration, f64) {
    let start = Instant::now();
    let losses = program
        .train(inputs, lr)
        .expect("finite inputs, a whole number of samples");
    (start.elapsed(), losses.iter().sum())
}

/// A compile-time workload that is not an MLP: a random DAG of about `nodes` nodes built
/// through the public `Graph` API (16 inputs, 64 params, a uniform mix of `+ - *`, `tanh`,
/// `sigmoid`, `relu`, `max`, `exp`, scaling by a constant and n-ary sums), operands drawn half
/// from the 64 newest values (locality, as in real models) and half from anywhere. The loss
/// sums every value nothing else uses (through a tree of 16-operand sums), so the tape keeps
/// every node. Values stay bounded
/// (anything that could grow past 8 goes through `tanh` first), so the graph also runs.
pub fn random_dag(g: &Graph, nodes: usize, seed: u64) {
    struct Pool<'g> {
        values: Vec<(Value<'g>, f64)>,
        used: Vec<bool>,
        rng: StdRng,
    }
    impl<'g> Pool<'g> {
        fn push(&mut self, v: Value<'g>, bound: f64) {
            self.values.push((v, bound));
            self.used.push(false);
        }
        fn pick(&mut self) -> (Value<'g>, f64) {
            let n = self.values.len();
            let i = if self.rng.gen_bool(0.5) {
                self.rng.gen_range(n.saturating_sub(64)..n)
            } else {
                self.rng.gen_range(0..n)
            };
            self.used[i] = true;
            self.values[i]
        }
        /// An operand with magnitude at most 8.
        fn pick_small(&mut self) -> (Value<'g>, f64) {
            match self.pick() {
                (v, b) if b > 8.0 => (v.tanh(), 1.0),
                small => small,
            }
        }
    }

    let mut pool = Pool {
        values: Vec::new(),
        used: Vec::new(),
        rng: StdRng::seed_from_u64(seed),
    };
    for x in g.inputs(16) {
        pool.push(x, 1.0);
    }
    for _ in 0..64 {
        let p = g.param(pool.rng.gen_range(-1.0..1.0));
        pool.push(p, 1.0);
    }
    while g.len() < nodes {
        let (v, bound) = match pool.rng.gen_range(0..10) {
            0 => {
                let ((a, ab), (b, bb)) = (pool.pick_small(), pool.pick_small());
                (a + b, ab + bb)
            }
            1 => {
                let ((a, ab), (b, bb)) = (pool.pick_small(), pool.pick_small());
                (a - b, ab + bb)
            }
            2 => {
                let ((a, ab), (b, bb)) = (pool.pick_small(), pool.pick_small());
                (a * b, ab * bb)
            }
            3 => (pool.pick().0.tanh(), 1.0),
            4 => (pool.pick().0.sigmoid(), 1.0),
            5 => {
                let (a, ab) = pool.pick();
                (a.relu(), ab)
            }
            6 => {
                let ((a, ab), (b, bb)) = (pool.pick(), pool.pick());
                (a.max(b), ab.max(bb))
            }
            7 => (pool.pick().0.tanh().exp(), std::f64::consts::E),
            8 => {
                let (a, ab) = pool.pick_small();
                let c = pool.rng.gen_range(-2.0..2.0);
                (a * c, ab * 2.0)
            }
            _ => {
                let k = pool.rng.gen_range(2..8);
                let terms: Vec<(Value<'_>, f64)> = (0..k).map(|_| pool.pick_small()).collect();
                let vs: Vec<Value<'_>> = terms.iter().map(|t| t.0).collect();
                (g.sum(&vs), terms.iter().map(|t| t.1).sum())
            }
        };
        pool.push(v, bound);
    }
    let sinks: Vec<Value<'_>> = pool
        .values
        .iter()
        .zip(&pool.used)
        .filter(|(_, &used)| !used)
        .map(|((v, _), _)| *v)
        .collect();
    // A tree of small sums rather than one sum with thousands of operands.
    let mut level = sinks;
    while level.len() > 1 {
        level = level.chunks(16).map(|c| g.sum(c)).collect();
    }
    g.set_loss(level[0]).expect("one graph");
}

/// The irregular graph of issue #40 ("graphs built anew"), as a user writes it with today's
/// ops: `ops` operations, each a softplus, a sum of 4, a product of 2 or a softmax of 4 (one
/// of the four alike often), reading values drawn from the 30 newest (the leaves first: 15
/// inputs and 15 params). Softplus is written `relu(x) + log(1 + exp(-max(-x, x)))` (9 nodes)
/// and the softmax subtracts the largest of its operands before `exp` (16 nodes, its 4
/// outputs all joining the pool), as a user who knows no `Op::Softplus` and guards the
/// softmax would. The loss sums the 30 newest values; what it does not reach is dropped, as
/// for any graph (10,000 ops make 57,167 tape nodes). Values stay finite: the softmax's
/// outputs, most of the pool, keep sums and products small.
pub fn irregular_ops(g: &Graph, ops: usize, seed: u64) {
    irregular_ops_written(g, ops, seed, Softplus::Written)
}

/// How [`irregular_ops_written`] writes a softplus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Softplus {
    /// `relu(x) + log(1 + exp(-max(-x, x)))`: nine nodes.
    Written,
    /// `x.softplus()`: one node.
    Op,
}

/// [`irregular_ops`] (the same draws, so the same graph) with each softplus written as
/// `softplus` says.
pub fn irregular_ops_written(g: &Graph, ops: usize, seed: u64, softplus: Softplus) {
    const WINDOW: usize = 30;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pool: Vec<Value<'_>> = g.inputs(WINDOW / 2);
    pool.extend((0..WINDOW / 2).map(|_| g.param(rng.gen_range(-1.0..1.0))));
    for _ in 0..ops {
        let kind = rng.gen_range(0..4);
        let mut pick = || pool[pool.len() - 1 - rng.gen_range(0..WINDOW)];
        match kind {
            0 => {
                let x = pick();
                pool.push(match softplus {
                    Softplus::Written => x.relu() + (1.0 + (-(-x).max(x)).exp()).log(),
                    Softplus::Op => x.softplus(),
                });
            }
            1 => {
                let terms = [pick(), pick(), pick(), pick()];
                pool.push(g.sum(terms));
            }
            2 => {
                let (a, b) = (pick(), pick());
                pool.push(a * b);
            }
            _ => {
                let x = [pick(), pick(), pick(), pick()];
                let largest = x[0].max(x[1]).max(x[2]).max(x[3]);
                let e = x.map(|xi| (xi - largest).exp());
                let total = g.sum(e);
                pool.extend(e.map(|ei| ei / total));
            }
        }
    }
    let loss = g.sum(&pool[pool.len() - WINDOW..]);
    g.set_loss(loss).expect("one graph");
}
