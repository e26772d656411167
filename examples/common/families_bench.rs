//! The graph-families benchmark (issue #10), shared by `examples/families` (the table alone,
//! with its flags) and `examples/report` (the table as a section of the report): each
//! family of benches/common/families.rs at several sizes, compiled, checked against the
//! interpreter, and timed beside its hand-written yardstick. The including file declares
//! the modules this one uses (`families`, `table`, `workload`, `yardsticks`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::families::{Attention, Dag, Family, Lstm, Minibatch, Moons, NBody, Rnn, Springs};
use super::table::{code_version, median, significant, thousands};
use super::workload;
use super::yardsticks::{self, Yardstick};
use tapejit::{Graph, Interpreter, Jit, JitStats, OptLevel, Program, Tiering};

pub const FAMILIES: [&str; 8] = [
    "moons",
    "minibatch",
    "rnn",
    "springs",
    "dag",
    "attention",
    "lstm",
    "nbody",
];
/// Steps taken from the initial params before comparing params with the interpreter's.
const AGREE_STEPS: usize = 3;
/// A timed run lasts at least this long.
const MIN_RUN_SECS: f64 = 0.2;
/// A compile faster than this is repeated (3 times in all) and its median reported. (Two
/// seconds, not one: the first compile in a process pays for fresh pages, and minibatch
/// B = 128 took 1.1 s first and 0.5 s after, so its row flipped between the two kinds.)
const REPEAT_BELOW_SECS: f64 = 2.0;

/// What to measure.
pub struct Settings {
    /// Fewer sizes (moons; B = 1, 8; T = 50, 200; 5,000 DAG nodes) and 3 timed runs.
    pub quick: bool,
    /// The families to measure, by name (of [`FAMILIES`]).
    pub families: Vec<String>,
    /// Compile with loop recovery off only up to this many tape nodes.
    pub straight_max: usize,
    /// MNIST for the minibatch rows (synthetic samples if absent).
    pub data: PathBuf,
    /// Timed runs per row.
    pub runs: usize,
    /// A Python with jax and numpy, to run JAX's steps beside the table (moons and the math
    /// families, those measured).
    pub jax: Option<PathBuf>,
}

impl Settings {
    /// Every family, at the quick or the full sizes, with MNIST from `data`.
    pub fn new(quick: bool, data: PathBuf) -> Settings {
        Settings {
            quick,
            families: FAMILIES.iter().map(|f| f.to_string()).collect(),
            straight_max: if quick { 50_000 } else { 200_000 },
            data,
            runs: if quick { 3 } else { 5 },
            jax: None,
        }
    }
}

/// The families' table with its notes (and JAX's line, if asked), and whether the JIT
/// matched the interpreter bit for bit on every row. Progress goes to stderr.
pub fn report(o: &Settings) -> (String, bool) {
    let measured: Vec<Row> = rows(o).iter().map(|f| measure(f, o)).collect();
    let mut report = table(&measured);
    let _ = writeln!(
        report,
        "\nO2, strict mode, commit {}; {} timed runs per row (median), every run from the \
         initial params; agreement after {AGREE_STEPS} steps; loops off compiled up to {} tape \
         nodes. `interpreter / JIT` is the JIT's speedup; `JIT / yardstick` its time relative \
         to the hand-written step (below 1: the JIT is faster). `loop nodes`: tape nodes the \
         loops cover (in parentheses: their share of the operations, `JitStats::coverage`; \
         params, inputs and constants are not operations).",
        code_version().unwrap_or_else(|| "unknown".into()),
        o.runs,
        thousands(o.straight_max)
    );
    if let Some(python) = &o.jax {
        if o.families.iter().any(|f| f == "moons") {
            let _ = writeln!(report, "\n{}", jax_moons(python));
        }
        for name in ["attention", "lstm", "nbody"] {
            if o.families.iter().any(|f| f == name) {
                let _ = writeln!(report, "\n{}", jax_math_family(python, name));
            }
        }
    }
    (report, measured.iter().all(|r| r.jit_agrees))
}

/// The rows: every size of every family asked for.
fn rows(o: &Settings) -> Vec<Family> {
    let pick = |full: &[usize], quick: usize| -> Vec<usize> {
        full[..if o.quick { quick } else { full.len() }].to_vec()
    };
    let mut rows = Vec::new();
    for name in &o.families {
        match name.as_str() {
            "moons" => rows.push(Family::Moons(Moons::demo())),
            "minibatch" => {
                let batches = pick(&[1, 8, 32, 128], 2);
                let most = batches.iter().copied().max().unwrap_or(0);
                let samples = match workload::Samples::mnist(&o.data, most) {
                    Ok(s) => s.inputs,
                    Err(e) => {
                        eprintln!("{e}; the minibatch rows use synthetic samples");
                        Minibatch::synthetic_samples(784, 10, most, 1)
                    }
                };
                for b in batches {
                    rows.push(Family::Minibatch(Minibatch::mnist(samples[..b].to_vec())));
                }
            }
            "rnn" => rows.extend(
                pick(&[50, 200, 1000], 2)
                    .into_iter()
                    .map(|t| Family::Rnn(Rnn::new(t))),
            ),
            "springs" => rows.extend(
                pick(&[50, 200, 1000], 2)
                    .into_iter()
                    .map(|t| Family::Springs(Springs::new(t))),
            ),
            "dag" => rows.extend(
                pick(&[5_000, 20_000], 1)
                    .into_iter()
                    .map(|n| Family::Dag(Dag::new(n))),
            ),
            "attention" => rows.push(Family::Attention(Attention::demo())),
            "lstm" => rows.push(Family::Lstm(Lstm::demo())),
            "nbody" => rows.push(Family::NBody(NBody::demo())),
            _ => unreachable!("checked by parse_options"),
        }
    }
    rows
}

/// What trains: a tape backend or a yardstick.
enum Trainer {
    Program(Box<dyn Program>),
    Yardstick(Box<dyn Yardstick>),
}

impl Trainer {
    fn reset(&mut self, init: &[f64]) {
        match self {
            Trainer::Program(p) => p.set_params(init).expect("the initial params"),
            Trainer::Yardstick(y) => y.set_params(init),
        }
    }
    fn step(&mut self, inputs: &[f64], lr: f64) -> f64 {
        match self {
            Trainer::Program(p) => p.step(inputs, lr).expect("the family's inputs"),
            Trainer::Yardstick(y) => y.step(lr),
        }
    }
    fn params(&self) -> Vec<f64> {
        match self {
            Trainer::Program(p) => p.params(),
            Trainer::Yardstick(y) => y.params(),
        }
    }
}

/// One contestant of a row: its trainer, steps per timed run, and the times.
struct Contestant {
    name: &'static str,
    trainer: Trainer,
    steps_per_run: usize,
    us: Vec<f64>,
}

/// A measured row.
struct Row {
    family: String,
    size: String,
    nodes: usize,
    /// Loop recovery on: stats and median compile seconds.
    loops: (JitStats, f64),
    /// Loop recovery off, if compiled.
    straight: Option<(JitStats, f64)>,
    /// Median us/step per contestant.
    interp_us: f64,
    jit_us: f64,
    straight_us: Option<f64>,
    yard_us: Option<f64>,
    /// The JIT (both lowerings) ended at the interpreter's params bit for bit.
    jit_agrees: bool,
    /// The yardstick's largest relative difference to the interpreter's params (0: bit for bit).
    yard_diff: Option<f64>,
}

/// Compiles `g` at O2 (repeated while fast); the last program, its stats, the median seconds.
fn compile(g: &Graph, loops: bool, label: &str) -> (Jit, JitStats, f64) {
    let builder = Jit::builder()
        .tiering(Tiering::Off)
        .opt_level(OptLevel::O2)
        .loop_recovery(loops);
    let mut secs = Vec::new();
    let mut jit: Option<Jit> = None;
    while secs.len() < 3 {
        drop(jit.take());
        let start = Instant::now();
        let j = builder.compile(g).expect("the family compiles");
        let s = start.elapsed().as_secs_f64();
        eprintln!(
            "  {label}: compile {}: {s:.3} s (IR {:.3} s, optimize {:.3} s, codegen {:.3} s)",
            secs.len() + 1,
            j.stats().ir_build_secs,
            j.stats().optimize_secs,
            j.stats().codegen_secs
        );
        secs.push(s);
        jit = Some(j);
        if s >= REPEAT_BELOW_SECS {
            break;
        }
    }
    let jit = jit.expect("one compile");
    let stats = jit.stats().clone();
    (jit, stats, median(&secs))
}

fn largest_relative_difference(got: &[f64], want: &[f64]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&a, &b)| {
            if a.to_bits() == b.to_bits() {
                0.0
            } else {
                (a - b).abs() / a.abs().max(b.abs()).max(f64::MIN_POSITIVE)
            }
        })
        .fold(0.0, f64::max)
}

fn measure(family: &Family, o: &Settings) -> Row {
    let label = format!("{} {}", family.kind(), family.size());
    eprintln!("{label}: building");
    let g = Graph::new();
    let built = family.build(&g);
    let interp = Interpreter::new(&g).expect("the family builds");
    let init = interp.params();
    let nodes = interp.tape().len();
    eprintln!("{label}: {nodes} tape nodes");

    let (jit, loop_stats, loop_secs) = compile(&g, true, "loops on");
    let straight = (nodes <= o.straight_max).then(|| compile(&g, false, "loops off"));
    let yard = yardsticks::for_family(family, &init, &built.inputs);

    let mut contestants = vec![
        Contestant {
            name: "interpreter",
            trainer: Trainer::Program(Box::new(interp)),
            steps_per_run: 1,
            us: Vec::new(),
        },
        Contestant {
            name: "loops",
            trainer: Trainer::Program(Box::new(jit)),
            steps_per_run: 1,
            us: Vec::new(),
        },
    ];
    let straight_stats = straight.map(|(jit, stats, secs)| {
        contestants.push(Contestant {
            name: "straight",
            trainer: Trainer::Program(Box::new(jit)),
            steps_per_run: 1,
            us: Vec::new(),
        });
        (stats, secs)
    });
    if let Some(y) = yard {
        contestants.push(Contestant {
            name: "yardstick",
            trainer: Trainer::Yardstick(y),
            steps_per_run: 1,
            us: Vec::new(),
        });
    }

    // Agreement, and the warm-up that sizes the timed runs.
    let mut after: Vec<Vec<f64>> = Vec::new();
    for c in &mut contestants {
        let start = Instant::now();
        for _ in 0..AGREE_STEPS {
            c.trainer.step(&built.inputs, built.lr);
        }
        let per_step = start.elapsed().as_secs_f64() / AGREE_STEPS as f64;
        c.steps_per_run = ((MIN_RUN_SECS / per_step.max(1e-9)).ceil() as usize).max(1);
        after.push(c.trainer.params());
    }
    let want = &after[0];
    let mut jit_agrees = true;
    let mut yard_diff = None;
    for (c, got) in contestants.iter().zip(&after).skip(1) {
        if c.name == "yardstick" {
            yard_diff = Some(largest_relative_difference(got, want));
        } else if got
            .iter()
            .map(|x| x.to_bits())
            .ne(want.iter().map(|x| x.to_bits()))
        {
            eprintln!("{label}: {} MISMATCHES the interpreter", c.name);
            jit_agrees = false;
        }
    }

    for run in 1..=o.runs {
        let mut line = format!("{label}: run {run}/{}:", o.runs);
        for c in &mut contestants {
            c.trainer.reset(&init);
            let start = Instant::now();
            for _ in 0..c.steps_per_run {
                c.trainer.step(&built.inputs, built.lr);
            }
            let us = start.elapsed().as_secs_f64() * 1e6 / c.steps_per_run as f64;
            c.us.push(us);
            let _ = write!(line, " {} {us:.1} us", c.name);
        }
        eprintln!("{line}");
    }
    let us = |name: &str| {
        contestants
            .iter()
            .find(|c| c.name == name)
            .map(|c| median(&c.us))
    };
    Row {
        family: family.kind().into(),
        size: family.size(),
        nodes,
        loops: (loop_stats, loop_secs),
        straight: straight_stats,
        interp_us: us("interpreter").expect("an interpreter"),
        jit_us: us("loops").expect("a JIT"),
        straight_us: us("straight"),
        yard_us: us("yardstick"),
        jit_agrees,
        yard_diff,
    }
}

fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| family | size | tape nodes | loops | loop nodes | nest depth | functions | IR instr \
         | O2 compile s | O2 compile s, loops off | interpreter us/step | JIT us/step \
         | JIT loops off us/step | yardstick us/step | interpreter / JIT | JIT / yardstick \
         | JIT = interpreter | yardstick vs interpreter |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|\n",
    );
    let dash = || "—".to_string();
    for r in rows {
        let (s, secs) = &r.loops;
        let cover = 100.0 * s.coverage();
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} ({cover:.0}%) | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}× | {} | {} | {} |",
            r.family,
            r.size,
            thousands(r.nodes),
            thousands(s.loops),
            thousands(s.loop_nodes),
            s.nest_depth,
            thousands(s.functions),
            thousands(s.ir_instructions),
            significant(*secs),
            r.straight
                .as_ref()
                .map_or_else(dash, |(_, secs)| significant(*secs)),
            significant(r.interp_us),
            significant(r.jit_us),
            r.straight_us.map_or_else(dash, significant),
            r.yard_us.map_or_else(dash, significant),
            significant(r.interp_us / r.jit_us),
            r.yard_us
                .map_or_else(dash, |y| format!("{}×", significant(r.jit_us / y))),
            if r.jit_agrees { "ok" } else { "MISMATCH" },
            r.yard_diff.map_or_else(dash, |d| if d == 0.0 {
                "bit".to_string()
            } else {
                format!("{d:.1e}")
            }),
        );
    }
    t
}

/// JAX's jitted moons step measured now, on this machine (its own output line), or why not.
fn jax_moons(python: &Path) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/baselines/jax_moons.py");
    jax_line(python, &script, None)
}

/// JAX's step of math family `name` (`benches/jax/families_math.py`, the same computation
/// from the same numbers), as one line for the report.
fn jax_math_family(python: &Path, name: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/jax/families_math.py");
    jax_line(python, &script, Some(name))
}

/// The last line `script` (with argument `arg`) prints, run by `python`.
fn jax_line(python: &Path, script: &Path, arg: Option<&str>) -> String {
    eprintln!(
        "jax: {} {} {}",
        python.display(),
        script.display(),
        arg.unwrap_or("")
    );
    let mut command = std::process::Command::new(python);
    command.arg(script).args(arg);
    match command.output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let last = text.lines().last().unwrap_or("(no output)");
            let what = arg.map_or(String::new(), |a| format!(" {a}"));
            format!(
                "JAX beside it, same machine, same run (`{}{what}`): {last}",
                script.display()
            )
        }
        Ok(out) => format!(
            "JAX baseline failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => format!("JAX baseline not run: {}: {e}", python.display()),
    }
}
