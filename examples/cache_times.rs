//! The persistent compile cache, measured: the wall time of `JitBuilder::compile` in a fresh
//! process with the cache off, cold (an empty directory: LLVM runs and the entries are
//! written) and warm (the entries the cold process wrote), for the irregular graph
//! (`workload::irregular_ops`) and MNIST 784-h-10 (`workload::mnist_graph`). Each process
//! runs one compile; the modes take turns run by run, and every figure is a median.
//!
//! cargo run --release --example cache_times -- [--runs 5] [--ops 10000] [--hidden 50]
//!     [--level O2]

#[path = "../benches/common/workload.rs"]
mod workload;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use clap::Parser;
use tapejit::{Cache, Graph, Jit, OptLevel};

/// Compile wall time with the cache off, cold and warm, each in a fresh process.
#[derive(Parser)]
#[command(name = "cache_times")]
struct Options {
    /// Runs per row (the median is reported)
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Operations of the irregular graph
    #[arg(long, default_value_t = 10_000)]
    ops: usize,
    /// Hidden units of the MNIST MLP 784-h-10
    #[arg(long, default_value_t = workload::HIDDEN)]
    hidden: usize,
    /// The optimization level
    #[arg(long, default_value = "O2")]
    level: OptLevel,
    /// (A child process: the mode, `off` or a cache directory)
    #[arg(long, hide = true)]
    child: Option<String>,
    /// (A child process: `irregular` or `mnist`)
    #[arg(long, hide = true)]
    workload: Option<String>,
}

/// What one child process measured.
#[derive(Clone, Copy, Default)]
struct Measured {
    compile_secs: f64,
    schedule_secs: f64,
    hits: usize,
    misses: usize,
    modules: usize,
}

fn build(o: &Options, workload: &str, g: &Graph) {
    match workload {
        "irregular" => workload::irregular_ops(g, o.ops, 1),
        _ => workload::mnist_graph(g, o.hidden),
    }
}

/// The child's side: builds the graph, compiles it once, prints what it measured.
fn child(o: &Options, mode: &str, workload: &str) {
    let g = Graph::new();
    build(o, workload, &g);
    let cache = match mode {
        "off" => Cache::Off,
        dir => Cache::Dir(dir.into()),
    };
    let start = Instant::now();
    let jit = Jit::builder()
        .opt_level(o.level)
        .cache(cache)
        .compile(&g)
        .unwrap();
    let secs = start.elapsed().as_secs_f64();
    let s = jit.stats();
    println!(
        "MEASURED {secs} {} {} {} {}",
        s.schedule_secs, s.cache_hits, s.cache_misses, s.modules
    );
}

fn spawn(o: &Options, mode: &str, workload: &str) -> Measured {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--child", mode, "--workload", workload])
        .args([
            "--ops",
            &o.ops.to_string(),
            "--hidden",
            &o.hidden.to_string(),
        ])
        .args(["--level", &o.level.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text.lines().find_map(|l| l.strip_prefix("MEASURED "));
    let line = line.unwrap_or_else(|| panic!("child failed: {text}"));
    let f: Vec<&str> = line.split(' ').collect();
    Measured {
        compile_secs: f[0].parse().unwrap(),
        schedule_secs: f[1].parse().unwrap(),
        hits: f[2].parse().unwrap(),
        misses: f[3].parse().unwrap(),
        modules: f[4].parse().unwrap(),
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let o = Options::parse();
    if let (Some(mode), Some(workload)) = (&o.child, &o.workload) {
        return child(&o, mode, workload);
    }
    let dir: PathBuf =
        std::env::temp_dir().join(format!("tapejit-cache-times-{}", std::process::id()));
    let workloads = [
        ("irregular", format!("irregular, {} ops", o.ops)),
        ("mnist", format!("MNIST 784-{}-10", o.hidden)),
    ];
    let modes = ["off", "cold", "warm"];
    // [workload][mode] -> runs
    let mut runs = vec![vec![Vec::<Measured>::new(); modes.len()]; workloads.len()];
    for run in 0..o.runs {
        for (w, (workload, name)) in workloads.iter().enumerate() {
            let _ = std::fs::remove_dir_all(&dir);
            for (m, mode) in modes.iter().enumerate() {
                let arg = match *mode {
                    "off" => "off".to_string(),
                    _ => dir.display().to_string(),
                };
                let measured = spawn(&o, &arg, workload);
                eprintln!(
                    "run {run} {name} {mode}: {:.3} s, planning {:.3} s ({} hits, {} misses of {} modules)",
                    measured.compile_secs,
                    measured.schedule_secs,
                    measured.hits,
                    measured.misses,
                    measured.modules
                );
                runs[w][m].push(measured);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    // (Planning: `JitStats::schedule_secs`, from the tape to the plan; with the cache on, the
    // tape's key too.)
    println!(
        "| workload ({}) | cache off | cold | warm | planning, off | planning, warm |",
        o.level
    );
    println!("|---|--:|--:|--:|--:|--:|");
    for (w, (_, name)) in workloads.iter().enumerate() {
        let secs = |m: usize| median(runs[w][m].iter().map(|r| r.compile_secs).collect());
        let planning = |m: usize| median(runs[w][m].iter().map(|r| r.schedule_secs).collect());
        println!(
            "| {name} | {:.3} s | {:.3} s | {:.3} s | {:.3} s | {:.3} s |",
            secs(0),
            secs(1),
            secs(2),
            planning(0),
            planning(2),
        );
    }
    println!("(medians of {} runs; a fresh process per compile)", o.runs);
}
