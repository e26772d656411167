//! The structure-recovery benchmark (issue #10): the graph families of
//! benches/common/families.rs at several sizes, on one table: tape size, what loop recovery
//! made of it (`JitStats`), O2 compile time with loop recovery on and off, the time of one
//! training step on the interpreter, the JIT (loops on and off) and the hand-written yardstick
//! (benches/common/yardsticks.rs), and whether they all agree.
//!
//! cargo run --release --example families -- [--quick] [--family NAME]... [--out FILE]
//!     [--straight-max NODES] [--data DIR]
//!
//! Per row: the graph is built once; the JIT (O2) is compiled with loop recovery on, and off
//! when the tape has at most `--straight-max` nodes (straight-line O2 compile costs ~200-500 us
//! per node); a compile under two seconds is repeated 3 times and its median reported. Then
//! every contestant takes `AGREE_STEPS` steps from the initial params, and its params are
//! compared with the interpreter's: the JIT's must be the same bit for bit (`ok`, else
//! `MISMATCH`), the yardstick's are reported as `bit` or as their largest relative difference.
//! Then each timed run starts every contestant from the initial params (untimed) and times
//! enough steps to last `MIN_RUN_SECS`, the contestants taking turns, 5 runs (`--quick`: 3);
//! the table has the medians. Every step repeats the family's one step of data. Progress goes
//! to stderr, the table to stdout (and to `--out FILE`).
//!
//! `--quick` also measures fewer sizes (moons; B = 1, 8; T = 50, 200; 5,000 DAG nodes) and
//! defaults `--straight-max` to 50,000 instead of 200,000.
//!
//! The families of `exp`, `tanh`, `sigmoid` and `powf` (`attention`, `lstm`, `nbody`; issue
//! #41, benches/common/families_math.rs) have one size each and no yardstick; JAX's step of
//! the same computation from the same numbers is `benches/jax/families_math.py NAME`, which
//! `--jax` runs beside them.

#[path = "../benches/common/families.rs"]
mod families;
#[path = "common/families_bench.rs"]
mod families_bench;
#[path = "common/table.rs"]
mod table;
#[path = "../benches/common/workload.rs"]
mod workload;
#[path = "../benches/common/yardsticks.rs"]
mod yardsticks;

use std::path::{Path, PathBuf};

use clap::Parser;
use std::process::ExitCode;
use std::time::Instant;

use families_bench::{Settings, FAMILIES};

/// The graph families micrograd users write, compiled and run against the interpreter and
/// a hand-written yardstick.
#[derive(Parser)]
#[command(name = "families")]
struct Args {
    /// Fewer sizes, 3 timed runs, --straight-max 50000
    #[arg(long)]
    quick: bool,
    /// A family to run (repeatable; default all)
    #[arg(long = "family", value_name = "NAME", value_parser = FAMILIES)]
    families: Vec<String>,
    /// Also write the table (markdown) to FILE
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Compile with loop recovery off only up to this many tape nodes (default 200000)
    #[arg(long, value_name = "NODES")]
    straight_max: Option<usize>,
    /// MNIST for the minibatch rows (default data/mnist of this package; synthetic samples if
    /// absent)
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// After the table, run JAX's step of moons (../shared/baselines/jax_moons.py) and of the
    /// math families (benches/jax/families_math.py), those measured, with this Python (one
    /// with jax and numpy; scripts/setup-jax makes one) and append their compile times and
    /// us/step
    #[arg(long, value_name = "PYTHON")]
    jax: Option<PathBuf>,
}

struct Options {
    settings: Settings,
    out: Option<PathBuf>,
}

fn parse_options() -> Options {
    let a = Args::parse();
    let data = a
        .data
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist"));
    let mut settings = Settings::new(a.quick, data);
    if !a.families.is_empty() {
        settings.families = a.families;
    }
    if let Some(max) = a.straight_max {
        settings.straight_max = max;
    }
    settings.jax = a.jax;
    Options {
        settings,
        out: a.out,
    }
}

fn main() -> ExitCode {
    let o = parse_options();
    let start = Instant::now();
    let (report, agrees) = families_bench::report(&o.settings);
    print!("{report}");
    eprintln!("total {:.0} s", start.elapsed().as_secs_f64());
    if let Some(path) = &o.out {
        if let Err(e) = std::fs::write(path, &report) {
            eprintln!("families: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if agrees {
        ExitCode::SUCCESS
    } else {
        eprintln!("families: the JIT does not match the interpreter");
        ExitCode::FAILURE
    }
}
