//! One epoch of the MNIST trainer, end to end: the shuffled samples staged and converted on a
//! second thread while `Program::train` (or `train_minibatches`) runs the previous batch.
//! `examples/mnist.rs` trains with it and the report's trainer section times it.

use tapejit::Program;
use tapejit_mnist::{self as mnist, Dataset};

/// Samples per `Program::train` call (per-sample SGD).
pub const BATCH: usize = 500;
/// About how many samples one `train_minibatches` call takes: enough that setting up its
/// threads is little, few enough that the two staging buffers stay small (at 6,000 samples
/// they were 38 MB each, and the page faults of writing them the first time cost each epoch
/// 50 ms).
pub const MINIBATCH_CALL: usize = 1024;

/// How an epoch updates the params.
#[derive(Clone, Copy, Debug)]
pub struct Sgd {
    pub lr: f64,
    /// 1: per-sample SGD through `Program::train`; more: minibatches of this many samples.
    pub batch: usize,
    /// Threads for minibatches (0: one per core).
    pub threads: usize,
}

/// An example (its pixels and label) in `Classifier`'s input layout: the pixels scaled to
/// [0, 1], then the label one-hot over the 10 digits.
pub fn classifier_inputs(pixels: &[u8], label: u8, inputs: &mut [f64]) -> mnist::Result<()> {
    let (npix, got) = (pixels.len(), inputs.len());
    let (scaled, one_hot) = inputs
        .split_at_mut_checked(npix)
        .ok_or(mnist::Error::WrongLength {
            what: "classifier inputs (pixels + one-hot label)",
            expected: npix + 10,
            got,
        })?;
    mnist::write_normalized(pixels, scaled)?;
    mnist::write_one_hot(label, one_hot)
}

/// Trains `program` on the samples `order` of `train`, in that order, as `sgd` says; the sum
/// of the samples' losses. `progress(done, loss_sum)` after each call.
pub fn train_epoch(
    program: &mut dyn Program,
    train: &Dataset,
    order: &[usize],
    sgd: Sgd,
    mut progress: impl FnMut(usize, f64),
) -> Result<f64, String> {
    let npix = train.images.pixels_per_image();
    let width = npix + 10;
    // `train` on batches of samples (one `step` each, in order): the JIT runs a batch in one
    // call; batches keep the progress line moving. With minibatches, a whole number of them
    // per call, and more samples: each call sets up its threads and their buffers.
    let per_call = match sgd.batch {
        1 => BATCH,
        b => (MINIBATCH_CALL / b).max(1) * b,
    };
    let chunks: Vec<&[usize]> = order.chunks(per_call).collect();
    let mut loss_sum = 0.0;
    // A second thread stages and converts the next chunk while this one trains (two buffers
    // passed back and forth): the data path off the kernel's critical path.
    std::thread::scope(|scope| -> Result<(), String> {
        let (filled_tx, filled) = std::sync::mpsc::sync_channel(1);
        let (empty_tx, empty) = std::sync::mpsc::channel::<Vec<f64>>();
        for _ in 0..2 {
            let _ = empty_tx.send(vec![0.0; per_call * width]);
        }
        let chunks = &chunks;
        scope.spawn(move || {
            let mut staged = Vec::with_capacity(per_call * npix);
            for chunk in chunks {
                let Ok(mut batch) = empty.recv() else { return };
                let converted = stage(train, chunk, &mut staged, &mut batch, width);
                if filled_tx.send(converted.map(|()| batch)).is_err() {
                    return;
                }
            }
        });
        let mut done = 0;
        for chunk in chunks {
            let full = filled.recv().map_err(|_| "the staging thread stopped")??;
            let batch = &full[..chunk.len() * width];
            let losses = match sgd.batch {
                1 => program.train(batch, sgd.lr),
                b => program.train_minibatches(batch, b, sgd.lr, sgd.threads),
            };
            for loss in losses.map_err(|e| e.to_string())? {
                loss_sum += loss;
            }
            let _ = empty_tx.send(full);
            done += chunk.len();
            progress(done, loss_sum);
        }
        Ok(())
    })?;
    Ok(loss_sum)
}

/// The samples `chunk` of `train` in `Classifier`'s input layout, side by side in `batch`
/// (`width` numbers each).
fn stage(
    train: &Dataset,
    chunk: &[usize],
    staged: &mut Vec<u8>,
    batch: &mut [f64],
    width: usize,
) -> Result<(), String> {
    // The shuffled images' bytes copied side by side first: each copy's cache misses
    // overlap the next ones', where normalizing image by image waited on each line (a sixth
    // of an epoch's time went there).
    let npix = train.images.pixels_per_image();
    staged.clear();
    for &i in chunk {
        staged.extend_from_slice(train.pixels(i));
    }
    let batch = &mut batch[..chunk.len() * width];
    for ((x, pixels), &i) in batch.chunks_mut(width).zip(staged.chunks(npix)).zip(chunk) {
        classifier_inputs(pixels, train.label(i), x).map_err(|e| e.to_string())?;
    }
    Ok(())
}
