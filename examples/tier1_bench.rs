//! Measures the kernel-tier prototype of issue #40 (benches/common/tier1.rs) against the
//! yardstick tape interpreter (benches/common/tape_interp.rs) on the graphs of "graphs built
//! anew": `workload::irregular_ops` (10,000 ops), `workload::random_dag` (20k and 60k
//! nodes) and two rollouts (`families::Rnn`, `families::Springs`). For each graph: the shape
//! the tier sees (levels, (level, kind) batches, runs per schedule, pulled contributions),
//! then per backend the preparation time (from the tape) and the time per iteration (one
//! SGD `step`), medians over runs with the backends taking turns, and the wall time from an
//! empty graph to the last of 100 / 1,000 / 10,000 iterations projected from those medians
//! (graph build and `Tape::from_graph` included, the same for every backend), as a ratio to
//! the yardstick's.
//!
//! cargo run --release --example tier1_bench -- [--runs R] [--iters N] [--jit]
//!
//! `--jit` adds the JIT at O0 (compiled once per graph: seconds).

#[path = "../benches/common/families.rs"]
mod families;
#[path = "common/table.rs"]
#[allow(dead_code)]
mod table;
#[path = "../benches/common/tape_interp.rs"]
mod tape_interp;
#[path = "../benches/common/tier1.rs"]
mod tier1;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::time::Instant;

use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use table::{median, significant, thousands};
use tape_interp::TapeInterp;
use tapejit::{Graph, Jit, OptLevel, Program, Tape, Tiering};
use tier1::{Schedule, Tier1};

const LR: f64 = 1e-4;

#[derive(Parser)]
struct Args {
    /// Timed runs per backend (medians reported)
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Iterations per timed run
    #[arg(long, default_value_t = 300)]
    iters: usize,
    /// Also the JIT at O0 (per-iteration time; compiled once)
    #[arg(long)]
    jit: bool,
    /// Only the graphs whose name contains this (e.g. `irregular`, `60,000`)
    #[arg(long)]
    only: Option<String>,
    /// Only the backends whose name contains this, beside the yardstick (e.g. `greedy`)
    #[arg(long)]
    backend: Option<String>,
}

#[derive(Clone, Copy, Debug)]
enum Workload {
    Irregular(usize),
    /// `irregular_ops` with each softplus one `Op::Softplus` node (issue #40's deliverable
    /// 5) instead of nine.
    IrregularSoftplus(usize),
    Dag(usize),
    /// `families::Rnn` over this many steps (a rollout).
    Rnn(usize),
    /// `families::Springs` over this many steps (a rollout).
    Springs(usize),
}

impl Workload {
    fn name(self) -> String {
        match self {
            Workload::Irregular(n) => format!("irregular_ops({})", thousands(n)),
            Workload::IrregularSoftplus(n) => {
                format!("irregular_ops({}), softplus as one op", thousands(n))
            }
            Workload::Dag(n) => format!("random_dag({})", thousands(n)),
            Workload::Rnn(t) => format!("rnn rollout, T = {t}"),
            Workload::Springs(t) => format!("springs rollout, T = {t}"),
        }
    }
    fn build(self, g: &Graph) -> Vec<f64> {
        match self {
            Workload::Irregular(n) => workload::irregular_ops(g, n, 1),
            Workload::IrregularSoftplus(n) => irregular_with_softplus(g, n, 1),
            Workload::Dag(n) => workload::random_dag(g, n, 1),
            Workload::Rnn(t) => return families::Rnn::new(t).build(g).inputs,
            Workload::Springs(t) => return families::Springs::new(t).build(g).inputs,
        }
        let mut rng = StdRng::seed_from_u64(0x5eed);
        (0..g.num_inputs())
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect()
    }
}

enum Runner {
    Yard(Box<TapeInterp>),
    Tier(Box<Tier1>),
    Jit(Box<Jit>),
}

impl Runner {
    fn step(&mut self, x: &[f64]) -> f64 {
        match self {
            Runner::Yard(y) => y.step(x, LR),
            Runner::Tier(t) => t.step(x, LR),
            Runner::Jit(j) => j.step(x, LR).unwrap(),
        }
    }
    fn params(&self) -> Vec<f64> {
        match self {
            Runner::Yard(y) => y.params(),
            Runner::Tier(t) => t.params(),
            Runner::Jit(j) => j.params(),
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Backend {
    Yardstick,
    Tier(Schedule),
    /// The library's kernel tier (`Tiering::FirstTierOnly`; its preparation includes
    /// `Tape::from_graph`).
    FirstTier,
    JitO0,
}

impl Backend {
    fn name(self) -> String {
        match self {
            Backend::Yardstick => "yardstick".into(),
            Backend::Tier(s) => format!("tier1, {}", s.name()),
            Backend::FirstTier => "JIT first tier (src/kernels)".into(),
            Backend::JitO0 => "JIT O0".into(),
        }
    }
    fn prepare(self, g: &Graph, tape: &Tape) -> Runner {
        match self {
            Backend::Yardstick => Runner::Yard(Box::new(TapeInterp::from_tape(tape))),
            Backend::Tier(s) => Runner::Tier(Box::new(Tier1::from_tape(tape, s))),
            Backend::FirstTier => Runner::Jit(Box::new(
                Jit::builder()
                    .tiering(Tiering::FirstTierOnly)
                    .compile(g)
                    .unwrap(),
            )),
            Backend::JitO0 => Runner::Jit(Box::new(
                Jit::builder()
                    .opt_level(OptLevel::O0)
                    .tiering(Tiering::Off)
                    .compile(g)
                    .unwrap(),
            )),
        }
    }
}

fn main() {
    let args = Args::parse();
    let workloads = [
        Workload::Irregular(10_000),
        Workload::IrregularSoftplus(10_000),
        Workload::Dag(20_000),
        Workload::Dag(60_000),
        Workload::Rnn(100),
        Workload::Springs(80),
    ];
    let mut backends = vec![Backend::Yardstick];
    backends.extend(Schedule::ALL.map(Backend::Tier));
    backends.push(Backend::FirstTier);
    if let Some(b) = &args.backend {
        backends.retain(|x| *x == Backend::Yardstick || x.name().contains(b.as_str()));
    }
    for w in workloads {
        if args
            .only
            .as_ref()
            .is_some_and(|o| !w.name().contains(o.as_str()))
        {
            continue;
        }
        let t0 = Instant::now();
        let g = Graph::new();
        let inputs = w.build(&g);
        let built = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let tape = Tape::from_graph(&g).unwrap();
        let linearized = t1.elapsed().as_secs_f64();
        let n = tape.len();
        println!(
            "\n## {}: {} tape nodes (graph built in {} ms, linearized in {} ms)\n",
            w.name(),
            thousands(n),
            significant(built * 1e3),
            significant(linearized * 1e3)
        );
        println!("| schedule | ops | levels | (level, kind) batches | mean batch | runs | mean run | edges | pulled edges | pulled targets |");
        println!("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
        for s in Schedule::ALL {
            let st = Tier1::from_tape(&tape, s).stats();
            println!(
                "| {} | {} | {} | {} | {:.2} | {} | {:.2} | {} | {} | {} |",
                s.name(),
                thousands(st.ops),
                thousands(st.levels),
                thousands(st.level_batches),
                st.mean_level_batch(),
                thousands(st.runs),
                st.mean_run(),
                thousands(st.edges),
                thousands(st.pulled_edges),
                thousands(st.pulled_targets),
            );
        }

        let mut prep: Vec<Vec<f64>> = vec![Vec::new(); backends.len()];
        let mut iter: Vec<Vec<f64>> = vec![Vec::new(); backends.len()];
        let mut final_params: Vec<Option<Vec<f64>>> = vec![None; backends.len()];
        for r in 0..args.runs {
            for k in 0..backends.len() {
                let b = (k + r) % backends.len();
                let start = Instant::now();
                let mut runner = backends[b].prepare(&g, &tape);
                prep[b].push(start.elapsed().as_secs_f64());
                let start = Instant::now();
                for _ in 0..args.iters {
                    std::hint::black_box(runner.step(&inputs));
                }
                iter[b].push(start.elapsed().as_secs_f64() / args.iters as f64);
                let params = runner.params();
                if let Some(p) = &final_params[b] {
                    assert_eq!(p, &params);
                }
                final_params[b] = Some(params);
            }
        }
        let reference = final_params[0].clone().unwrap();
        for (b, p) in backends.iter().zip(&final_params) {
            let same = p
                .as_ref()
                .unwrap()
                .iter()
                .zip(&reference)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{} ends at other params than the yardstick", b.name());
        }
        let mut rows: Vec<(String, f64, f64)> = backends
            .iter()
            .enumerate()
            .map(|(b, be)| (be.name(), median(&prep[b]), median(&iter[b])))
            .collect();
        if args.jit {
            let start = Instant::now();
            let mut runner = Backend::JitO0.prepare(&g, &tape);
            let compile = start.elapsed().as_secs_f64();
            let mut times = Vec::new();
            for _ in 0..args.runs {
                let start = Instant::now();
                for _ in 0..args.iters {
                    std::hint::black_box(runner.step(&inputs));
                }
                times.push(start.elapsed().as_secs_f64() / args.iters as f64);
            }
            rows.push(("JIT O0 (1 compile)".into(), compile, median(&times)));
        }
        println!(
            "\n{} runs of {} iterations, medians; total = build + linearize + prepare + n x iteration\n",
            args.runs, args.iters
        );
        println!("| backend | prepare (ms) | ns/node prepare | iteration (us) | ns/node | 100 | 1,000 | 10,000 |");
        println!("|---|--:|--:|--:|--:|--:|--:|--:|");
        let common = built + linearized;
        let total = |prep: f64, it: f64, k: f64| common + prep + k * it;
        let (yp, yi) = (rows[0].1, rows[0].2);
        for (name, p, it) in &rows {
            let ratio = |k: f64| total(*p, *it, k) / total(yp, yi, k);
            println!(
                "| {name} | {} | {} | {} | {} | {}x | {}x | {}x |",
                significant(p * 1e3),
                significant(p * 1e9 / n as f64),
                significant(it * 1e6),
                significant(it * 1e9 / n as f64),
                significant(ratio(100.0)),
                significant(ratio(1_000.0)),
                significant(ratio(10_000.0)),
            );
        }
    }
}

/// `workload::irregular_ops` with each softplus written `x.softplus()`: one node instead of
/// nine.
fn irregular_with_softplus(g: &Graph, ops: usize, seed: u64) {
    workload::irregular_ops_written(g, ops, seed, workload::Softplus::Op)
}
