//! micrograd's `demo.ipynb` end to end on tapejit: make_moons data (100 points, noise 0.1),
//! `MLP(2, [16, 16, 1])` with micrograd's init, the full batch as one MLP copy per point
//! sharing the params, max-margin loss plus 1e-4 L2, and 100 steps of SGD at
//! `lr = 1.0 - 0.9 k / 100`, printing loss and accuracy each step as the notebook does. The
//! graph is built once and compiled once (the family `moons` of benches/common/families.rs).
//!
//! cargo run --release --example moons -- [--interpreter] [--opt O0|O1|O2|O3] [--no-loops]
//!
//! The data come from a seeded generator, not scikit-learn's, so the numbers differ from the
//! notebook's (`step 0 loss 0.8958..., accuracy 50.0%`); the course does not. Compile time and
//! the median time per step go to the end.

#[path = "../benches/common/families.rs"]
mod families;
#[path = "../benches/common/workload.rs"]
mod workload;

use std::process::ExitCode;

use clap::Parser;
use std::time::{Duration, Instant};

use families::Moons;
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program};

/// micrograd's demo.ipynb: moons, MLP(2, [16, 16, 1]), 100 full-batch steps.
#[derive(Parser)]
#[command(name = "moons")]
struct Options {
    /// Run on the reference interpreter instead of the JIT
    #[arg(long)]
    interpreter: bool,
    /// The JIT's optimization level
    #[arg(long, default_value = "O2")]
    opt: OptLevel,
    /// Compile straight-line (loop recovery off)
    #[arg(long)]
    no_loops: bool,
}

const STEPS: usize = 100;

fn accuracy(scores: &[f64], labels: &[f64]) -> f64 {
    let correct = scores
        .iter()
        .zip(labels)
        .filter(|(s, y)| (**s > 0.0) == (**y > 0.0))
        .count();
    100.0 * correct as f64 / labels.len() as f64
}

fn run(o: &Options) -> Result<bool, Box<dyn std::error::Error>> {
    let moons = Moons::demo();
    let g = Graph::new();
    let built = moons.build(&g);
    let (_, labels) = moons.data();

    let start = Instant::now();
    let (mut program, backend): (Box<dyn Program>, String) = if o.interpreter {
        (Box::new(Interpreter::new(&g)?), "interpreter".into())
    } else {
        let jit = Jit::builder()
            .opt_level(o.opt)
            .loop_recovery(!o.no_loops)
            .compile(&g)?;
        let lowering = if o.no_loops { "straight-line" } else { "loops" };
        (Box::new(jit), format!("JIT {} {lowering}", o.opt))
    };
    let compile = start.elapsed();
    println!(
        "moons: {} points, MLP(2, {:?}), {} params, {} tape nodes, {backend}",
        moons.points,
        moons.layers,
        program.params().len(),
        program.tape().len()
    );

    let mut times = Vec::with_capacity(STEPS);
    for k in 0..STEPS {
        let start = Instant::now();
        let loss = program.step(&built.inputs, Moons::lr(k))?;
        times.push(start.elapsed());
        // The scores of this step's forward (before its update), as the notebook prints.
        let acc = accuracy(&program.outputs(), &labels);
        println!("step {k} loss {loss}, accuracy {acc:.1}%");
    }
    let loss = program.forward();
    let acc = accuracy(&program.outputs(), &labels);
    println!("after {STEPS} steps: loss {loss}, accuracy {acc:.1}%");

    times.sort();
    let median: Duration = times[STEPS / 2];
    let compiled = if o.interpreter { "built" } else { "compiled" };
    println!(
        "{compiled} in {:.3} s; median {:.1} us/step over {STEPS} steps",
        compile.as_secs_f64(),
        median.as_secs_f64() * 1e6
    );
    Ok(acc == 100.0)
}

fn main() -> ExitCode {
    match run(&Options::parse()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("moons: did not reach 100% accuracy");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("moons: {e}");
            ExitCode::FAILURE
        }
    }
}
