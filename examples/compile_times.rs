//! Compile time and step time of an MNIST-shaped MLP (784-h-10, softmax cross-entropy) at each
//! level: the table in the README. Each row also gives the machine code's size and the
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

use rand::{rngs::StdRng, Rng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program};

fn parse_level(s: &str) -> OptLevel {
    match s {
        "O0" => OptLevel::O0,
        "O1" => OptLevel::O1,
        "O2" => OptLevel::O2,
        "O3" => OptLevel::O3,
        _ => panic!("unknown level {s}; use O0..O3"),
    }
}

/// The process's resident memory in MB (0 where `/proc` is missing).
fn resident_mb() -> f64 {
    status::field("VmRSS:") as f64 * 1024.0 / 1e6
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let hidden: Vec<usize> = opt("--hidden")
        .unwrap_or("25,50,100".into())
        .split(',')
        .map(|h| h.parse().expect("--hidden takes numbers"))
        .collect();
    let levels: Vec<OptLevel> = opt("--levels")
        .unwrap_or("O0,O1,O2,O3".into())
        .split(',')
        .map(parse_level)
        .collect();
    let dags: Vec<usize> = opt("--dag").map_or(Vec::new(), |d| {
        d.split(',')
            .map(|n| n.parse().expect("--dag takes node counts"))
            .collect()
    });
    let hidden = if dags.is_empty() || opt("--hidden").is_some() {
        hidden
    } else {
        Vec::new()
    };
    let steps: usize = opt("--steps").map_or(200, |s| s.parse().expect("--steps"));

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
            let mut b = Jit::builder().opt_level(level);
            if let Some(t) = opt("--threads") {
                b = b.compile_threads(t.parse()?);
            }
            if let Some(c) = opt("--chunk") {
                b = b.chunk_size(c.parse()?);
            }
            match opt("--lowering").as_deref() {
                Some("straight") => b = b.loop_recovery(false),
                Some("fast-math") => b = b.fast_math(true),
                _ => {}
            }
            if let Some(c) = opt("--codegen") {
                b = b.codegen(parse_level(&c));
            }
            if let Some(p) = opt("--pipeline") {
                b = b.pipeline(p);
            }
            let mut jit = b.compile(g)?;
            let resident = resident_mb();
            let got: Vec<f64> = samples
                .iter()
                .take(3)
                .map(|s| jit.step(s, 0.01).unwrap())
                .collect();
            // Exact unless fast-math, which agrees to rounding.
            let fast = opt("--lowering").as_deref() == Some("fast-math");
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
