//! The persistent compile cache (`src/jit/cache/`): a hit runs the bits a compile runs, a
//! changed option misses, a damaged or foreign entry is compiled anew and replaced, processes
//! compiling at once are safe, the least recently used entries go first, and a second process
//! runs no LLVM. Every test uses a directory of its own under the system's temp directory
//! (never the user's cache); the environment variables are tried in child processes, which
//! are this test binary run again with `--exact child` and a mode in the environment.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tapejit::nn::Classifier;
use tapejit::{Cache, Graph, Jit, JitBuilder, JitStats, OptLevel, Program, Tiering};

const NIN: usize = 12;
const CLASSES: usize = 3;

/// A directory of the test's own, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "tapejit-cache-test-{name}-{}-{nanos}",
            std::process::id()
        ));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

/// A classifier 12-13-3 whose params come from `seed` (the structure does not depend on it):
/// `train` merges its first layer, so it has both lazy entry points.
fn classifier(seed: u64) -> Graph {
    let g = Graph::new();
    Classifier::new(&g, NIN, &[13], CLASSES, &mut StdRng::seed_from_u64(seed)).unwrap();
    g
}

/// An irregular graph of `ops` ops (sums, products, tanh, exp) over the newest 12 values,
/// which loop recovery leaves straight-line; `c` is a constant in every product, so graphs
/// of different `c` differ in structure only there.
fn irregular(ops: usize, c: f64) -> Graph {
    let g = Graph::new();
    let mut rng = StdRng::seed_from_u64(5);
    let mut values: Vec<_> = g.inputs(4);
    values.extend((0..8).map(|i| g.param(0.1 * i as f64 - 0.3)));
    for _ in 0..ops {
        let pick = |rng: &mut StdRng| values[values.len() - 1 - rng.gen_range(0..12)];
        let (a, b) = (pick(&mut rng), pick(&mut rng));
        let v = match rng.gen_range(0..4) {
            0 => g.sum([a, b, pick(&mut rng)]),
            1 => a * b * c,
            2 => (a + b).tanh(),
            _ => (a * 0.1).exp() - b,
        };
        values.push(v);
    }
    let last = values[values.len() - 8..].to_vec();
    g.set_loss(g.sum(last.iter().map(|&v| v * v))).unwrap();
    g
}

fn builder() -> JitBuilder {
    // (Native code at once: these tests read its compile's stats.)
    Jit::builder()
        .tiering(Tiering::Off)
        .opt_level(OptLevel::O1)
        .chunk_size(60)
}

fn cached(dir: &Path) -> JitBuilder {
    builder().cache(Cache::Dir(dir.into()))
}

fn samples(n: usize, width: usize) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(9);
    (0..n * width).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

/// What `jit` computes, as bits: losses of a few `step`s, then of `train_minibatches` and
/// `train` where the tape is a classifier (compiling their lazy entry points), and the params.
fn run(jit: &mut Jit) -> Vec<u64> {
    let width = jit.tape().num_inputs();
    let data = samples(8, width);
    let mut out: Vec<f64> = (0..3)
        .map(|i| jit.step(&data[i * width..(i + 1) * width], 0.05).unwrap())
        .collect();
    if jit.stats().merged_train {
        out.extend(jit.train_minibatches(&data, 4, 0.05, 2).unwrap());
        out.extend(jit.train(&data, 0.05).unwrap());
    }
    out.extend(jit.params());
    out.iter().map(|x| x.to_bits()).collect()
}

/// The cache's entries in `dir`, by name.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .map(|listing| listing.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    found.retain(|p| p.extension().is_some_and(|x| x == "tjc"));
    found.sort();
    found
}

/// That `stats` says every module came from the cache and LLVM did no work.
fn assert_all_hits(stats: &JitStats) {
    assert_eq!((stats.cache_hits, stats.cache_misses), (stats.modules, 0));
    assert_eq!((stats.ir_build_secs, stats.optimize_secs), (0.0, 0.0));
}

#[test]
fn a_second_compile_loads_every_module_and_runs_the_same_bits() {
    let dir = TempDir::new("hit");
    for g in [classifier(1), irregular(600, 0.5)] {
        let want = run(&mut builder().cache(Cache::Off).compile(&g).unwrap());
        let mut first = cached(&dir).compile(&g).unwrap();
        let stored = first.stats().clone();
        assert_eq!(stored.cache_dir.as_deref(), Some(&*dir));
        assert_eq!(
            (stored.cache_hits, stored.cache_misses),
            (0, stored.modules)
        );
        assert_eq!(run(&mut first), want);
        let mut second = cached(&dir).compile(&g).unwrap();
        let loaded = second.stats().clone();
        assert_all_hits(&loaded);
        assert_eq!(
            (loaded.functions, loaded.ir_instructions, loaded.code_bytes),
            (stored.functions, stored.ir_instructions, stored.code_bytes)
        );
        assert_eq!(run(&mut second), want);
        // The lazy entry points came from the cache too.
        assert_all_hits(second.stats());
        assert_eq!(second.stats().modules, first.stats().modules);
    }
    let off = builder().cache(Cache::Off).compile(&classifier(1)).unwrap();
    assert_eq!(off.stats().cache_dir, None);
}

/// Params' initial values are the buffers', never the code's: another graph of the same
/// structure hits, and runs as a compile of its own does.
#[test]
fn param_values_are_not_part_of_the_key() {
    let dir = TempDir::new("params");
    cached(&dir).compile(&classifier(1)).unwrap();
    let other = classifier(2);
    let mut jit = cached(&dir).compile(&other).unwrap();
    assert_all_hits(jit.stats());
    let want = run(&mut builder().cache(Cache::Off).compile(&other).unwrap());
    assert_eq!(run(&mut jit), want);
}

#[test]
fn options_that_change_code_miss_and_thread_counts_do_not() {
    let dir = TempDir::new("options");
    let g = irregular(400, 0.5);
    let base = cached(&dir).compile(&g).unwrap().stats().clone();
    for (what, options) in [
        ("opt level", cached(&dir).opt_level(OptLevel::O0)),
        ("chunk size", cached(&dir).chunk_size(90)),
        ("loop recovery", cached(&dir).loop_recovery(false)),
        ("codegen", cached(&dir).codegen(OptLevel::O2)),
    ] {
        let stats = options.compile(&g).unwrap().stats().clone();
        assert_eq!(stats.cache_hits, 0, "{what}");
        assert_eq!(stats.cache_misses, stats.modules, "{what}");
    }
    let threads = cached(&dir).compile_threads(1).compile(&g).unwrap();
    assert_all_hits(threads.stats());
    assert_eq!(threads.stats().modules, base.modules);
    // A program whose IR is kept is not cached.
    let before = entries(&dir);
    let ir = cached(&dir).keep_ir(true).compile(&g).unwrap();
    assert_eq!(ir.stats().cache_dir, None);
    assert_eq!(entries(&dir), before);
}

/// Compiles `g` into `dir`, damages one entry with `damage`, and checks the next compile
/// compiles that module anew (never loads it), runs the same bits, and leaves a whole entry.
fn assert_damage_recompiled(name: &str, damage: impl Fn(&Path, &[PathBuf])) {
    let dir = TempDir::new(name);
    let g = irregular(600, 0.5);
    let want = run(&mut builder().cache(Cache::Off).compile(&g).unwrap());
    let modules = cached(&dir).compile(&g).unwrap().stats().modules;
    assert!(modules >= 2, "{modules} modules");
    let stored = entries(&dir);
    assert_eq!(stored.len(), modules);
    damage(&stored[0], &stored);
    let mut jit = cached(&dir).compile(&g).unwrap();
    assert_eq!(
        (jit.stats().cache_hits, jit.stats().cache_misses),
        (modules - 1, 1),
        "{name}"
    );
    assert_eq!(run(&mut jit), want, "{name}");
    assert_all_hits(cached(&dir).compile(&g).unwrap().stats());
}

#[test]
fn a_corrupt_entry_is_compiled_anew() {
    assert_damage_recompiled("corrupt", |entry, _| {
        let mut bytes = fs::read(entry).unwrap();
        let middle = 100 + (bytes.len() - 100) / 2;
        bytes[middle] ^= 0x10;
        fs::write(entry, bytes).unwrap();
    });
}

#[test]
fn a_truncated_entry_is_compiled_anew() {
    assert_damage_recompiled("truncated", |entry, _| {
        let bytes = fs::read(entry).unwrap();
        fs::write(entry, &bytes[..bytes.len() / 2]).unwrap();
    });
}

#[test]
fn another_keys_entry_is_compiled_anew() {
    assert_damage_recompiled("foreign", |entry, all| {
        fs::copy(&all[1], entry).unwrap();
    });
}

#[test]
fn the_least_recently_used_entries_go_first() {
    let dir = TempDir::new("evict");
    let graphs: Vec<Graph> = [0.5, 0.25, 0.125].map(|c| irregular(300, c)).into();
    // The size of one graph's entries, measured in a directory of its own.
    let one = TempDir::new("evict-one");
    cached(&one).compile(&graphs[0]).unwrap();
    let size = |dir: &Path| -> u64 {
        let sizes = entries(dir)
            .into_iter()
            .map(|e| fs::metadata(e).unwrap().len());
        sizes.sum()
    };
    // Room for two graphs' entries and less than a module's more: so a third graph's
    // store drops every entry of the graph used least recently, and no other.
    let bound = size(&one) * 21 / 10;
    let compile = |g: &Graph| {
        let jit = cached(&dir).cache_size(bound).compile(g).unwrap();
        // (Apart on the clock, however coarse the file system's.)
        std::thread::sleep(Duration::from_millis(50));
        jit.stats().clone()
    };
    compile(&graphs[0]);
    let first = entries(&dir);
    compile(&graphs[1]);
    let second: Vec<PathBuf> = entries(&dir)
        .into_iter()
        .filter(|e| !first.contains(e))
        .collect();
    assert_all_hits(&compile(&graphs[0]));
    compile(&graphs[2]);
    let left = entries(&dir);
    assert!(first.iter().all(|e| left.contains(e)), "used last, kept");
    assert!(second.iter().all(|e| !left.contains(e)), "used least, gone");
    assert!(size(&dir) <= bound);
    assert_eq!(compile(&graphs[2]).cache_hits, left.len() - first.len());
}

/// What a child process reports: its bits, and its stats' cache fields.
#[derive(Debug, PartialEq)]
struct Child {
    bits: Vec<u64>,
    modules: usize,
    hits: usize,
    misses: usize,
    llvm_secs: f64,
    dir: Option<PathBuf>,
}

/// This test binary run again as `child` with `env` set (and `TAPEJIT_CACHE` unset unless
/// `env` sets it), started but not waited for.
fn spawn_child(env: &[(&str, &str)]) -> std::process::Child {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command.args(["--exact", "child", "--nocapture", "--test-threads=1"]);
    command
        .env_remove("TAPEJIT_CACHE")
        .env_remove("TAPEJIT_CACHE_SIZE");
    command.env("TAPEJIT_CACHE_TEST_CHILD", "1");
    command.envs(env.iter().copied());
    command.stdout(std::process::Stdio::piped());
    command.spawn().unwrap()
}

fn wait_child(child: std::process::Child) -> Child {
    let output = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "child failed: {text}");
    // (The harness may print its "test child ..." before it, on the same line.)
    let line = text.lines().find_map(|l| Some(l.split_once("CHILD ")?.1));
    let line = line.unwrap_or_else(|| panic!("no report in {text}"));
    let fields: Vec<&str> = line.split(' ').collect();
    Child {
        bits: fields[0].split(',').map(|b| b.parse().unwrap()).collect(),
        modules: fields[1].parse().unwrap(),
        hits: fields[2].parse().unwrap(),
        misses: fields[3].parse().unwrap(),
        llvm_secs: fields[4].parse().unwrap(),
        dir: (fields[5] != "-").then(|| fields[5].into()),
    }
}

fn run_child(env: &[(&str, &str)]) -> Child {
    wait_child(spawn_child(env))
}

/// The child's side: compiles the classifier (or with `TAPEJIT_CACHE_TEST_GRAPH` set, the
/// irregular graph the threads compile beside it) as the environment says (into
/// `TAPEJIT_CACHE_TEST_DIR` through the builder if set, else by default) and reports.
#[test]
fn child() {
    if std::env::var_os("TAPEJIT_CACHE_TEST_CHILD").is_none() {
        return;
    }
    let options = match std::env::var_os("TAPEJIT_CACHE_TEST_DIR") {
        Some(dir) => builder().cache(Cache::Dir(dir.into())),
        None => builder(),
    };
    let g = match std::env::var_os("TAPEJIT_CACHE_TEST_GRAPH") {
        Some(_) => irregular(BIG, 0.5),
        None => classifier(1),
    };
    let mut jit = options.compile(&g).unwrap();
    let bits = run(&mut jit);
    let s = jit.stats();
    let bits: Vec<String> = bits.iter().map(u64::to_string).collect();
    let dir = s
        .cache_dir
        .as_ref()
        .map_or("-".into(), |d| d.display().to_string());
    println!(
        "CHILD {} {} {} {} {} {dir}",
        bits.join(","),
        s.modules,
        s.cache_hits,
        s.cache_misses,
        s.ir_build_secs + s.optimize_secs,
    );
}

/// Ops of the graph processes compile at once: some 0.3 s to compile, so that they overlap.
const BIG: usize = 3000;

/// Two processes and two threads compile the same graph into one directory at once; all run
/// the same bits, every entry is whole, and a process that comes after runs no LLVM at all.
#[test]
fn processes_at_once_are_safe_and_a_later_process_compiles_nothing() {
    let dir = TempDir::new("processes");
    let env = [
        ("TAPEJIT_CACHE_TEST_DIR", dir.to_str().unwrap()),
        ("TAPEJIT_CACHE_TEST_GRAPH", "irregular"),
    ];
    let g = irregular(BIG, 0.5);
    let g_want = run(&mut builder().cache(Cache::Off).compile(&g).unwrap());
    let children = [(); 2].map(|()| spawn_child(&env));
    let threads: Vec<Vec<u64>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|_| scope.spawn(|| run(&mut cached(&dir).compile(&irregular(BIG, 0.5)).unwrap())))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for child in children {
        assert_eq!(wait_child(child).bits, g_want);
    }
    for bits in threads {
        assert_eq!(bits, g_want);
    }
    let later = run_child(&env);
    assert_eq!(later.bits, g_want);
    assert_eq!((later.hits, later.misses), (later.modules, 0));
    assert_eq!(later.llvm_secs, 0.0);
    assert!(fs::read_dir(&*dir).unwrap().flatten().all(|e| {
        let name = e.file_name();
        name.to_string_lossy().ends_with(".tjc")
    }));
}

/// `TAPEJIT_CACHE` moves the cache or turns it off; the builder's setting wins over it;
/// `TAPEJIT_CACHE_SIZE` bounds it. Two processes that compile the same graph apart write the
/// same entries, byte for byte: the code is a function of the key.
#[test]
fn the_environment_moves_bounds_and_disables_the_cache() {
    let (a, b, c) = (
        TempDir::new("env-a"),
        TempDir::new("env-b"),
        TempDir::new("env-c"),
    );
    let text = |d: &TempDir| d.to_str().unwrap().to_string();
    let moved = run_child(&[("TAPEJIT_CACHE", &text(&a))]);
    assert_eq!(moved.dir.as_deref(), Some(&*a));
    assert_eq!(moved.misses, moved.modules);
    assert_eq!(entries(&a).len(), moved.modules);
    // (`moved` stored its lazy entry points' modules too.)
    let again = run_child(&[("TAPEJIT_CACHE", &text(&a))]);
    assert_eq!(
        (again.hits, again.misses, again.llvm_secs),
        (moved.modules, 0, 0.0)
    );
    assert_eq!(again.bits, moved.bits);
    for off in ["off", "0", ""] {
        let child = run_child(&[("TAPEJIT_CACHE", off)]);
        assert_eq!(
            (child.dir, child.hits, child.misses),
            (None, 0, 0),
            "{off:?}"
        );
    }
    let builder_wins = run_child(&[
        ("TAPEJIT_CACHE", &text(&c)),
        ("TAPEJIT_CACHE_TEST_DIR", &text(&b)),
    ]);
    assert_eq!(builder_wins.dir.as_deref(), Some(&*b));
    assert!(entries(&c).is_empty());
    assert_eq!(entries(&a).len(), entries(&b).len());
    for (x, y) in entries(&a).iter().zip(entries(&b)) {
        assert_eq!(x.file_name(), y.file_name());
        assert_eq!(fs::read(x).unwrap(), fs::read(&y).unwrap(), "{x:?}");
    }
    let bounded = run_child(&[("TAPEJIT_CACHE", &text(&c)), ("TAPEJIT_CACHE_SIZE", "1K")]);
    assert_eq!(bounded.misses, bounded.modules);
    assert!(entries(&c).is_empty(), "every entry is over 1 KiB");
}
