//! The report's minibatch table: `Program::train_minibatches` on MNIST at O2, on 1 thread and
//! on every core, timed in turns, with the check that both end at the same bits.

use std::fmt::Write as _;
use std::time::Instant;

use tapejit::{Graph, Jit, OptLevel, Program};

use crate::table::{median, significant};
use crate::workload::Samples;

/// Minibatch sizes the table measures.
const BATCHES: [usize; 2] = [32, 128];
/// The minibatch learning rate (the mean gradient's; the per-sample table uses 0.01).
const LR: f64 = 0.1;

/// The table (markdown), timing `runs` passes over `samples` per row.
pub fn table(g: &Graph, samples: &Samples, runs: usize) -> Result<String, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let inputs = samples.concatenated();
    let n = samples.len();
    let mut jit = Jit::builder()
        .opt_level(OptLevel::O2)
        .compile(g)
        .map_err(|e| e.to_string())?;
    let init = jit.params().to_vec();
    let mut out = format!(
        "| minibatch | 1 thread us/sample | {cores} threads us/sample | speedup | same bits |\n\
         |--:|--:|--:|--:|:-:|\n"
    );
    for batch in BATCHES {
        let mut us = [Vec::new(), Vec::new()];
        let mut params: [Vec<f64>; 2] = Default::default();
        for _ in 0..runs {
            for (k, threads) in [1, cores].into_iter().enumerate() {
                jit.set_params(&init).map_err(|e| e.to_string())?;
                let start = Instant::now();
                jit.train_minibatches(&inputs, batch, LR, threads)
                    .map_err(|e| e.to_string())?;
                us[k].push(start.elapsed().as_secs_f64() * 1e6 / n as f64);
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
        "\nOne pass over the {n} samples per run from the same initial params, lr {LR} on the \
         mean gradient, median of {runs} runs (1 thread and {cores} threads take turns). Same \
         bits: the params after 1 and {cores} threads are identical, as `train_minibatches` \
         promises for every thread count.\n"
    );
    Ok(out)
}
