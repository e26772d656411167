//! The optimized IR of every workload the report measures, one file per program, for changes
//! that must not change the generated code (a refactor: `diff -r` two snapshots).
//!
//! cargo run --release --example ir_snapshot -- DIR
//!
//! Each program is compiled with `JitBuilder::keep_ir`, then runs what links lazily
//! (`train`, `train_minibatches` on one thread and on two) on a few synthetic samples, so the
//! file holds every module the program ever links. The workloads: the MNIST classifier
//! (784-50-10) in every JIT mode of `workload::modes()`, and the graph families at
//! `examples/families`' quick sizes at O0 and O2, with loop recovery on and off.

#[path = "../benches/common/families.rs"]
mod families;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;

use families::{Dag, Family, Minibatch, Moons, Rnn, Springs};
use tapejit::{Graph, Jit, JitBuilder, OptLevel, Program, Tiering};
use workload::{Engine, INPUTS};

/// Samples run through the lazily linked entry points.
const SAMPLES: usize = 4;

fn main() -> ExitCode {
    let Some(dir) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: ir_snapshot DIR");
        return ExitCode::FAILURE;
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let mut programs = Vec::new();
    for mode in workload::modes() {
        if let Engine::Jit(builder) = mode.engine {
            programs.push((format!("mnist {}", mode.name), builder, None));
        }
    }
    let families = [
        Family::Moons(Moons::demo()),
        Family::Minibatch(Minibatch::mnist(Minibatch::synthetic_samples(
            INPUTS, 10, 8, 1,
        ))),
        Family::Rnn(Rnn::new(50)),
        Family::Springs(Springs::new(50)),
        Family::Dag(Dag::new(2_000)),
    ];
    for family in families {
        for level in [OptLevel::O0, OptLevel::O2] {
            for loops in [true, false] {
                let name = format!(
                    "{} {} {level}{}",
                    family.kind(),
                    family.size(),
                    if loops { "" } else { " straight-line" }
                );
                let builder = Jit::builder()
                    .tiering(Tiering::Off)
                    .opt_level(level)
                    .loop_recovery(loops);
                programs.push((name, builder, Some(family.clone())));
            }
        }
    }
    for (name, builder, family) in programs {
        let file = dir.join(format!(
            "{}.ll",
            name.replace([' ', '/', '(', ')', ','], "_")
        ));
        match snapshot(builder, family.as_ref()) {
            Ok(ir) => {
                if let Err(e) = std::fs::write(&file, ir) {
                    eprintln!("cannot write {}: {e}", file.display());
                    return ExitCode::FAILURE;
                }
                eprintln!("{name}: {}", file.display());
            }
            Err(e) => {
                eprintln!("{name}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}

/// Compiles the workload (the MNIST classifier without a family), runs its lazy entry points
/// and returns the IR of every module it linked.
fn snapshot(builder: JitBuilder, family: Option<&Family>) -> tapejit::Result<String> {
    let g = Graph::new();
    let (sample, lr) = match family {
        Some(f) => {
            let built = f.build(&g);
            (built.inputs, built.lr)
        }
        None => {
            workload::mnist_graph(&g, 50);
            let mut sample: Vec<f64> = (0..INPUTS).map(|i| (i % 7) as f64 / 7.0).collect();
            sample.extend((0..10).map(|c| if c == 3 { 1.0 } else { 0.0 }));
            (sample, 0.01)
        }
    };
    let mut jit = builder.keep_ir(true).compile(&g)?;
    let inputs: Vec<f64> = sample
        .iter()
        .cycle()
        .take(sample.len() * SAMPLES)
        .copied()
        .collect();
    jit.train(&inputs, lr)?;
    if jit.tape().loss().is_some() {
        jit.train_minibatches(&inputs, 2, lr, 1)?;
        jit.train_minibatches(&inputs, 2, lr, 2)?;
    }
    jit.ir()
}
