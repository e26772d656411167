//! The trainer end to end (issue #41): what `examples/mnist.rs` times, one epoch per run
//! (`common/epoch.rs`: the dataset's bytes and a shuffled order handed to `train_from`,
//! which converts each chunk where it trains on it), by per-sample SGD, per-sample Adam and minibatches of 32 on one
//! thread and on every core; beside the hand-written C of `../shared/baselines`
//! (`handc_sparse.c`, which skips zero pixels as `train` does, and the dense `handc.c`),
//! built with `cc -O3 -march=native` and run in the same sitting, the rows taking turns.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rand::seq::SliceRandom;
use rand::{rngs::StdRng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::optim::{Adam, Optimizer};
use tapejit::{Graph, Jit, Program, Tiering};
use tapejit_mnist::Dataset;

use crate::epoch::{train_epoch, Sgd};
use crate::table::{median, significant, thousands};

pub struct Settings {
    /// MNIST's four files.
    pub data: PathBuf,
    /// Where the C programs and their inputs are built.
    pub scratch: PathBuf,
    /// Runs per row.
    pub runs: usize,
    /// Fewer samples per run.
    pub quick: bool,
}

/// A row of the trainer: how it updates, on how many samples.
struct Run {
    name: String,
    sgd: Sgd,
    optimizer: Optimizer,
    samples: usize,
    /// Per run: microseconds per sample, and the final mean loss's bits.
    us: Vec<f64>,
    losses: Vec<u64>,
}

/// A row of hand-written C: its program and what it printed per run.
struct C {
    name: &'static str,
    binary: Result<PathBuf, String>,
    /// Per run: its clock's mean and median microseconds per sample.
    mean_us: Vec<f64>,
    median_us: Vec<f64>,
}

/// The section (markdown).
pub fn report(s: &Settings) -> Result<String, String> {
    eprintln!("trainer: loading MNIST from {}", s.data.display());
    let (train, test) = tapejit_mnist::load_mnist(&s.data).map_err(|e| e.to_string())?;
    let n = |full: usize| full.min(train.len());
    let per_sample = n(if s.quick { 10_000 } else { 60_000 });
    let adam = n(if s.quick { 2_000 } else { 10_000 });
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let sgd = |lr, batch, threads| Sgd { lr, batch, threads };
    let plain = Optimizer::default();
    let mut runs = vec![
        Run::new(
            "per-sample SGD, lr 0.01",
            sgd(0.01, 1, 1),
            plain,
            per_sample,
        ),
        Run::new(
            "per-sample Adam, lr 0.001",
            sgd(0.001, 1, 1),
            Adam::default().into(),
            adam,
        ),
        Run::new(
            "minibatches of 32, lr 0.1, 1 thread",
            sgd(0.1, 32, 1),
            plain,
            per_sample,
        ),
    ];
    if cores > 1 {
        let name = format!("minibatches of 32, lr 0.1, {cores} threads");
        runs.push(Run::new(&name, sgd(0.1, 32, cores), plain, per_sample));
    }
    let inputs = c_inputs(&s.scratch, &train, &test);
    let mut cs = [C::new("handc_sparse"), C::new("handc")];
    for c in &mut cs {
        c.binary = inputs.clone().and_then(|()| build_c(&s.scratch, c.name));
    }
    for round in 1..=s.runs {
        let mut line = format!("trainer round {round}/{}:", s.runs);
        for run in &mut runs {
            run.once(&train)?;
            let _ = write!(line, " {:.2}", run.us.last().expect("ran"));
        }
        for c in &mut cs {
            c.once(&s.scratch, per_sample);
            let _ = write!(line, " {} {:?}", c.name, c.mean_us.last());
        }
        eprintln!("{line} us/sample");
    }
    Ok(table(&runs, &cs, per_sample, cores))
}

impl Run {
    fn new(name: &str, sgd: Sgd, optimizer: Optimizer, samples: usize) -> Run {
        Run {
            name: name.into(),
            sgd,
            optimizer,
            samples,
            us: Vec::new(),
            losses: Vec::new(),
        }
    }

    /// One epoch as the trainer runs it: the graph built and compiled (untimed), then the
    /// shuffled samples trained on, timed.
    fn once(&mut self, train: &Dataset) -> Result<(), String> {
        let g = Graph::new();
        let npix = train.images.pixels_per_image();
        Classifier::new(&g, npix, &[50], 10, &mut StdRng::seed_from_u64(0))
            .map_err(|e| e.to_string())?;
        // (As the trainer compiles it: native code, `train`'s and minibatches' too.)
        let builder = Jit::builder().tiering(Tiering::Off).compile_ahead(true);
        let mut jit = builder.compile(&g).map_err(|e| e.to_string())?;
        jit.set_optimizer(self.optimizer)
            .map_err(|e| e.to_string())?;
        let mut order: Vec<usize> = (0..train.len()).collect();
        order.shuffle(&mut StdRng::seed_from_u64(1));
        let order = &order[..self.samples];
        let start = Instant::now();
        let loss = train_epoch(&mut jit, train, order, self.sgd, |_, _| {})?;
        let secs = start.elapsed().as_secs_f64();
        self.us.push(secs * 1e6 / self.samples as f64);
        self.losses.push((loss / self.samples as f64).to_bits());
        Ok(())
    }
}

impl C {
    fn new(name: &'static str) -> C {
        C {
            name,
            binary: Err("not built".into()),
            mean_us: Vec::new(),
            median_us: Vec::new(),
        }
    }

    /// One run of `samples` samples; a run that fails leaves its reason as the binary's.
    fn once(&mut self, scratch: &Path, samples: usize) {
        let Ok(binary) = &self.binary else { return };
        let out = Command::new(binary)
            .args([samples.to_string(), "0.01".into()])
            .env("MNIST_DIR", scratch)
            .env("INIT_PATH", scratch.join("init.bin"))
            .output();
        let text = match out {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
            Ok(out) => {
                self.binary = Err(format!("{} exited with {}", self.name, out.status));
                return;
            }
            Err(e) => {
                self.binary = Err(format!("{}: {e}", self.name));
                return;
            }
        };
        // "per-sample median M us (min chunk X, mean Y)"
        let number_after = |key: &str| -> Option<f64> {
            let rest = &text[text.find(key)? + key.len()..];
            let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
            rest[..end].parse().ok()
        };
        match (number_after("median "), number_after("mean ")) {
            (Some(median), Some(mean)) => {
                self.median_us.push(median);
                self.mean_us.push(mean);
            }
            _ => self.binary = Err(format!("{} printed no timing: {text}", self.name)),
        }
    }
}

/// The IDX files (raw, dotted names, as the C reads them) and the initial weights
/// (`handc_init.py`, with the machine's python3) in `scratch`.
fn c_inputs(scratch: &Path, train: &Dataset, test: &Dataset) -> Result<(), String> {
    std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    for (set, prefix) in [(train, "train"), (test, "t10k")] {
        let images = &set.images;
        let mut bytes = Vec::with_capacity(16 + images.pixels.len());
        for word in [0x803, images.count, images.rows, images.cols] {
            bytes.extend_from_slice(&(word as u32).to_be_bytes());
        }
        bytes.extend_from_slice(&images.pixels);
        write(&scratch.join(format!("{prefix}-images.idx3-ubyte")), &bytes)?;
        let mut bytes = Vec::with_capacity(8 + set.labels.labels.len());
        for word in [0x801, set.labels.len()] {
            bytes.extend_from_slice(&(word as u32).to_be_bytes());
        }
        bytes.extend_from_slice(&set.labels.labels);
        write(&scratch.join(format!("{prefix}-labels.idx1-ubyte")), &bytes)?;
    }
    let status = Command::new("python3")
        .arg(baselines().join("handc_init.py"))
        .arg(scratch.join("init.bin"))
        .status()
        .map_err(|e| format!("python3: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("handc_init.py exited with {status}")),
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// `../shared/baselines` beside this package.
fn baselines() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/baselines")
}

/// `name.c` of the baselines built with `cc -O3 -march=native` into `scratch`.
fn build_c(scratch: &Path, name: &str) -> Result<PathBuf, String> {
    let binary = scratch.join(name);
    let out = Command::new("cc")
        .args(["-O3", "-march=native"])
        .arg(baselines().join(format!("{name}.c")))
        .args(["-lm", "-o"])
        .arg(&binary)
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    match out.status.success() {
        true => Ok(binary),
        false => Err(format!(
            "cc {name}.c: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        )),
    }
}

/// `min-max` of `xs` to three significant figures.
fn range(xs: &[f64]) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{}-{}", significant(lo), significant(hi))
}

fn table(runs: &[Run], cs: &[C], per_sample: usize, cores: usize) -> String {
    let sparse_c = cs
        .iter()
        .find(|c| c.name == "handc_sparse")
        .filter(|c| !c.mean_us.is_empty())
        .map(|c| median(&c.mean_us));
    let vs_c = |us: f64| sparse_c.map_or("—".into(), |c| format!("{:.2}×", us / c));
    let mut t = String::from(
        "| run | samples | us/sample (median; range) | s/epoch (60k) | × `handc_sparse` | final mean loss |\n\
         |---|--:|--:|--:|--:|--|\n",
    );
    for r in runs {
        let us = median(&r.us);
        let loss = match r.losses.windows(2).all(|w| w[0] == w[1]) {
            true => format!("{:?}", f64::from_bits(r.losses[0])),
            false => "differs between runs".into(),
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} ({}) | {} | {} | {loss} |",
            r.name,
            thousands(r.samples as u64),
            significant(us),
            range(&r.us),
            significant(us * 0.06),
            vs_c(us),
        );
    }
    for c in cs {
        let _ = match &c.binary {
            Ok(_) if !c.mean_us.is_empty() => writeln!(
                t,
                "| C `{}`, per-sample SGD, lr 0.01 | {} | {} ({}; median chunk {}) | {} | {} | |",
                c.name,
                thousands(per_sample as u64),
                significant(median(&c.mean_us)),
                range(&c.mean_us),
                significant(median(&c.median_us)),
                significant(median(&c.mean_us) * 0.06),
                vs_c(median(&c.mean_us)),
            ),
            Ok(_) => writeln!(t, "| C `{}` | | not run | | | |", c.name),
            Err(why) => writeln!(t, "| C `{}` | | not run: {why} | | | |", c.name),
        };
    }
    let minibatch = |threads| {
        runs.iter()
            .find(|r| r.sgd.batch == 32 && r.sgd.threads == threads)
    };
    let mut notes = String::from(
        "\nEach run builds the classifier (784-50-10, seed 0) and compiles it at O2 as \
         `examples/mnist.rs` does (native code, what `train` and minibatches run compiled \
         with the rest: `compile_ahead`; untimed), then trains one epoch as it does, timed from \
         the epoch's start to the last update: the dataset's bytes and a shuffled order (seed 1) \
         handed to `train_from` / `train_minibatches_from`, which convert the samples where \
         they train on them (minibatch threads each the inputs they read). The C's clock is its own: it converts every pixel before it starts, and \
         trains in file order; its mean is its epoch's time per sample.",
    );
    if let (Some(one), Some(all)) = (minibatch(1), minibatch(cores)) {
        let same = one.losses.first() == all.losses.first();
        let _ = write!(
            notes,
            " Minibatches of 32 on {cores} threads: {:.2}× the samples per second of one \
             thread{}.",
            median(&one.us) / median(&all.us),
            match same {
                true => ", the same final loss to the bit",
                false => "; **the final losses differ**",
            }
        );
    }
    t.push_str(&notes);
    t.push('\n');
    t
}
