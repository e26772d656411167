//! Minibatches on several threads with the first layer cut by its rows
//! ([`crate::plan::first_layer::split`]), where the backend can: what crosses cores per minibatch is a
//! few numbers per sample, not the weights.
//!
//! Each thread owns a range of the first layer's steps (inputs): those rows of weights,
//! their gradients and their update; it alone reads and writes them. Per minibatch of `m`
//! samples, each thread:
//! 1. for every sample in order, continues the layer's sums over its rows from where the
//!    previous thread's rows left them (the first thread from the biases) and hands them
//!    on: a pipeline, each thread a sample behind the one before;
//! 2. runs the rest of each sample of its chunks (as in `super::train`) from the finished
//!    sums, into its own buffer of every slot's gradients, publishes the sample's gradient
//!    of the sums, and at the chunk's end copies out the chunk's gradients of the other
//!    params (only those: a minibatch of many chunks keeps a few numbers per chunk);
//! 3. after one barrier, makes its rows' gradients of the minibatch, row by row (per chunk
//!    a sum from 0, the chunks' sums added in chunk order, in registers, stored once), then
//!    updates its rows from them, and every other param (the same in every thread's copy)
//!    from the chunks' gradients of step 2.
//!
//! Samples stored otherwise than as numbers are converted by the threads that read them
//! (`convert_read`): the first thread converts the next minibatch's after its step 2, where
//! it would otherwise wait at the barrier for the last thread (which starts its step 1 a
//! sample behind it), so that after step 3 it starts the sums at once; the others convert
//! theirs after step 3, while the first makes the first sums they need. (On 2 threads,
//! minibatches of 32 on MNIST: 1.78-1.82x one thread against 1.76-1.79x when every thread
//! converted after step 3.)
//!
//! Every number is added as `super::train` adds it: a sum over its steps in order, a
//! chunk's gradient sample by sample from 0, the chunks' sums in chunk order. So the bits
//! are those of one thread. A thread waits for a sample's sums only where it needs them
//! (step 1's next rows, step 2), and the barrier orders the rest: a thread writes step 1's
//! and step 2's outputs of the next minibatch only after the last thread's step 1 of it,
//! which comes after every thread's step 3 of this one.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use super::Update;
use super::{
    chunks_of, in_order, into_inner, keep, last_chunk, read, step, write, write_back, Shape,
    SpinBarrier, CHUNK, SPINS,
};
use super::{Replica, Replicas};
use crate::aligned::AlignedBuf;
use crate::finite::all_finite;
use crate::samples::Samples;

/// Where `train`'s dot lies, which a split minibatch relies on (addresses in the buffers).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SplitRows {
    /// The dot's steps, one per input: the rows of its weights.
    pub rows: usize,
    /// Where row `t` of weights starts: `first_weight + t * row_stride` (one weight per
    /// repetition of the nest, side by side; the rest of a row a gap no code reads).
    pub first_weight: usize,
    pub row_stride: usize,
    /// The dot's sums, one per repetition, side by side.
    pub sums: Range<usize>,
    /// Where step 0's input is in a sample (step `t`'s at `first_input + t`).
    pub first_input: usize,
}

impl SplitRows {
    /// The weights of rows `rows` (with the gaps between them).
    pub(crate) fn weights(&self, rows: Range<usize>) -> Range<usize> {
        self.first_weight + rows.start * self.row_stride
            ..self.first_weight + rows.end * self.row_stride
    }
}

/// One sample of a minibatch in stages: the first layer's sums
/// over ranges of its steps (rows), the rest of the sample from the sums, the rows'
/// weight gradients from the sums' gradients. `sample` is one whole sample; `rows` lie
/// inside the split's; sums and their gradients are one number per sum.
pub(crate) trait Stages {
    /// Where the dot's rows, weights and sums are in the buffers.
    fn split(&self) -> &SplitRows;
    /// The sums continued over `rows` of `sample`, from the biases or from `start`
    /// (`ahead`: the sample the next call reads, which may be asked into the cache).
    fn head(
        &mut self,
        sample: &[f64],
        ahead: &[f64],
        rows: Range<usize>,
        start: Option<&[f64]>,
    ) -> &[f64];
    /// The rest of `sample` forward and backward from the finished `sums`, into `grads`
    /// (one per slot; the sums' gradients left at the split's sums); the loss.
    fn rest(&mut self, sample: &[f64], sums: &[f64], grads: &mut [f64]) -> f64;
    /// The minibatch's gradients of the weights of `rows` into `grads` (one per slot):
    /// per chunk of `chunk` samples (a power of 2 up to 64) of `samples` (side by side)
    /// a sum from 0, the chunks' sums added in chunk order; from the samples' sums'
    /// gradients (one after another).
    fn tail(
        &mut self,
        samples: &[f64],
        rows: Range<usize>,
        sums_grads: &[f64],
        chunk: usize,
        grads: &mut [f64],
    );
    /// Says whether this replica's weights of its own rows are finite (after it updated
    /// them), which `head` and `tail` need to skip zero inputs.
    fn set_rows_finite(&mut self, finite: bool);
}

/// Samples whose sums a thread takes from the one before it at a time (their lines then cross
/// cores side by side; the thread starts that many samples behind).
const HANDED_ON: usize = 2;

/// Numbers one thread hands another per sample: a sample's sums (or their gradients), as
/// bits, and the minibatch (counted from 1) whose they are.
struct Handoff {
    numbers: Vec<AtomicU64>,
    ready: Vec<AtomicUsize>,
    width: usize,
}

impl Handoff {
    fn new(samples: usize, width: usize) -> Handoff {
        Handoff {
            numbers: (0..samples * width).map(|_| AtomicU64::new(0)).collect(),
            ready: (0..samples).map(|_| AtomicUsize::new(0)).collect(),
            width,
        }
    }

    fn put(&self, sample: usize, minibatch: usize, xs: &[f64]) {
        let at = &self.numbers[sample * self.width..(sample + 1) * self.width];
        for (a, x) in at.iter().zip(xs) {
            a.store(x.to_bits(), Ordering::Relaxed);
        }
        self.ready[sample].store(minibatch, Ordering::Release);
    }

    /// The numbers of samples `samples` of minibatch `minibatch` into `xs` (one after the
    /// other), once they are all there. Taken together, their lines cross from the other
    /// core side by side rather than a sample's at a time.
    fn take(&self, samples: Range<usize>, minibatch: usize, xs: &mut [f64]) {
        for ready in &self.ready[samples.clone()] {
            // Spin a while (the other thread is a sample ahead when each has a core), then
            // give the core up between looks (when they share one, as on a busy machine,
            // spinning would keep the other from running).
            let mut spins = 0u32;
            while ready.load(Ordering::Acquire) < minibatch {
                if spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        let at = &self.numbers[samples.start * self.width..samples.end * self.width];
        for (x, a) in xs.iter_mut().zip(at) {
            *x = f64::from_bits(a.load(Ordering::Relaxed));
        }
    }
}

/// The rows of `split` cut into `stages` ranges holding about as many non-zero inputs of
/// `samples`' first 256 each.
fn cut_rows(split: &SplitRows, samples: &Samples<'_>, stages: usize) -> Vec<usize> {
    let mut nonzero = vec![1usize; split.rows];
    let (width, probe) = (samples.width(), samples.len().min(256));
    let rows = split.first_input..split.first_input + split.rows;
    // (Stored numbers are read where they are: a copy of the probe cost a whole call's
    // worth of page faults.)
    let converted;
    let inputs = match samples.as_numbers() {
        Some(numbers) => &numbers[..probe * width],
        None => {
            let mut into = vec![0.0; probe * width];
            samples.convert_columns(0..probe, rows, &mut into);
            converted = into;
            &converted[..]
        }
    };
    for sample in inputs.chunks_exact(width) {
        let x = &sample[split.first_input..split.first_input + split.rows];
        for (n, &x) in nonzero.iter_mut().zip(x) {
            *n += (x != 0.0) as usize;
        }
    }
    let total: usize = nonzero.iter().sum();
    let mut bounds = vec![0];
    let mut seen = 0;
    for (t, n) in nonzero.iter().enumerate() {
        if seen * stages >= total * bounds.len() && bounds.len() < stages {
            bounds.push(t);
        }
        seen += n;
    }
    while bounds.len() <= stages {
        bounds.push(split.rows);
    }
    bounds
}

/// What a thread with the split's `rows` and the chunks `mine` reads of minibatch `part`,
/// converted into `out` (whole samples; the rest left as it was): those rows' inputs of every
/// sample (`head`, `tail`), and the inputs outside the split's rows of its chunks' samples
/// (`rest`). Each input is converted by one thread.
fn convert_read(
    part: &Samples<'_>,
    split: &SplitRows,
    rows: Range<usize>,
    mine: impl Iterator<Item = usize>,
    out: &mut [f64],
) {
    let (m, width) = (part.len(), part.width());
    let read = split.first_input..split.first_input + split.rows;
    part.convert_columns(0..m, read.start + rows.start..read.start + rows.end, out);
    for c in mine {
        let chunk = c * CHUNK..((c + 1) * CHUNK).min(m);
        let out = &mut out[chunk.start * width..chunk.end * width];
        let samples = part.part(chunk.clone());
        for unread in [0..read.start, read.end..width] {
            samples.convert_columns(0..chunk.len(), unread, out);
        }
    }
}

/// [`super::train`] on `threads >= 1` threads in stages, for a backend whose replicas have
/// them ([`Stages`]). The same contract and the same bits.
pub(super) fn train<B: Replicas + ?Sized>(
    b: &mut B,
    shape: &Shape<'_>,
    lr: f64,
    threads: usize,
) -> Result<Vec<f64>, usize> {
    let Shape {
        ref minibatches,
        width,
        samples,
        batch,
        buffer_len,
        params,
    } = *shape;
    let chunks_per_batch = batch.div_ceil(CHUNK);
    let stored = minibatches[0].as_numbers().is_some();
    let workspace = b.workspace();
    let spares = &workspace.spares;
    let mut replicas: Vec<Box<dyn Replica + '_>> = (0..threads).map(|_| b.replica()).collect();
    let split = match replicas[0].stages() {
        Some(stages) => stages.split().clone(),
        None => unreachable!("called for a backend with stages"),
    };
    let sums = split.sums.len();
    let bounds = cut_rows(&split, &minibatches[0], threads);
    let block = split.weights(0..split.rows);
    let others = [0..block.start, block.end..params];
    // Where each range of `others` lies in a chunk's gradients of them: the params with the
    // block taken out.
    let packed = [0..block.start, block.start..params - block.len()];
    // Step 1's sums, per thread; step 2's gradients of the finished sums.
    let partial: Vec<Handoff> = (0..threads).map(|_| Handoff::new(batch, sums)).collect();
    let sums_grads = Handoff::new(batch, sums);
    // Each chunk's gradients of the other params (a thread's buffer of every slot's
    // gradients serves each of its chunks in turn: so a minibatch of many chunks keeps a few
    // numbers per chunk, not a buffer).
    let chunk_grads: Vec<RwLock<AlignedBuf>> = (0..chunks_per_batch)
        .map(|_| RwLock::new(spares.any(packed[1].end)))
        .collect();
    let mean = Mutex::new(spares.zeros(params));
    let barrier = SpinBarrier::new(threads);
    // The first sample of the first chunk holding a non-finite number, per minibatch parity:
    // with one barrier per minibatch, a thread may check the next minibatch's inputs while
    // another still reads this one's verdict after the barrier.
    let non_finite = [AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX)];
    let work = |w: usize, replica: &mut Box<dyn Replica + '_>| {
        let rows = bounds[w]..bounds[w + 1];
        let own = split.weights(rows.clone());
        // The minibatch's gradients of its own rows (stored by `tail`, the gaps between
        // rows 0; nothing else is read).
        let mut row_grads = spares.any(buffer_len);
        // Every slot's gradients for `rest`, a chunk at a time.
        let mut grads = spares.zeros(buffer_len);
        row_grads[own.clone()].fill(0.0);
        let (mut numbers, mut losses) = (vec![0.0; HANDED_ON * sums], Vec::new());
        // A chunk's finished sums, and the minibatch's gradients of the sums.
        let (mut chunk_sums, mut all_grads) = (vec![0.0; CHUNK * sums], vec![0.0; batch * sums]);
        let mut first = 0;
        // Samples not stored as numbers, converted: this thread's rows of every sample (for
        // `head` and `tail`), the rest of its chunks' samples (for `rest`). The first thread
        // converts the next minibatch before the barrier (see the module's outline), into
        // the other of two buffers.
        let converts_ahead = w == 0 && threads > 1 && !stored;
        let len = if stored { 0 } else { batch * width };
        let mut converted = [
            vec![0.0; len],
            vec![0.0; if converts_ahead { len } else { 0 }],
        ];
        let convert = |n: usize, into: &mut Vec<f64>| {
            let part = &minibatches[n];
            let mine = chunks_of(w, part.len(), threads);
            convert_read(
                part,
                &split,
                rows.clone(),
                mine,
                &mut into[..part.len() * width],
            );
        };
        if converts_ahead {
            convert(0, &mut converted[0]);
        }
        for (n, part) in minibatches.iter().enumerate() {
            let (generation, m) = (n + 1, part.len());
            let mine = chunks_of(w, m, threads);
            let [even, odd] = &mut converted;
            let (this, next) = match converts_ahead && n % 2 == 1 {
                true => (odd, even),
                false => (even, odd),
            };
            if !stored && !converts_ahead {
                convert(n, this);
            }
            let minibatch = match part.as_numbers() {
                Some(numbers) => numbers,
                None => &this[..m * width],
            };
            let non_finite = &non_finite[n % 2];
            let sample = |s: usize| &minibatch[s * width..(s + 1) * width];
            let stages = replica.stages().expect("every replica has stages");
            for s in 0..m {
                // (Two samples' sums at a time: their lines cross side by side.)
                if w > 0 && s % HANDED_ON == 0 {
                    let these = s..(s + HANDED_ON).min(m);
                    let into = &mut numbers[..these.len() * sums];
                    partial[w - 1].take(these, generation, into);
                }
                let at = (s % HANDED_ON) * sums;
                let start = (w > 0).then(|| &numbers[at..at + sums]);
                let ahead = sample((s + 1).min(m - 1));
                let done = stages.head(sample(s), ahead, rows.clone(), start);
                partial[w].put(s, generation, done);
                // Each thread checks the inputs it read (in cache now), the chunk's owner
                // the rest of them. (Converted samples were checked before the first step.)
                if stored && !all_finite(&sample(s)[split.first_input..][rows.clone()]) {
                    non_finite.fetch_min(first + s / CHUNK * CHUNK, Ordering::Relaxed);
                }
            }
            for c in mine {
                let in_chunk = c * CHUNK..((c + 1) * CHUNK).min(m);
                let read = split.first_input..split.first_input + split.rows;
                let unread = |s| [&sample(s)[..read.start], &sample(s)[read.end..]];
                if stored && !in_chunk.clone().flat_map(unread).all(all_finite) {
                    non_finite.fetch_min(first + in_chunk.start, Ordering::Relaxed);
                }
                // (The minibatch stops at the barrier; every chunk's inputs are checked.)
                if non_finite.load(Ordering::Relaxed) != usize::MAX {
                    continue;
                }
                // Every thread has read this chunk's gradients of the last minibatch once the
                // last thread has begun this one (see the module's outline).
                let finished = &mut chunk_sums[..in_chunk.len() * sums];
                partial[threads - 1].take(in_chunk.clone(), generation, finished);
                for r in &others {
                    grads[r.clone()].fill(0.0);
                }
                for (s, sums) in in_chunk.zip(finished.chunks_exact(sums)) {
                    let loss = stages.rest(sample(s), sums, &mut grads);
                    losses.push((first + s, loss));
                    sums_grads.put(s, generation, &grads[split.sums.clone()]);
                }
                let mut of_chunk = write(&chunk_grads[c]);
                for (r, at) in others.iter().zip(&packed) {
                    of_chunk[at.clone()].copy_from_slice(&grads[r.clone()]);
                }
            }
            if converts_ahead && n + 1 < minibatches.len() {
                convert(n + 1, next);
            }
            barrier.wait();
            if non_finite.load(Ordering::Relaxed) != usize::MAX {
                break;
            }
            let all_grads = &mut all_grads[..m * sums];
            sums_grads.take(0..m, generation, all_grads);
            stages.tail(minibatch, rows.clone(), all_grads, CHUNK, &mut row_grads);
            let last = n + 1 == minibatches.len();
            let mut mean = last.then(|| mean.lock().unwrap_or_else(|e| e.into_inner()));
            let vals = replica.values_mut();
            let own_mean = mean.as_deref_mut().map(|m| &mut m[own.clone()]);
            let finite = step(
                &[&row_grads],
                own.clone(),
                m,
                Update::sgd(lr),
                &mut vals[own.clone()],
                own_mean,
            );
            let guards: Vec<_> = chunk_grads[..m.div_ceil(CHUNK)].iter().map(read).collect();
            for (r, at) in others.iter().zip(&packed) {
                let chunk_sums: Vec<&[f64]> = guards.iter().map(|g| &g[at.clone()]).collect();
                let mean = mean
                    .as_deref_mut()
                    .filter(|_| w == 0)
                    .map(|m| &mut m[r.clone()]);
                let vals = &mut vals[r.clone()];
                step(&chunk_sums, 0..r.len(), m, Update::sgd(lr), vals, mean);
            }
            drop(guards);
            replica
                .stages()
                .expect("every replica has stages")
                .set_rows_finite(finite);
            first += m;
        }
        spares.keep(row_grads);
        (losses, grads)
    };
    let (done, mut grads): (Vec<_>, Vec<_>) = workspace
        .on_threads(replicas.iter_mut().collect(), work)
        .into_iter()
        .unzip();
    let [even, odd] = non_finite.map(AtomicUsize::into_inner);
    let losses = in_order(done, even.min(odd), samples)?;
    // The last sample ran on the thread of the last minibatch's last chunk; each thread's
    // own rows are the new ones.
    let (_, last) = last_chunk(minibatches, threads);
    let mut values: Vec<AlignedBuf> = replicas.into_iter().map(|r| r.into_values()).collect();
    let mut vals = std::mem::take(&mut values[last]);
    for (w, of_thread) in values.iter().enumerate().filter(|&(w, _)| w != last) {
        let own = split.weights(bounds[w]..bounds[w + 1]);
        vals[own.clone()].copy_from_slice(&of_thread[own]);
    }
    // (`acc_rest` copies only the inputs the first layer does not read; they lie side by
    // side after the params.)
    let final_part = minibatches.last().expect("at least one minibatch");
    let final_sample = final_part.len() - 1..final_part.len();
    final_part.fill(final_sample, &mut vals[params..params + width]);
    let mean = mean.into_inner().unwrap_or_else(|e| e.into_inner());
    write_back(b, &vals, &mut grads[last], &mean);
    let kept = chunk_grads
        .into_iter()
        .map(into_inner)
        .chain(values)
        .chain(grads);
    keep(&b.workspace().spares, kept.chain([vals, mean]));
    Ok(losses)
}
