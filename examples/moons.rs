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
use std::time::{Duration, Instant};

use families::Moons;
use tapejit::{Graph, Interpreter, Jit, OptLevel, Program};

const USAGE: &str = "usage: moons [--interpreter] [--opt O0|O1|O2|O3] [--no-loops]

  --interpreter  run on the reference interpreter instead of the JIT
  --opt LEVEL    the JIT's optimization level (default O2)
  --no-loops     compile straight-line (loop recovery off)";

const STEPS: usize = 100;

struct Options {
    interpreter: bool,
    level: OptLevel,
    loops: bool,
}

fn parse_options() -> Result<Options, String> {
    let mut o = Options {
        interpreter: false,
        level: OptLevel::O2,
        loops: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--help" | "-h" => return Err(String::new()),
            "--interpreter" => o.interpreter = true,
            "--no-loops" => o.loops = false,
            "--opt" => {
                let v = args.next().ok_or("--opt needs a value")?;
                o.level = OptLevel::ALL
                    .into_iter()
                    .find(|l| l.to_string() == v)
                    .ok_or_else(|| format!("--opt {v}: expected O0, O1, O2 or O3"))?;
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

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
            .opt_level(o.level)
            .loop_recovery(o.loops)
            .compile(&g)?;
        let lowering = if o.loops { "loops" } else { "straight-line" };
        (Box::new(jit), format!("JIT {} {lowering}", o.level))
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
    let o = match parse_options() {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("moons: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&o) {
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
