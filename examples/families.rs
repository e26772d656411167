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
//! per node); a compile under a second is repeated 3 times and its median reported. Then
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
use std::process::ExitCode;
use std::time::Instant;

use families_bench::{Settings, FAMILIES};

const USAGE: &str =
    "usage: families [--quick] [--family NAME]... [--out FILE] [--straight-max NODES] [--data DIR]
                [--jax PYTHON]

  --quick               fewer sizes, 3 timed runs, --straight-max 50000
  --family NAME         moons, minibatch, rnn, springs or dag (repeatable; default all)
  --out FILE            also write the table (markdown) to FILE
  --straight-max NODES  compile with loop recovery off only up to this many tape nodes
                        (default 200000)
  --data DIR            MNIST for the minibatch rows (default data/mnist of this package;
                        synthetic samples if absent)
  --jax PYTHON          after the table, run JAX's moons step (../shared/baselines/jax_moons.py)
                        with this Python (one with jax and numpy; scripts/setup-jax makes one)
                        and append its compile time and us/step";

struct Options {
    settings: Settings,
    out: Option<PathBuf>,
}

fn parse_options() -> Result<Options, String> {
    let mut quick = false;
    let mut families = Vec::new();
    let mut out = None;
    let mut data = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mnist");
    let mut jax = None;
    let mut straight_max = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--help" | "-h" => return Err(String::new()),
            "--quick" => quick = true,
            "--family" => {
                let v = value()?;
                if !FAMILIES.contains(&v.as_str()) {
                    return Err(format!("--family {v}: expected one of {FAMILIES:?}"));
                }
                families.push(v);
            }
            "--out" => out = Some(value()?.into()),
            "--data" => data = value()?.into(),
            "--jax" => jax = Some(value()?.into()),
            "--straight-max" => {
                let v = value()?;
                straight_max = Some(
                    v.parse()
                        .map_err(|_| format!("--straight-max {v}: expected a number"))?,
                );
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    let mut settings = Settings::new(quick, data);
    if !families.is_empty() {
        settings.families = families;
    }
    if let Some(max) = straight_max {
        settings.straight_max = max;
    }
    settings.jax = jax;
    Ok(Options { settings, out })
}

fn main() -> ExitCode {
    let o = match parse_options() {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("families: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
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
