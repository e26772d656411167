//! One epoch of the MNIST trainer, end to end: the dataset's bytes and a shuffled order handed
//! to `Program::train_from` (or `train_minibatches_from`), which converts each sample where it
//! trains on it. `examples/mnist.rs` trains with it and the report's trainer section times it.

use tapejit::{Program, Samples};
use tapejit_mnist::Dataset;

/// Samples per `Program::train` call (per-sample SGD).
pub const BATCH: usize = 500;
/// About how many samples one `train_minibatches_from` call takes: enough that setting up its
/// threads and their copies is little (`--batch 32`, three runs of three epochs each, on 1 / 2
/// threads: calls of 1,024 samples 2.9-3.0 / 1.7-2.0 us per sample, of 4,096 to 60,000
/// 2.8-2.9 / 1.6-1.7), few enough that the progress line moves.
pub const MINIBATCH_CALL: usize = 8192;

/// How an epoch updates the params.
#[derive(Clone, Copy, Debug)]
pub struct Sgd {
    pub lr: f64,
    /// 1: per-sample SGD through `Program::train`; more: minibatches of this many samples.
    pub batch: usize,
    /// Threads for minibatches (0: one per core).
    pub threads: usize,
}

/// `train`'s examples as `Classifier`'s inputs (the pixels scaled to [0, 1] as
/// `mnist::write_normalized` scales them, `p as f64 / 255.0`, then the label one-hot over
/// the 10 digits), stored as they are.
pub fn classifier_samples(train: &Dataset) -> tapejit::Result<Samples<'_>> {
    let npix = train.images.pixels_per_image();
    Samples::new()
        .bytes_over(&train.images.pixels, npix, 255.0)?
        .one_hot(&train.labels.labels, 10)
}

/// Trains `program` on the samples `order` of `train`, in that order, as `sgd` says; the sum
/// of the samples' losses. `progress(done, loss_sum)` after each call. The samples go to
/// `train_from` as bytes and an order: the program converts each where it trains on it.
pub fn train_epoch(
    program: &mut dyn Program,
    train: &Dataset,
    order: &[usize],
    sgd: Sgd,
    mut progress: impl FnMut(usize, f64),
) -> Result<f64, String> {
    // `train` on batches of samples (one `step` each, in order): the JIT runs a batch in one
    // call; batches keep the progress line moving. With minibatches, a whole number of them
    // per call: each call sets up its threads and their buffers.
    let per_call = match sgd.batch {
        1 => BATCH,
        b => (MINIBATCH_CALL / b).max(1) * b,
    };
    let samples = classifier_samples(train).map_err(|e| e.to_string())?;
    let (mut loss_sum, mut done) = (0.0, 0);
    for chunk in order.chunks(per_call) {
        let part = samples.in_order(chunk).map_err(|e| e.to_string())?;
        let losses = match sgd.batch {
            1 => program.train_from(&part, sgd.lr),
            b => program.train_minibatches_from(&part, b, sgd.lr, sgd.threads),
        };
        for loss in losses.map_err(|e| e.to_string())? {
            loss_sum += loss;
        }
        done += chunk.len();
        progress(done, loss_sum);
    }
    Ok(loss_sum)
}
