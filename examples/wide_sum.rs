//! Compile time of one wide node: a single `sum` of `n` operands that loop recovery cannot
//! roll (inputs picked at random), at O2. The plan cuts the sum into parts across
//! functions, so compile time stays linear in the operand count: the last column (each
//! size's median compile time over the first size's) grows like the operand count.
//!
//! `cargo run --release --example wide_sum -- [--repeats R] [--threads T] [N]...` (default:
//! 50000 100000 200000, 3 repeats, one compile thread per core). Each size is compiled `R` times, the sizes taking turns, and every
//! column is a median (the machines are shared and noisy: one compile swings by 10%).

#[path = "common/cli.rs"]
#[allow(dead_code)]
mod cli;
#[path = "common/table.rs"]
mod table;

use clap::Parser;
use rand::{rngs::StdRng, Rng, SeedableRng};
use tapejit::{Graph, Jit, JitStats, OptLevel, Tiering};

/// Compile time of one wide `sum` node at O2, for each operand count.
#[derive(Parser)]
#[command(name = "wide_sum")]
struct Options {
    /// Compiles per size, the sizes taking turns
    #[arg(long, default_value_t = 3, value_parser = cli::positive::<usize>)]
    repeats: usize,
    /// Compile threads (0: one per core)
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Operand counts
    #[arg(default_values_t = [50_000, 100_000, 200_000])]
    sizes: Vec<usize>,
}

fn main() {
    let Options {
        repeats,
        threads,
        sizes,
    } = Options::parse();
    let graphs: Vec<Graph> = sizes.iter().map(|&n| wide_sum(n)).collect();
    let mut runs: Vec<Vec<JitStats>> = vec![Vec::new(); sizes.len()];
    for r in 0..repeats {
        for (i, g) in graphs.iter().enumerate() {
            eprintln!("repeat {}/{repeats}: {} operands", r + 1, sizes[i]);
            let jit = Jit::builder()
                .tiering(Tiering::Off)
                .opt_level(OptLevel::O2)
                .compile_threads(threads)
                .compile(g)
                .unwrap();
            runs[i].push(jit.stats().clone());
        }
    }
    println!(
        "Commit {}, O2, {} compile threads, median of {repeats} compiles per size.\n",
        table::code_version().unwrap_or_else(|| "(no git)".into()),
        runs[0][0].compile_threads
    );
    println!(
        "| operands | tape nodes | functions | IR s | optimize s | codegen s | compile s | \
         us per operand | x first size |"
    );
    println!("|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    let median_of = |stats: &[JitStats], f: fn(&JitStats) -> f64| {
        table::median(&stats.iter().map(f).collect::<Vec<_>>())
    };
    let first = median_of(&runs[0], JitStats::total_secs);
    for (n, stats) in sizes.iter().zip(&runs) {
        let secs = median_of(stats, JitStats::total_secs);
        println!(
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.2} |",
            table::thousands(n),
            table::thousands(stats[0].tape_nodes),
            table::thousands(stats[0].functions),
            median_of(stats, |s| s.ir_build_secs),
            median_of(stats, |s| s.optimize_secs),
            median_of(stats, |s| s.codegen_secs),
            secs,
            table::significant(secs / *n as f64 * 1e6),
            secs / first
        );
    }
}

/// One `sum` of `n` inputs out of 1000, picked at random.
fn wide_sum(n: usize) -> Graph {
    let g = Graph::new();
    let x = g.inputs(1000);
    let mut rng = StdRng::seed_from_u64(n as u64);
    let terms: Vec<_> = (0..n).map(|_| x[rng.gen_range(0..1000)]).collect();
    g.set_loss(g.sum(&terms)).unwrap();
    g
}
