//! Compile time and step time of an MNIST-shaped MLP (784-h-10, softmax cross-entropy) at each
//! level: the table in docs/benchmarks.md. Each row also gives the machine code's size and the
//! process's resident memory right after compiling (`VmRSS`, with the row's `Jit` live).
//! `--dag N,...` measures random irregular DAGs of N nodes instead (`workload::random_dag`:
//! nothing for loop recovery to find, the straight-line worst case).
//!
//! cargo run --release --example compile_times -- [--hidden 25,50,100 | --dag 1000,5000]
//!     [--levels O0,O1,O2,O3] [--chunk N] [--pipeline P] [--codegen O0..O3]
//!     [--lowering loops|straight] [--steps N] [--threads N]

#[path = "common/status.rs"]
mod status;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::time::Instant;

use clap::Parser;

use rand::{rngs::StdRng, Rng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program, Tiering};

/// Compile time and step time of an MNIST-shaped MLP at each level (or of random DAGs).
#[derive(Parser)]
#[command(name = "compile_times")]
struct Options {
    /// Hidden sizes of the MLPs 784-h-10 (default 25,50,100 unless --dag is given)
    #[arg(long, value_delimiter = ',')]
    hidden: Vec<usize>,
    /// Node counts of random irregular DAGs to measure instead
    #[arg(long, value_delimiter = ',')]
    dag: Vec<usize>,
    /// The levels, each a row
    #[arg(long, value_delimiter = ',', default_value = "O0,O1,O2,O3")]
    levels: Vec<OptLevel>,
    /// JitBuilder::chunk_size
    #[arg(long)]
    chunk: Option<usize>,
    /// JitBuilder::pipeline (an LLVM pass pipeline)
    #[arg(long)]
    pipeline: Option<String>,
    /// JitBuilder::codegen (the code-generation level)
    #[arg(long)]
    codegen: Option<OptLevel>,
    /// Loops recovered (the default), straight-line, or loops with fast-math
    #[arg(long, default_value = "loops", value_parser = ["loops", "straight", "fast-math"])]
    lowering: String,
    /// Samples per step-time measurement
    #[arg(long, default_value_t = 200)]
    steps: usize,
    /// JitBuilder::compile_threads (0: one per core)
    #[arg(long)]
    threads: Option<usize>,
}

/// The process's resident memory in MB (0 where `/proc` is missing).
fn resident_mb() -> f64 {
    status::field("VmRSS:") as f64 * 1024.0 / 1e6
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = Options::parse();
    let hidden = match (o.hidden.is_empty(), o.dag.is_empty()) {
        (true, true) => vec![25, 50, 100],
        _ => o.hidden.clone(),
    };
    let (levels, dags) = (o.levels.clone(), o.dag.clone());
    let steps = o.steps;

    // (name, graph, samples): the models measured.
    let mut models = Vec::new();
    for &h in &hidden {
        let g = Graph::new();
        let mut rng = StdRng::seed_from_u64(1);
        Classifier::new(&g, 784, &[h], 10, &mut rng)?;
        let samples: Vec<Vec<f64>> = (0..16)
            .map(|i| {
                let mut s: Vec<f64> = (0..784).map(|_| rng.gen_range(0.0..1.0)).collect();
                s.extend((0..10).map(|k| if k == i % 10 { 1.0 } else { 0.0 }));
                s
            })
            .collect();
        models.push((format!("784-{h}-10"), g, samples));
    }
    for &n in &dags {
        let g = Graph::new();
        workload::random_dag(&g, n, 1);
        let mut rng = StdRng::seed_from_u64(2);
        let width = Interpreter::new(&g)?.tape().num_inputs();
        let samples = (0..16)
            .map(|_| (0..width).map(|_| rng.gen_range(-1.0..1.0)).collect())
            .collect();
        models.push((format!("dag {n}"), g, samples));
    }

    println!("| model | level | tape nodes | loops | functions | IR instr | build s | optimize s | codegen s | total s | code MB | resident MB | us/step |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (name, g, samples) in &models {
        let mut interp = Interpreter::new(g)?;
        let reference: Vec<f64> = samples
            .iter()
            .take(3)
            .map(|s| interp.step(s, 0.01).unwrap())
            .collect();
        for &level in &levels {
            let mut b = Jit::builder().tiering(Tiering::Off).opt_level(level);
            if let Some(t) = o.threads {
                b = b.compile_threads(t);
            }
            if let Some(c) = o.chunk {
                b = b.chunk_size(c);
            }
            match o.lowering.as_str() {
                "straight" => b = b.loop_recovery(false),
                "fast-math" => b = b.fast_math(true),
                _ => {}
            }
            if let Some(c) = o.codegen {
                b = b.codegen(c);
            }
            if let Some(p) = &o.pipeline {
                b = b.pipeline(p.clone());
            }
            let mut jit = b.compile(g)?;
            let resident = resident_mb();
            let got: Vec<f64> = samples
                .iter()
                .take(3)
                .map(|s| jit.step(s, 0.01).unwrap())
                .collect();
            // Exact unless fast-math, which agrees to rounding.
            let fast = o.lowering == "fast-math";
            for (g, r) in got.iter().zip(&reference) {
                let agree = if fast {
                    ((g - r) / r).abs() < 1e-9
                } else {
                    g.to_bits() == r.to_bits()
                };
                assert!(agree, "JIT {g:?} and interpreter {r:?} disagree");
            }
            let start = Instant::now();
            for i in 0..steps {
                jit.step(&samples[i % samples.len()], 0.01)?;
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / steps as f64;
            let s = jit.stats();
            println!(
                "| {name} | {level} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} |",
                s.tape_nodes,
                s.loops,
                s.functions,
                s.ir_instructions,
                s.ir_build_secs,
                s.optimize_secs,
                s.codegen_secs,
                s.total_secs(),
                s.code_bytes as f64 / 1e6,
                resident,
                us
            );
        }
    }
    Ok(())
}
