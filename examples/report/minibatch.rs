//! The report's minibatch table: `Program::train_minibatches` on MNIST at O2, on 1 thread and
//! on every core, timed in turns, with the check that both end at the same bits.

use std::fmt::Write as _;
use std::time::Instant;

use tapejit::{Graph, Jit, OptLevel, Program, Tiering};

use crate::table::{median, significant};
use crate::workload::Samples;

/// Minibatch sizes the table measures.
const BATCHES: [usize; 2] = [32, 128];
/// The minibatch learning rate (the mean gradient's; the per-sample table uses 0.01).
const LR: f64 = 0.1;

/// The table (markdown): per row an untimed warm-up pass over `samples` on every core, then
/// `runs` timings per thread count, each of as many passes as last `min_secs` (as the step
/// rows: a pass over 2,000 samples is a few milliseconds, in which a thread's start or a
/// neighbour's burst would decide the row).
pub fn table(g: &Graph, samples: &Samples, runs: usize, min_secs: f64) -> Result<String, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let inputs = samples.concatenated();
    let n = samples.len();
    let mut jit = Jit::builder()
        .tiering(Tiering::Off)
        .opt_level(OptLevel::O2)
        .compile(g)
        .map_err(|e| e.to_string())?;
    let init = jit.params().to_vec();
    let mut out = format!(
        "| minibatch | 1 thread us/sample | {cores} threads us/sample | speedup | same bits |\n\
         |--:|--:|--:|--:|:-:|\n"
    );
    for batch in BATCHES {
        jit.set_params(&init).map_err(|e| e.to_string())?;
        let start = Instant::now();
        jit.train_minibatches(&inputs, batch, LR, cores)
            .map_err(|e| e.to_string())?;
        let once = start.elapsed().as_secs_f64();
        let passes = ((min_secs / once.max(1e-9)).ceil() as usize).max(1);
        let mut us = [Vec::new(), Vec::new()];
        let mut params: [Vec<f64>; 2] = Default::default();
        for _ in 0..runs {
            for (k, threads) in [1, cores].into_iter().enumerate() {
                jit.set_params(&init).map_err(|e| e.to_string())?;
                let start = Instant::now();
                for _ in 0..passes {
                    jit.train_minibatches(&inputs, batch, LR, threads)
                        .map_err(|e| e.to_string())?;
                }
                us[k].push(start.elapsed().as_secs_f64() * 1e6 / (n * passes) as f64);
                params[k] = jit.params();
            }
        }
        let (one, all) = (median(&us[0]), median(&us[1]));
        let same = params[0]
            .iter()
            .zip(&params[1])
            .all(|(a, b)| a.to_bits() == b.to_bits());
        let _ = writeln!(
            out,
            "| {batch} | {} | {} | {:.2}x | {} |",
            significant(one),
            significant(all),
            one / all,
            if same { "yes" } else { "NO" }
        );
    }
    let _ = write!(
        out,
        "\nPer run, from the same initial params, as many passes over the {n} samples as last \
         {min_secs} s (counted in an untimed warm-up pass), lr {LR} on the mean gradient; \
         median of {runs} runs (1 thread and {cores} threads take turns). Same \
         bits: the params after 1 and {cores} threads are identical, as `train_minibatches` \
         promises for every thread count.\n"
    );
    Ok(out)
}
