//! Compile time: the MNIST classifier at every JIT mode, and how compile time grows with the
//! graph (784-h-10 classifiers and random non-MLP DAGs).
//!
//! cargo bench --bench compile                       # everything (tens of minutes)
//! cargo bench --bench compile -- compile_mnist      # (a) only
//!
//! Each measurement is one `JitBuilder::compile` of the graph, timed from the call to the
//! returned `Jit`, whose drop is not timed (as in examples/report.rs). Compiles can take
//! seconds, so groups take 10 samples and size their measurement time from one timed compile
//! up front: one compile per sample when compiles are slow, several when they are fast.
//! For the slow ones (O2 straight-line: about 20 s) criterion warns that it cannot complete
//! 10 samples in the measurement time it was given; that is expected, it takes them anyway. The scaling groups report throughput in tape nodes per second:
//! flat throughput across sizes is linear growth.

#[path = "common/workload.rs"]
mod workload;

use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode,
    Throughput,
};
use tapejit::{Graph, Jit, OptLevel, Tiering};
use workload::{Engine, Mode};

const SAMPLES: usize = 10;
const MIN_MEASUREMENT: Duration = Duration::from_secs(3);
/// The levels the scaling groups compile at: the cheapest and the default.
const SCALING_LEVELS: [OptLevel; 2] = [OptLevel::O0, OptLevel::O2];
/// Hidden layer sizes of the 784-h-10 scaling family.
const HIDDEN: [usize; 3] = [10, 25, 50];
/// Node counts of the random-DAG scaling family. Random DAGs compile several times slower
/// per node than the MNIST tape (about 80k nodes), so the family stops at 20k.
const DAG_NODES: [usize; 4] = [2_500, 5_000, 10_000, 20_000];

/// Benchmarks compiling `g` with `mode` as `id` in `group`: one untimed compile sizes the
/// measurement, then every sample is one compile.
fn bench_compile(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    mode: &Mode,
    g: &Graph,
    throughput: bool,
) {
    let start = Instant::now();
    let program = mode.build(g).expect("the graph compiles");
    let once = start.elapsed();
    if throughput {
        group.throughput(Throughput::Elements(program.tape().len() as u64));
    }
    drop(program);
    // Slow compiles: just under one compile per sample (criterion rounds up to 1); fast
    // ones: several per sample for at least MIN_MEASUREMENT in all.
    group.measurement_time((once * SAMPLES as u32).mul_f64(0.8).max(MIN_MEASUREMENT));
    group.bench_function(id, |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                let program = mode.build(g).expect("the graph compiles");
                total += start.elapsed();
                drop(program);
            }
            total
        })
    });
}

fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .sample_size(SAMPLES)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(1));
}

/// (a) The MNIST classifier, 784-50-10, at every JIT mode of the report.
fn compile_mnist(c: &mut Criterion) {
    let g = Graph::new();
    workload::mnist_graph(&g, workload::HIDDEN);
    let mut group = c.benchmark_group("compile_mnist");
    configure(&mut group);
    // A whole-pass mode compiles what its plain mode does.
    for mode in workload::modes().into_iter().filter(|m| !m.whole_pass) {
        if let Engine::Jit(_) = mode.engine {
            bench_compile(
                &mut group,
                BenchmarkId::from_parameter(&mode.name),
                &mode,
                &g,
                false,
            );
        }
    }
    group.finish();
}

/// (c) 784-h-10 classifiers of growing h.
fn compile_scaling_mlp(c: &mut Criterion) {
    let mut group = c.benchmark_group("compile_scaling_mlp");
    configure(&mut group);
    for level in SCALING_LEVELS {
        let mode = Mode::jit(
            level.to_string(),
            Jit::builder().tiering(Tiering::Off).opt_level(level),
        );
        for h in HIDDEN {
            let g = Graph::new();
            workload::mnist_graph(&g, h);
            let id = BenchmarkId::new(level.to_string(), format!("784-{h}-10"));
            bench_compile(&mut group, id, &mode, &g, true);
        }
    }
    group.finish();
}

/// (c) Random DAGs of growing node count: no layers, no repeated structure.
fn compile_scaling_dag(c: &mut Criterion) {
    let mut group = c.benchmark_group("compile_scaling_dag");
    configure(&mut group);
    for level in SCALING_LEVELS {
        let mode = Mode::jit(
            level.to_string(),
            Jit::builder().tiering(Tiering::Off).opt_level(level),
        );
        for nodes in DAG_NODES {
            let g = Graph::new();
            workload::random_dag(&g, nodes, 7);
            let id = BenchmarkId::new(level.to_string(), nodes);
            bench_compile(&mut group, id, &mode, &g, true);
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    compile_mnist,
    compile_scaling_mlp,
    compile_scaling_dag
);
criterion_main!(benches);
