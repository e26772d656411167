//! The report's "graphs built anew" section (issue #40): wall time from an empty graph to
//! the last training iteration (building the graph, `Tape::from_graph` or compiling, then
//! `step` after `step`), for irregular graphs (the irregular one twice: softplus as its user
//! wrote it and as one op) and rollouts whose steps loop recovery finds (families.rs'
//! springs and RNN), on the JIT at O2 and O0 and the interpreter, beside the yardstick: a
//! tape interpreter as fast as a plain one gets (benches/common/tape_interp.rs). Then the
//! same for a graph rebuilt every K iterations (a fresh graph of the same kind, a new seed
//! each time).
//!
//! One run passes every iteration count in turn: the time at 100 iterations is the clock
//! when the 100th finished, in the run that goes on to 10,000. Backends take turns, run by
//! run, and every number is a median over runs.

use std::fmt::Write as _;
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program, Tape, Tiering};

use crate::families::{Rnn, Springs};
use crate::table::{median, significant, thousands};
use crate::tape_interp::TapeInterp;
use crate::workload::{self, Softplus};

/// The learning rate of every iteration (small: 10,000 SGD steps keep the params and the
/// values moderate).
const LR: f64 = 1e-4;
/// Graphs a rebuilt row builds, each run for its K iterations.
const REBUILT_GRAPHS: usize = 3;

/// What to measure.
pub struct Settings {
    /// Smaller graphs and fewer iterations.
    pub quick: bool,
    /// Runs per row (the median is reported).
    pub runs: usize,
}

/// A kind of graph at one size.
#[derive(Clone, Copy, Debug)]
enum Workload {
    /// `workload::random_dag` of about this many nodes.
    Dag(usize),
    /// `workload::irregular_ops_written` of this many operations, softplus written so.
    Irregular(usize, Softplus),
    /// `families::Springs` (16 masses) over this many steps: a rollout, the same for every
    /// seed.
    Springs(usize),
    /// `families::Rnn` (4 inputs, 16 hidden) over this many steps: a rollout, the same for
    /// every seed.
    Rnn(usize),
}

impl Workload {
    fn name(self) -> String {
        match self {
            Workload::Dag(n) => format!("random_dag, {} nodes", thousands(n)),
            Workload::Irregular(n, Softplus::Written) => {
                format!("irregular, {} ops, softplus written", thousands(n))
            }
            Workload::Irregular(n, Softplus::Op) => {
                format!("irregular, {} ops, softplus one op", thousands(n))
            }
            Workload::Springs(t) => format!("springs rollout, T = {}", thousands(t)),
            Workload::Rnn(t) => format!("RNN rollout, T = {}", thousands(t)),
        }
    }

    /// Builds the graph of `seed` on `g`; returns the inputs every iteration steps on.
    fn build(self, g: &Graph, seed: u64) -> Vec<f64> {
        match self {
            Workload::Dag(n) => workload::random_dag(g, n, seed),
            Workload::Irregular(n, softplus) => {
                workload::irregular_ops_written(g, n, seed, softplus)
            }
            // The family's own data (its learning rate is not used: every row steps at LR).
            Workload::Springs(t) => return Springs::new(t).build(g).inputs,
            Workload::Rnn(t) => return Rnn::new(t).build(g).inputs,
        }
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        (0..g.num_inputs())
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect()
    }
}

/// A backend of the table.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Backend {
    Jit(OptLevel, Tiering),
    /// Tiered at O2 with the fast code generator (`JitBuilder::codegen(OptLevel::O1)`):
    /// native code sooner, about 20% slower per call.
    JitFastCodegen,
    Interpreter,
    Yardstick,
}

const BACKENDS: [Backend; 7] = [
    Backend::Jit(OptLevel::O2, Tiering::Auto),
    Backend::JitFastCodegen,
    Backend::Jit(OptLevel::O2, Tiering::FirstTierOnly),
    Backend::Jit(OptLevel::O2, Tiering::Off),
    Backend::Jit(OptLevel::O0, Tiering::Off),
    Backend::Interpreter,
    Backend::Yardstick,
];

/// Something that steps.
enum Runner {
    Jit(Box<Jit>),
    Interpreter(Box<Interpreter>),
    Yardstick(Box<TapeInterp>),
}

impl Backend {
    fn name(self) -> String {
        match self {
            Backend::Jit(level, Tiering::Auto) => format!("JIT {level} (tiered)"),
            Backend::Jit(_, Tiering::FirstTierOnly) => "JIT first tier only".into(),
            Backend::Jit(level, Tiering::Off) => format!("JIT {level}, tiering off"),
            Backend::JitFastCodegen => "JIT O2 (tiered), codegen(O1)".into(),
            Backend::Interpreter => "interpreter".into(),
            Backend::Yardstick => "yardstick".into(),
        }
    }

    /// What runs `g` (compiled, linearized or converted): the work "ready" includes.
    fn prepare(self, g: &Graph) -> Runner {
        match self {
            Backend::Jit(level, tiering) => {
                let jit = Jit::builder().opt_level(level).tiering(tiering).compile(g);
                Runner::Jit(Box::new(jit.expect("the graph compiles")))
            }
            Backend::JitFastCodegen => {
                let jit = Jit::builder().codegen(OptLevel::O1).compile(g);
                Runner::Jit(Box::new(jit.expect("the graph compiles")))
            }
            Backend::Interpreter => {
                Runner::Interpreter(Box::new(Interpreter::new(g).expect("the graph linearizes")))
            }
            Backend::Yardstick => {
                let tape = Tape::from_graph(g).expect("the graph linearizes");
                Runner::Yardstick(Box::new(TapeInterp::from_tape(&tape)))
            }
        }
    }
}

impl Runner {
    fn step(&mut self, inputs: &[f64]) -> f64 {
        match self {
            Runner::Jit(p) => p.step(inputs, LR).expect("the graph's inputs"),
            Runner::Interpreter(p) => p.step(inputs, LR).expect("the graph's inputs"),
            Runner::Yardstick(y) => y.step(inputs, LR),
        }
    }

    fn params(&self) -> Vec<f64> {
        match self {
            Runner::Jit(p) => p.params(),
            Runner::Interpreter(p) => p.params(),
            Runner::Yardstick(y) => y.params(),
        }
    }

    fn nodes(&self) -> usize {
        match self {
            Runner::Jit(p) => p.tape().len(),
            Runner::Interpreter(p) => p.tape().len(),
            Runner::Yardstick(y) => y.len(),
        }
    }
}

/// One run from an empty graph.
struct Run {
    /// Seconds until the first step could run (graph built, compiled or converted).
    ready: f64,
    /// Seconds when each checkpoint's last iteration finished.
    at: Vec<f64>,
    nodes: usize,
    /// The JIT's own account, after the last iteration.
    jit: Option<JitAccount>,
    params: Vec<f64>,
    finite: bool,
}

/// What `JitStats` says of a run's native code (zeros where it never took over).
#[derive(Clone, Copy, Debug)]
struct JitAccount {
    compile_secs: f64,
    code_bytes: usize,
    /// Loops loop recovery made, and the tape nodes they cover.
    loops: usize,
    loop_nodes: usize,
    /// Seconds from the compile's start until native code took over from the first tier.
    native_after: Option<f64>,
}

impl JitAccount {
    fn of(jit: &Jit) -> JitAccount {
        let s = jit.stats();
        JitAccount {
            compile_secs: s.compile_secs,
            code_bytes: s.code_bytes,
            loops: s.loops,
            loop_nodes: s.loop_nodes,
            native_after: s.native_after_secs,
        }
    }
}

fn run(w: Workload, backend: Backend, seed: u64, checkpoints: &[usize]) -> Run {
    let start = Instant::now();
    let g = Graph::new();
    let inputs = w.build(&g, seed);
    let mut runner = backend.prepare(&g);
    let ready = start.elapsed().as_secs_f64();
    let mut at = Vec::new();
    let mut loss = 0.0;
    let mut done = 0;
    for &n in checkpoints {
        for _ in done..n {
            loss = runner.step(&inputs);
        }
        done = n;
        at.push(start.elapsed().as_secs_f64());
    }
    let params = runner.params();
    Run {
        ready,
        at,
        nodes: runner.nodes(),
        jit: match &runner {
            Runner::Jit(j) => Some(JitAccount::of(j)),
            _ => None,
        },
        finite: loss.is_finite() && params.iter().all(|p| p.is_finite()),
        params,
    }
}

/// Seconds to build, prepare and step `k` times `graphs` fresh graphs of `w` (seeds from
/// `seed` on), one after another; and the last graph's params.
fn rebuilt(w: Workload, backend: Backend, seed: u64, k: usize, graphs: usize) -> (f64, Vec<f64>) {
    let start = Instant::now();
    let mut params = Vec::new();
    for j in 0..graphs as u64 {
        let g = Graph::new();
        let inputs = w.build(&g, seed + j);
        let mut runner = backend.prepare(&g);
        for _ in 0..k {
            runner.step(&inputs);
        }
        params = runner.params();
    }
    (start.elapsed().as_secs_f64(), params)
}

/// "median of 3 runs", or "one run".
fn runs_text(runs: usize) -> String {
    match runs {
        1 => "one run".into(),
        n => format!("median of {n} runs"),
    }
}

fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A row of the first table: one backend on one graph, medians over runs.
struct Row {
    workload: String,
    backend: Backend,
    nodes: usize,
    ready: f64,
    at: Vec<f64>,
    us_per_iteration: f64,
    /// Medians over runs (`native_after` over the runs where native code took over).
    jit: Option<JitAccount>,
    /// Runs where native code took over, and runs.
    took_over: (usize, usize),
    same_bits: bool,
    finite: bool,
}

/// Rollout steps: about 40,000 tape nodes in full (springs 80 steps, the RNN 100), about 5,000
/// with `--quick`.
const SPRINGS_FULL: usize = 80;
const RNN_FULL: usize = 100;
const SPRINGS_QUICK: usize = 10;
const RNN_QUICK: usize = 12;

/// What the section measures, full or `--quick`.
struct Sizes {
    workloads: Vec<Workload>,
    /// The iteration counts a run passes, the last the run's length.
    checkpoints: Vec<usize>,
    /// The graph rebuilt, and every how many iterations.
    rebuilt: Workload,
    ks: Vec<usize>,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                workloads: vec![
                    Workload::Dag(5_000),
                    Workload::Irregular(1_000, Softplus::Written),
                    Workload::Irregular(1_000, Softplus::Op),
                    Workload::Springs(SPRINGS_QUICK),
                    Workload::Rnn(RNN_QUICK),
                ],
                checkpoints: vec![10, 100, 1_000],
                rebuilt: Workload::Irregular(1_000, Softplus::Written),
                ks: vec![10, 100],
            }
        } else {
            Sizes {
                workloads: vec![
                    Workload::Dag(20_000),
                    Workload::Dag(60_000),
                    Workload::Irregular(10_000, Softplus::Written),
                    Workload::Irregular(10_000, Softplus::Op),
                    Workload::Springs(SPRINGS_FULL),
                    Workload::Rnn(RNN_FULL),
                ],
                checkpoints: vec![100, 1_000, 10_000],
                rebuilt: Workload::Irregular(10_000, Softplus::Written),
                ks: vec![100, 1_000],
            }
        }
    }
}

/// The position of `b` in [`BACKENDS`].
fn position(b: Backend) -> usize {
    BACKENDS
        .iter()
        .position(|&x| x == b)
        .expect("a backend of the table")
}

/// The seed of the first table's graphs.
const SEED: u64 = 1;
/// The first seed of the rebuilt graphs.
const REBUILT_SEED: u64 = 100;

/// The section (markdown) and whether every backend ended at the interpreter's params.
pub fn report(o: &Settings) -> (String, bool) {
    let sizes = Sizes::new(o.quick);
    let checkpoints = &sizes.checkpoints;
    let last = *checkpoints.last().expect("a checkpoint");
    let mut rows = Vec::new();
    let mut agree = true;
    for &w in &sizes.workloads {
        let mut runs: Vec<Vec<Run>> = BACKENDS.iter().map(|_| Vec::new()).collect();
        for r in 1..=o.runs {
            let mut line = format!("{}: run {r}/{}:", w.name(), o.runs);
            for (b, &backend) in BACKENDS.iter().enumerate() {
                let done = run(w, backend, SEED, checkpoints);
                let total = done.at[done.at.len() - 1];
                let _ = write!(
                    line,
                    " {} ready {:.3} s, {total:.2} s;",
                    backend.name(),
                    done.ready
                );
                runs[b].push(done);
            }
            eprintln!("{line}");
        }
        let reference = &runs[position(Backend::Interpreter)][0].params;
        for (b, &backend) in BACKENDS.iter().enumerate() {
            let rs = &runs[b];
            let med = |f: &dyn Fn(&Run) -> f64| median(&rs.iter().map(f).collect::<Vec<_>>());
            let same = rs.iter().all(|r| same_bits(&r.params, reference));
            let native_after: Vec<f64> = rs
                .iter()
                .filter_map(|r| r.jit.and_then(|j| j.native_after))
                .collect();
            agree &= same;
            rows.push(Row {
                workload: w.name(),
                backend,
                nodes: rs[0].nodes,
                ready: med(&|r| r.ready),
                at: (0..checkpoints.len()).map(|i| med(&|r| r.at[i])).collect(),
                us_per_iteration: med(&|r| (r.at[r.at.len() - 1] - r.ready) / last as f64 * 1e6),
                jit: (rs[0].jit).map(|first| JitAccount {
                    compile_secs: med(&|r| r.jit.map_or(0.0, |j| j.compile_secs)),
                    native_after: Some(median(&native_after)).filter(|s| !s.is_nan()),
                    ..first
                }),
                took_over: (native_after.len(), rs.len()),
                same_bits: same,
                finite: rs.iter().all(|r| r.finite),
            });
        }
    }
    let last_text = thousands(last);
    let mut out = first_table(&rows, checkpoints);
    let _ = writeln!(
        out,
        "\nWall time from an empty graph to the end of the iteration: building the graph \
         (seed {SEED}), then `Jit::compile`, `Interpreter::new`, or `Tape::from_graph` and the \
         yardstick's conversion (ready s), then `step` (forward, backward, SGD at lr {LR}) on \
         fixed inputs. One run passes every iteration count; {}, the backends taking turns. \
         us/iteration: (time at {last_text} - ready) / {last_text}. × yardstick: total time \
         over the yardstick's at each count (below 1: faster than the yardstick). \
         Compile s: `JitStats::compile_secs`; code KB: `JitStats::code_bytes`. Same bits: \
         the params after {last_text} iterations are the interpreter's, bit for bit.",
        runs_text(o.runs),
    );
    let _ = write!(out, "\n{}", native_notes(&rows));
    let (rebuilt_table, rebuilt_agree) = rebuilt_table(sizes.rebuilt, &sizes.ks, o.runs);
    let _ = write!(out, "\n{rebuilt_table}");
    (out, agree && rebuilt_agree)
}

/// Per graph: when the tiered JIT's native code took over, and the loops loop recovery made
/// in the native code compiled at O2 with tiering off (the same code the tiered JIT
/// compiles).
fn native_notes(rows: &[Row]) -> String {
    let mut t = String::from(
        "Native code, per graph (medians): when it took over from the first tier in the \
         tiered runs (`JitStats::native_after_secs`, from the compile's start), and the loops \
         loop recovery made at O2 (`JitStats::loops`, `loop_nodes`).\n\n",
    );
    for r in rows
        .iter()
        .filter(|r| r.backend == Backend::Jit(OptLevel::O2, Tiering::Off))
    {
        let after = |backend: Backend| -> String {
            let tiered = rows
                .iter()
                .find(|t| t.workload == r.workload && t.backend == backend);
            match tiered.map(|t| (t.took_over, t.jit.and_then(|j| j.native_after))) {
                Some(((0, _), _)) | Some((_, None)) => {
                    "never took over (the runs ended first)".into()
                }
                Some(((k, n), Some(secs))) if k == n => {
                    format!("took over after {} s", significant(secs))
                }
                Some(((k, n), Some(secs))) => {
                    format!(
                        "took over in {k} of {n} runs, after {} s",
                        significant(secs)
                    )
                }
                None => "ran in no tiered run".into(),
            }
        };
        let after = format!(
            "{}; with codegen(O1), {}",
            after(Backend::Jit(OptLevel::O2, Tiering::Auto)),
            after(Backend::JitFastCodegen)
        );
        let loops = r.jit.map_or("—".into(), |j| {
            format!(
                "{} loops over {} of {} nodes",
                j.loops,
                thousands(j.loop_nodes),
                thousands(r.nodes)
            )
        });
        let _ = writeln!(t, "- {}: native code {after}; {loops}.", r.workload);
    }
    t
}

fn first_table(rows: &[Row], checkpoints: &[usize]) -> String {
    let counts: Vec<String> = checkpoints.iter().map(|&n| thousands(n)).collect();
    let mut t = format!(
        "| graph | tape nodes | backend | ready s | {} | us/iteration | × yardstick at {} \
         | compile s, code KB | same bits |\n|---|--:|---|--:|{}--:|--:|--:|:-:|\n",
        counts
            .iter()
            .map(|n| format!("s at {n}"))
            .collect::<Vec<_>>()
            .join(" | "),
        counts.join(" / "),
        "--:|".repeat(counts.len()),
    );
    for r in rows {
        let yard = rows
            .iter()
            .find(|y| y.workload == r.workload && y.backend == Backend::Yardstick)
            .expect("a yardstick row");
        let ratios: Vec<String> = (r.at.iter().zip(&yard.at))
            .map(|(a, y)| format!("{}×", significant(a / y)))
            .collect();
        let jit = r.jit.map_or("—".into(), |j| {
            format!(
                "{}, {}",
                significant(j.compile_secs),
                thousands(j.code_bytes / 1024)
            )
        });
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {jit} | {}{} |",
            r.workload,
            thousands(r.nodes),
            r.backend.name(),
            significant(r.ready),
            r.at.iter()
                .map(|&s| significant(s))
                .collect::<Vec<_>>()
                .join(" | "),
            significant(r.us_per_iteration),
            ratios.join(" / "),
            if r.same_bits { "yes" } else { "NO" },
            if r.finite { "" } else { " (not finite)" },
        );
    }
    t
}

/// The rebuilt rows: for each K, `REBUILT_GRAPHS` fresh graphs of `w` run K iterations
/// each, per backend; medians over `runs`.
fn rebuilt_table(w: Workload, ks: &[usize], runs: usize) -> (String, bool) {
    let mut t = format!(
        "Rebuilt every K iterations: {REBUILT_GRAPHS} fresh graphs ({}, seeds {REBUILT_SEED}, \
         {}, ...), each built, prepared and run K iterations, one after another; {}. Same \
         bits: the last graph's params are the interpreter's.\n\n\
         | K | backend | total s | s per graph | × yardstick | same bits |\n\
         |--:|---|--:|--:|--:|:-:|\n",
        w.name(),
        REBUILT_SEED + 1,
        runs_text(runs),
    );
    let mut agree = true;
    for &k in ks {
        let mut secs: Vec<Vec<f64>> = BACKENDS.iter().map(|_| Vec::new()).collect();
        let mut params: Vec<Vec<f64>> = BACKENDS.iter().map(|_| Vec::new()).collect();
        for r in 1..=runs {
            let mut line = format!("rebuilt every {k}: run {r}/{runs}:");
            for (b, &backend) in BACKENDS.iter().enumerate() {
                let (s, p) = rebuilt(w, backend, REBUILT_SEED, k, REBUILT_GRAPHS);
                let _ = write!(line, " {} {s:.2} s;", backend.name());
                secs[b].push(s);
                params[b] = p;
            }
            eprintln!("{line}");
        }
        let interp = position(Backend::Interpreter);
        let yard = median(&secs[position(Backend::Yardstick)]);
        for (b, &backend) in BACKENDS.iter().enumerate() {
            let total = median(&secs[b]);
            let same = same_bits(&params[b], &params[interp]);
            agree &= same;
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {}× | {} |",
                thousands(k),
                backend.name(),
                significant(total),
                significant(total / REBUILT_GRAPHS as f64),
                significant(total / yard),
                if same { "yes" } else { "NO" },
            );
        }
    }
    (t, agree)
}
