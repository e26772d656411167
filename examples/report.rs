//! The benchmark report: compile time and training-step time of the MNIST classifier
//! (784-50-10, softmax cross-entropy, per-sample SGD) on the interpreter, at every JIT level,
//! and in two hand-written Rust versions, as one markdown table; then the graph families
//! (issue #10: micrograd's moons demo, minibatch MNIST as copies, an RNN and a mass-spring
//! rollout unrolled over steps, a random DAG) at `examples/families`' quick sizes, each
//! beside the interpreter and its hand-written yardstick (and JAX's steps with `--jax`).
//!
//! Then graphs built anew (issue #40): irregular graphs and rollouts timed from an empty graph
//! to the last iteration on the JIT and the interpreter, beside a yardstick tape interpreter
//! (`report/anew.rs`). Then the trainer end to end (issue #41): an epoch of
//! `examples/mnist.rs` by SGD, Adam and minibatches, beside hand-written C
//! (`report/trainer.rs`).
//!
//! cargo run --release --example report -- [--data DIR] [--quick] [--samples N] [--out DIR]
//!     [--no-families] [--section all|mnist|families|anew|trainer] [--jax PYTHON]
//!
//! Prints the table (and writes it to `target/report.md`) and plots compile time against
//! epoch time (`target/report.svg`). Every number is a median of repeated runs: each mode is
//! compiled 3 times, and its steps are timed over the first 2,000 real MNIST training samples
//! 5 times, every run from the same initial params, the rows taking turns so that background
//! load spreads over all of them (`--quick`: 1 compile, 3 runs). The step loop and the modes
//! are the ones `cargo bench` measures (benches/common/workload.rs), so the two agree within
//! noise. Progress goes to stderr.
//!
//! Each row also checks its result: after one pass over the samples, every row must end at
//! the interpreter's params, bit for bit (the report says so under the table).
//!
//! A new row is one more entry in `workload::modes()`.

#[path = "report/anew.rs"]
mod anew;
#[path = "common/cli.rs"]
#[allow(dead_code)]
mod cli;
#[path = "common/epoch.rs"]
mod epoch;
#[path = "../benches/common/families.rs"]
mod families;
#[path = "common/families_bench.rs"]
mod families_bench;
#[path = "../benches/common/handwritten.rs"]
mod handwritten;
#[path = "report/minibatch.rs"]
mod minibatch;
#[path = "report/svg.rs"]
mod svg;
#[path = "common/table.rs"]
mod table;
#[path = "../benches/common/tape_interp.rs"]
mod tape_interp;
#[path = "report/trainer.rs"]
mod trainer;
#[path = "../benches/common/workload.rs"]
mod workload;
#[path = "../benches/common/yardsticks.rs"]
mod yardsticks;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use clap::Parser;

use handwritten::{Expert, ExpertSkippingZeros, HandWritten, Naive};
use table::{code_version, median, significant, thousands};
use tapejit::{Graph, Program};
use workload::{Engine, Mode, Samples, LR};

/// Samples in one MNIST training epoch, for the extrapolated column.
const EPOCH: usize = 60_000;
/// A timed run lasts at least this long: fast rows make several passes over the samples.
const MIN_RUN_SECS: f64 = 0.3;

/// The benchmark report: MNIST per-sample SGD in every mode beside the hand-written rows,
/// minibatches on every core, and the graph families.
#[derive(Parser)]
#[command(name = "report")]
struct Args {
    /// The four MNIST IDX files (default: data/mnist of this package)
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// 1 compile and 3 timed runs per mode instead of 3 and 5 (families: 3 runs)
    #[arg(long)]
    quick: bool,
    /// Training samples per timed run
    #[arg(long, value_name = "N", default_value_t = 2_000, value_parser = cli::positive::<usize>)]
    samples: usize,
    /// Where report.md and report.svg go (default: target/ of this package)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Leave out the graph families
    #[arg(long)]
    no_families: bool,
    /// Only this section (`mnist`: the MNIST and minibatch tables; `trainer`: an epoch of
    /// the trainer end to end)
    #[arg(long, value_enum, default_value_t = Section::All)]
    section: Section,
    /// JAX's steps beside the families, moons and the math families (a Python with jax and
    /// numpy; scripts/setup-jax makes one)
    #[arg(long, value_name = "PYTHON")]
    jax: Option<PathBuf>,
    /// Runs per row of the graphs-built-anew section (default 3, `--quick` 1), at its full
    /// sizes unless `--quick`
    #[arg(long, value_name = "N", value_parser = cli::positive::<usize>)]
    anew_runs: Option<usize>,
}

/// The report's sections.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Section {
    All,
    Mnist,
    Families,
    Anew,
    Trainer,
}

struct Options {
    data: PathBuf,
    out: PathBuf,
    samples: usize,
    compile_repeats: usize,
    step_repeats: usize,
    quick: bool,
    mnist: bool,
    families: bool,
    anew: bool,
    anew_runs: Option<usize>,
    trainer: bool,
    jax: Option<PathBuf>,
}

fn parse_options() -> Options {
    let a = Args::parse();
    let package = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (compile_repeats, step_repeats) = if a.quick { (1, 3) } else { (3, 5) };
    let shows = |s: Section| a.section == s || a.section == Section::All;
    Options {
        data: a.data.unwrap_or_else(|| package.join("data/mnist")),
        out: a.out.unwrap_or_else(|| package.join("target")),
        samples: a.samples,
        compile_repeats,
        step_repeats,
        quick: a.quick,
        mnist: shows(Section::Mnist),
        families: shows(Section::Families) && !(a.no_families && a.section == Section::All),
        anew: shows(Section::Anew),
        anew_runs: a.anew_runs,
        trainer: shows(Section::Trainer),
        jax: a.jax,
    }
}

fn per_sample_us(d: Duration, samples: usize) -> f64 {
    d.as_secs_f64() * 1e6 / samples as f64
}

/// What one row measured.
struct Row {
    name: String,
    kind: svg::Kind,
    /// Tape nodes and median compile seconds; `None` for the hand-written rows.
    tape: Option<(usize, f64)>,
    /// Median microseconds per training step.
    us: f64,
    /// Whether this row must match the interpreter bit for bit.
    exact: bool,
    /// Params after one pass over the samples from the initial params, and the mean loss of
    /// that pass, to check that every row computes the same thing.
    params: Vec<f64>,
    mean_loss: f64,
}

impl Row {
    fn epoch_secs(&self) -> f64 {
        self.us * EPOCH as f64 / 1e6
    }
}

/// Something that trains the classifier: a tape backend or a hand-written step.
trait Trainer {
    /// Back to the initial params (untimed).
    fn reset(&mut self, init: &[f64]);
    /// One SGD step per sample, in order; the time it took and the sum of the losses.
    fn pass(&mut self, samples: &Samples) -> (Duration, f64);
    fn params(&self) -> Vec<f64>;
}

/// A tape backend, trained by `step` per sample, or (`whole_pass`) by one `train` call per
/// pass over the samples (laid end to end once, untimed, on the first pass).
struct Backend {
    program: Box<dyn Program>,
    whole_pass: bool,
    concatenated: Vec<f64>,
}

impl Trainer for Backend {
    fn reset(&mut self, init: &[f64]) {
        self.program
            .set_params(init)
            .expect("finite params of the right length");
    }
    fn pass(&mut self, samples: &Samples) -> (Duration, f64) {
        if !self.whole_pass {
            return workload::time_steps(self.program.as_mut(), samples, LR);
        }
        if self.concatenated.is_empty() {
            self.concatenated = samples.concatenated();
        }
        workload::time_train(self.program.as_mut(), &self.concatenated, LR)
    }
    fn params(&self) -> Vec<f64> {
        self.program.params()
    }
}

struct Hand<H>(H);

impl<H: HandWritten> Trainer for Hand<H> {
    fn reset(&mut self, init: &[f64]) {
        self.0 = H::from_params(init);
    }
    fn pass(&mut self, samples: &Samples) -> (Duration, f64) {
        let start = Instant::now();
        let mut loss = 0.0;
        for (x, &label) in samples.inputs.iter().zip(&samples.labels) {
            loss += self.0.step(&x[..workload::INPUTS], label, LR);
        }
        (start.elapsed(), loss)
    }
    fn params(&self) -> Vec<f64> {
        self.0.params()
    }
}

/// A row being measured.
struct Contestant {
    name: String,
    kind: svg::Kind,
    tape: Option<(usize, f64)>,
    trainer: Box<dyn Trainer>,
    /// Passes over the samples per timed run, so that even the fastest row runs long enough
    /// to time well.
    passes: usize,
    exact: bool,
    params: Vec<f64>,
    mean_loss: f64,
    us: Vec<f64>,
}

/// Compiles `mode` `o.compile_repeats` times (dropping each copy before the next compile).
fn compile(mode: &Mode, g: &Graph, o: &Options) -> Result<Contestant, String> {
    let mut compile_secs = Vec::new();
    let mut program = None;
    for rep in 1..=o.compile_repeats {
        drop(program.take());
        let start = Instant::now();
        let (mut p, stats) = mode.build_with_stats(g).map_err(|e| e.to_string())?;
        if mode.whole_pass {
            // `train` compiles its merged first layer on its first call: count it here (one
            // sample of zeros at learning rate 0; every run starts from the initial params).
            let zeros = vec![0.0; p.tape().num_inputs()];
            p.train(&zeros, 0.0).map_err(|e| e.to_string())?;
        }
        let secs = start.elapsed().as_secs_f64();
        compile_secs.push(secs);
        let detail = stats.map_or(String::new(), |s| {
            format!(
                " (IR {:.3} s, optimize {:.3} s, codegen {:.3} s)",
                s.ir_build_secs, s.optimize_secs, s.codegen_secs
            )
        });
        eprintln!(
            "  {}: build {rep}/{}: {secs:.3} s{detail}",
            mode.name, o.compile_repeats
        );
        program = Some(p);
    }
    let program = program.expect("at least one compile");
    let kind = match mode.engine {
        Engine::Interpreter => svg::Kind::Interpreter,
        Engine::Jit(_) => svg::Kind::Jit,
    };
    Ok(Contestant {
        name: mode.name.clone(),
        kind,
        tape: Some((program.tape().len(), median(&compile_secs))),
        trainer: Box::new(Backend {
            program,
            whole_pass: mode.whole_pass,
            concatenated: Vec::new(),
        }),
        passes: 1,
        exact: mode.exact,
        params: Vec::new(),
        mean_loss: f64::NAN,
        us: Vec::new(),
    })
}

fn hand_written<H: HandWritten + 'static>(init: &[f64]) -> Contestant {
    Contestant {
        name: H::NAME.into(),
        kind: svg::Kind::HandWritten,
        tape: None,
        trainer: Box::new(Hand(H::from_params(init))),
        passes: 1,
        exact: true,
        params: Vec::new(),
        mean_loss: f64::NAN,
        us: Vec::new(),
    }
}

/// Times every contestant: first one untimed pass each from `init` (the warm-up, and the
/// params the check compares), then `o.step_repeats` rounds that time every contestant in
/// turn, so background load spreads evenly over the rows.
fn time_steps(contestants: &mut [Contestant], samples: &Samples, init: &[f64], o: &Options) {
    eprintln!("warm-up and check pass");
    for c in contestants.iter_mut() {
        c.trainer.reset(init);
        let (once, loss) = c.trainer.pass(samples);
        let once = once.as_secs_f64();
        c.params = c.trainer.params();
        c.mean_loss = loss / samples.len() as f64;
        c.passes = ((MIN_RUN_SECS / once.max(1e-9)).ceil() as usize).max(1);
    }
    for round in 1..=o.step_repeats {
        let mut line = format!("round {round}/{}:", o.step_repeats);
        for c in contestants.iter_mut() {
            c.trainer.reset(init);
            let total: Duration = (0..c.passes).map(|_| c.trainer.pass(samples).0).sum();
            let us = per_sample_us(total, c.passes * samples.len());
            let _ = write!(line, " {} {us:.1} us", c.name);
            c.us.push(us);
        }
        eprintln!("{line}");
    }
}

// ---------------------------------------------------------------------------------------------
// The machine
// ---------------------------------------------------------------------------------------------

/// The CPU's model name and the widest vector extensions it reports.
fn cpu() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let model = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let flags = field("flags").unwrap_or_default();
    let has = |f: &str| flags.split_whitespace().any(|x| x == f);
    let isa: Vec<&str> = ["avx512f", "avx2", "fma"]
        .into_iter()
        .filter(|f| has(f))
        .collect();
    if isa.is_empty() {
        model
    } else {
        format!("{model} ({})", isa.join(", "))
    }
}

fn cores() -> String {
    let logical = std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| s.lines().filter(|l| l.starts_with("processor")).count())
        .unwrap_or(0);
    let usable = std::thread::available_parallelism().map_or(0, |n| n.get());
    if logical == usable || logical == 0 {
        format!("{usable}")
    } else {
        format!("{usable} usable of {logical}")
    }
}

/// The LLVM the crate links: llvm-version.txt's major, made precise by that LLVM's
/// `llvm-config` when it is installed where scripts/setup puts it.
fn llvm_version() -> String {
    let major = include_str!("../llvm-version.txt").trim();
    let candidates = [
        format!("/usr/lib/llvm-{major}/bin/llvm-config"),
        format!("llvm-config-{major}"),
    ];
    candidates
        .iter()
        .find_map(|cmd| {
            let out = std::process::Command::new(cmd)
                .arg("--version")
                .output()
                .ok()?;
            let v = String::from_utf8(out.stdout).ok()?.trim().to_string();
            (out.status.success() && v.starts_with(major)).then_some(v)
        })
        .unwrap_or_else(|| format!("{major} (llvm-version.txt)"))
}

/// Today's date (UTC) from the system clock, `YYYY-MM-DD HH:MM UTC`.
fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + (month <= 2) as i64;
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3_600,
        rem % 3_600 / 60
    )
}

// ---------------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------------

fn table(rows: &[Row]) -> String {
    let interp = rows
        .iter()
        .find(|r| r.kind == svg::Kind::Interpreter)
        .expect("an interpreter row");
    let expert = rows
        .iter()
        .find(|r| r.name == <Expert>::NAME)
        .expect("an expert row");
    let mut t = String::new();
    t.push_str(
        "| mode | tape nodes | compile s | us/sample | s/epoch (60k) | speedup vs interpreter \
         | break-even samples | time vs expert |\n|---|--:|--:|--:|--:|--:|--:|--:|\n",
    );
    for r in rows {
        let (nodes, compile) = match r.tape {
            Some((n, c)) => (thousands(n as u64), significant(c)),
            None => ("—".into(), "—".into()),
        };
        let break_even = match r.tape {
            _ if r.kind == svg::Kind::Interpreter => "—".into(),
            None => "—".into(),
            Some((_, c)) if r.us < interp.us => {
                thousands((c * 1e6 / (interp.us - r.us)).ceil() as u64)
            }
            Some(_) => "never".into(),
        };
        let _ = writeln!(
            t,
            "| {} | {nodes} | {compile} | {} | {} | {:.1}× | {break_even} | {:.2}× |",
            r.name,
            significant(r.us),
            significant(r.epoch_secs()),
            interp.us / r.us,
            r.us / expert.us
        );
    }
    t
}

/// Whether every row computed what the interpreter computed: bit for bit for exact rows, and
/// how far off for the others.
fn agreement(rows: &[Row], samples: usize) -> String {
    let Some(reference) = rows.iter().find(|r| r.kind == svg::Kind::Interpreter) else {
        return String::new();
    };
    let scale = reference
        .params
        .iter()
        .fold(0.0, |m: f64, p| m.max(p.abs()));
    let mut failed = Vec::new();
    let mut inexact = Vec::new();
    let mut inexact_names = Vec::new();
    for r in rows {
        let same = r.mean_loss.to_bits() == reference.mean_loss.to_bits()
            && r.params.len() == reference.params.len()
            && r.params
                .iter()
                .zip(&reference.params)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        if same {
            continue;
        }
        let param_diff = r
            .params
            .iter()
            .zip(&reference.params)
            .fold(0.0, |m: f64, (a, b)| m.max((a - b).abs()));
        let loss_diff = (r.mean_loss - reference.mean_loss).abs() / reference.mean_loss.abs();
        let loss = if loss_diff == 0.0 {
            "same mean loss".to_string()
        } else {
            format!("mean loss {loss_diff:.1e} relative")
        };
        let what = format!(
            "{}: {loss}, params up to {:.1e} of the largest param",
            r.name,
            param_diff / scale
        );
        if r.exact {
            failed.push(what);
        } else {
            inexact.push(what);
            inexact_names.push(r.name.as_str());
        }
    }
    let n = thousands(samples as u64);
    let mut text = if failed.is_empty() {
        format!(
            "Check: after one pass over the {n} samples from the same initial params, every \
             row{} ends at the interpreter's params and mean loss, bit for bit.",
            if inexact.is_empty() {
                String::new()
            } else {
                format!(" except {}", inexact_names.join(" and "))
            }
        )
    } else {
        format!(
            "**Check failed:** after one pass over the {n} samples from the same initial \
             params, these rows should match the interpreter bit for bit but differ: {}.",
            failed.join("; ")
        )
    };
    if !inexact.is_empty() {
        let _ = write!(
            text,
            " Rows allowed to reassociate sums differ by rounding: {}.",
            inexact.join("; ")
        );
    }
    text
}

/// The MNIST and minibatch tables (markdown), and the plot's points.
fn mnist_section(o: &Options) -> Result<(String, Vec<svg::Point>), String> {
    eprintln!(
        "loading {} MNIST training samples from {}",
        o.samples,
        o.data.display()
    );
    let samples = Samples::mnist(&o.data, o.samples)?;
    if samples.len() < o.samples {
        eprintln!("only {} samples available; timing those", samples.len());
    }
    let n = samples.len();
    let g = Graph::new();
    workload::mnist_graph(&g, workload::HIDDEN);

    let modes = workload::modes();
    let init = modes[0]
        .build(&g)
        .map_err(|e| e.to_string())?
        .params()
        .to_vec();
    let mut contestants = Vec::new();
    for (i, mode) in modes.iter().enumerate() {
        eprintln!("compiling {} ({}/{})", mode.name, i + 1, modes.len());
        contestants.push(compile(mode, &g, o)?);
    }
    contestants.push(hand_written::<Naive>(&init));
    contestants.push(hand_written::<Expert>(&init));
    contestants.push(hand_written::<ExpertSkippingZeros>(&init));
    time_steps(&mut contestants, &samples, &init, o);
    let rows: Vec<Row> = contestants
        .into_iter()
        .map(|c| Row {
            name: c.name,
            kind: c.kind,
            tape: c.tape,
            us: median(&c.us),
            exact: c.exact,
            params: c.params,
            mean_loss: c.mean_loss,
        })
        .collect();

    let mut report = String::new();
    let _ = writeln!(report, "## Benchmark: MNIST 784-50-10\n");
    let _ = writeln!(
        report,
        "- date: {}\n- CPU: {}, {} cores\n- LLVM: {}\n- code: tapejit {}\n- workload: softmax cross-entropy \
         classifier, {} tape nodes, per-sample SGD (lr {LR}) on the first {} MNIST training \
         samples; compile time {}, step time median of {} timed runs \
         (each from the same initial params, after an untimed warm-up pass; the rows take \
         turns, and fast rows repeat the samples to run at least {MIN_RUN_SECS} s); release \
         build, `-C target-cpu=native`\n",
        now_utc(),
        cpu(),
        cores(),
        llvm_version(),
        code_version().unwrap_or_else(|| "(no git)".into()),
        thousands(rows[0].tape.map_or(0, |t| t.0) as u64),
        thousands(n as u64),
        match o.compile_repeats {
            1 => "of one compile".to_string(),
            n => format!("median of {n} compiles"),
        },
        o.step_repeats,
    );
    report.push_str(&table(&rows));
    let _ = writeln!(
        report,
        "\nCompile s: wall time of `Interpreter::new` or `JitBuilder::compile` on the built \
         graph (linearize, lower, optimize, generate code), and for the `train()` rows the \
         first `train` call too, which compiles `train`'s merged layer. s/epoch: us/sample extrapolated to \
         60,000 samples. Break-even: samples after which a mode's compile time is repaid \
         against the interpreter, compile s / (interpreter us - mode us). Time vs expert: \
         us/sample over the hand-written expert's, measured in the same run. Plot: report.svg \
         beside this file.\n\n{}",
        agreement(&rows, n)
    );
    let _ = write!(
        report,
        "\n## Minibatch SGD on every core\n\n`Program::train_minibatches` at O2.\n\n{}",
        minibatch::table(&g, &samples, o.step_repeats, MIN_RUN_SECS)?
    );
    let points: Vec<svg::Point> = rows
        .iter()
        .map(|r| svg::Point {
            label: r.name.clone(),
            compile_secs: r.tape.map_or(0.0, |t| t.1),
            epoch_secs: r.epoch_secs(),
            kind: r.kind,
        })
        .collect();
    Ok((report, points))
}

fn run(o: Options) -> Result<(), String> {
    let started = Instant::now();
    let mut report = String::new();
    let mut points = None;
    if o.mnist {
        let (section, p) = mnist_section(&o)?;
        report.push_str(&section);
        points = Some(p);
    }
    let mut failed = Vec::new();
    if o.families {
        let mut settings = families_bench::Settings::new(true, o.data.clone());
        settings.runs = o.step_repeats;
        settings.jax = o.jax.clone();
        let (table, agrees) = families_bench::report(&settings);
        if !agrees {
            failed.push("a graph family's JIT does not match the interpreter");
        }
        let _ = write!(
            report,
            "\n## Graph families\n\nThe graphs micrograd users write (`examples/families`, quick \
             sizes; `cargo run --release --example families` measures every size).\n\n{table}"
        );
    }
    if o.anew {
        let settings = anew::Settings {
            quick: o.quick,
            runs: o.anew_runs.unwrap_or(if o.quick { 1 } else { 3 }),
        };
        let (table, agrees) = anew::report(&settings);
        if !agrees {
            failed.push("a backend does not match the interpreter on a graph built anew");
        }
        let _ = write!(
            report,
            "\n## Graphs built anew\n\nIrregular graphs and rollouts from an empty graph to \
             the last iteration (issue #40), beside the yardstick tape interpreter \
             (`benches/common/tape_interp.rs`); {}, tapejit {}.\n\n{table}",
            cpu(),
            code_version().unwrap_or_else(|| "(no git)".into()),
        );
    }
    if o.trainer {
        let settings = trainer::Settings {
            data: o.data.clone(),
            scratch: o.out.join("trainer-c"),
            runs: if o.quick { 1 } else { 3 },
            quick: o.quick,
        };
        let _ = write!(
            report,
            "\n## The trainer, end to end\n\nAn epoch of MNIST as `examples/mnist.rs` trains \
             it (issue #41), beside the hand-written C of `../shared/baselines`; {}, tapejit \
             {}.\n\n{}",
            cpu(),
            code_version().unwrap_or_else(|| "(no git)".into()),
            trainer::report(&settings)?
        );
    }

    std::fs::create_dir_all(&o.out)
        .map_err(|e| format!("cannot create {}: {e}", o.out.display()))?;
    let md = o.out.join("report.md");
    std::fs::write(&md, &report).map_err(|e| format!("cannot write {}: {e}", md.display()))?;
    let mut wrote = md.display().to_string();
    if let Some(points) = points {
        let plot = o.out.join("report.svg");
        let title = format!("MNIST 784-50-10 on {}", cpu());
        std::fs::write(&plot, svg::plot(&title, &points))
            .map_err(|e| format!("cannot write {}: {e}", plot.display()))?;
        let _ = write!(wrote, " and {}", plot.display());
    }

    println!("{report}");
    eprintln!("wrote {wrote} in {:.0} s", started.elapsed().as_secs_f64());
    match failed.first() {
        None => Ok(()),
        Some(&what) => Err(what.into()),
    }
}

fn main() -> ExitCode {
    match run(parse_options()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}
