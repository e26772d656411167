//! (b) One training step (`Program::step`: set inputs, zero_grad, forward, backward, update)
//! of the MNIST classifier 784-50-10 on real MNIST samples, on the interpreter, at every JIT
//! mode, and for the hand-written Rust versions; then whole calls (`train_mnist`, in samples
//! per second): `Program::train` on 100 samples with zero-skipping on and off, and
//! `Program::train_minibatches` on 1,600 samples (minibatches of 32) on 1 thread and on every
//! core.
//!
//! cargo bench --bench step
//!
//! Needs MNIST's training set in data/mnist (scripts/fetch-mnist) or in the directory named
//! by `TAPEJIT_MNIST`; without it this prints why and measures nothing. Each iteration is one
//! step on the next of the first 2,000 training samples (cycling), converted to the
//! classifier's input layout up front, exactly as examples/report.rs times them.

#[path = "common/handwritten.rs"]
mod handwritten;
#[path = "common/workload.rs"]
mod workload;

use std::path::PathBuf;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use handwritten::{Expert, ExpertSkippingZeros, HandWritten, Naive};
use tapejit::{Graph, Jit, OptLevel, Program, Tiering, ZeroSkipping};
use workload::{Samples, LR};

const SAMPLES: usize = 2_000;

fn mnist_dir() -> PathBuf {
    std::env::var_os("TAPEJIT_MNIST")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/mnist"))
}

fn bench_hand<H: HandWritten>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    samples: &Samples,
    init: &[f64],
) {
    let mut hand = H::from_params(init);
    let mut i = 0;
    group.bench_function(H::NAME, |b| {
        b.iter(|| {
            let loss = hand.step(
                &samples.inputs[i][..workload::INPUTS],
                samples.labels[i],
                LR,
            );
            i = (i + 1) % samples.len();
            loss
        })
    });
}

fn step_mnist(c: &mut Criterion) {
    let samples = match Samples::mnist(&mnist_dir(), SAMPLES) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("step_mnist: skipped: {e}; set TAPEJIT_MNIST to another directory");
            return;
        }
    };
    let g = Graph::new();
    workload::mnist_graph(&g, workload::HIDDEN);
    let mut group = c.benchmark_group("step_mnist");
    group.measurement_time(Duration::from_secs(10));
    let mut init = Vec::new();
    // Whole-pass modes run `train` over many samples; the report times them.
    for mode in workload::modes().into_iter().filter(|m| !m.whole_pass) {
        let mut program = mode.build(&g).expect("the graph compiles");
        if init.is_empty() {
            init = program.params().to_vec();
        }
        let mut i = 0;
        group.bench_function(&mode.name, |b| {
            b.iter(|| {
                let loss = program.step(&samples.inputs[i], LR).expect("valid inputs");
                i = (i + 1) % samples.len();
                loss
            })
        });
    }
    bench_hand::<Naive>(&mut group, &samples, &init);
    bench_hand::<Expert>(&mut group, &samples, &init);
    bench_hand::<ExpertSkippingZeros>(&mut group, &samples, &init);
    group.finish();
}

/// Samples per `train` call, and per `train_minibatches` call.
const TRAIN_CALL: usize = 100;
const MINIBATCH_CALL: usize = 1_600;

fn train_mnist(c: &mut Criterion) {
    let samples = match Samples::mnist(&mnist_dir(), SAMPLES) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("train_mnist: skipped: {e}; set TAPEJIT_MNIST to another directory");
            return;
        }
    };
    let g = Graph::new();
    workload::mnist_graph(&g, workload::HIDDEN);
    let inputs = samples.concatenated();
    let width = inputs.len() / samples.len();
    let calls = |per: usize| inputs.chunks_exact(per * width).cycle();
    let compile = |skipping| {
        Jit::builder()
            .tiering(Tiering::Off)
            .opt_level(OptLevel::O2)
            .zero_skipping(skipping)
            .compile(&g)
            .expect("the graph compiles")
    };
    let mut group = c.benchmark_group("train_mnist");
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(TRAIN_CALL as u64));
    for (name, skipping) in [
        ("O2 train()", ZeroSkipping::Auto),
        ("O2 train(), zero-skipping off", ZeroSkipping::Never),
    ] {
        let mut jit = compile(skipping);
        let mut next = calls(TRAIN_CALL);
        group.bench_function(name, |b| {
            b.iter(|| jit.train(next.next().expect("cycles"), LR).expect("valid"))
        });
    }
    group.throughput(Throughput::Elements(MINIBATCH_CALL as u64));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, cores] {
        let mut jit = compile(ZeroSkipping::Auto);
        let mut next = calls(MINIBATCH_CALL);
        let name = format!("O2 train_minibatches(32), {threads} threads");
        group.bench_function(name, |b| {
            b.iter(|| {
                let x = next.next().expect("cycles");
                jit.train_minibatches(x, 32, 0.1, threads).expect("valid")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, step_mnist, train_mnist);
criterion_main!(benches);
