//! Minibatch SGD on every core ([`crate::Program::train_minibatches`]), written once for
//! every backend, so the interpreter and the JIT follow the same order of additions.
//!
//! A minibatch of `m` samples is cut into chunks of [`CHUNK`] samples (the last may be
//! shorter). Each chunk starts from params' gradients of 0 and runs forward and backward per
//! sample, in order, so its samples' gradients accumulate as `backward` accumulates them. The
//! minibatch's gradient is the chunks' sums added in chunk order (`((c0 + c1) + c2) + ...`),
//! and each param moves by `p -= (lr / m) * g`. None of this depends on the thread count.
//!
//! Each thread has its own copy of the buffers (a [`Replica`]) and runs, per minibatch:
//! 1. its share of the chunks (consecutive ones), each chunk's gradient buffer swapped into
//!    `chunk_sums`;
//! 2. its range of params: `g`, the chunk sums added in order, into `total`;
//! 3. its own copy of every param: `p -= (lr / m) * g`.
//!
//! Threads wait for each other between the steps at a barrier that spins: a step lasts tens
//! to hundreds of microseconds, about what waking a sleeping thread takes on a virtual machine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

use crate::program::{Backend, Replica};

/// Samples per chunk: the unit of work a thread takes, and of the order of additions.
pub const CHUNK: usize = 16;

/// Minibatch SGD on checked `inputs` (a whole number, at least one, of samples), `batch >= 1`
/// samples at a time, a finite `lr`, a tape with a loss, on `threads >= 1` threads. Returns
/// each sample's loss (before its minibatch's update). Afterwards the buffers hold the last
/// sample's values and gradients, but params' gradients hold the last minibatch's mean
/// gradient.
pub(crate) fn train<B: Backend + ?Sized>(
    b: &mut B,
    inputs: &[f64],
    batch: usize,
    lr: f64,
    threads: usize,
) -> Vec<f64> {
    let tape = b.program_tape();
    let (width, params, base) = (tape.num_inputs(), tape.num_params(), tape.input_base());
    let Some(loss) = tape.loss() else {
        return Vec::new();
    };
    let samples: Vec<&[f64]> = inputs.chunks_exact(width).collect();
    let minibatches: Vec<&[&[f64]]> = samples.chunks(batch).collect();
    let chunks_per_batch = batch.min(samples.len()).div_ceil(CHUNK);
    let workers = threads.clamp(1, chunks_per_batch);
    let mut replicas: Vec<Box<dyn Replica + '_>> = (0..workers).map(|_| b.replica()).collect();
    // Whole gradient buffers: a chunk's ends up here by a swap, not a copy.
    let slots = b.grad_buffer().len();
    let chunk_sums: Vec<RwLock<Vec<f64>>> = (0..chunks_per_batch)
        .map(|_| RwLock::new(vec![0.0; slots]))
        .collect();
    // Thread w adds up params `w * span..` (the last range may be shorter or missing), into
    // the totals of the minibatch's parity: the next minibatch's may be written while a
    // thread still reads these.
    let span = params.div_ceil(workers).max(1);
    let totals: [Vec<RwLock<Vec<f64>>>; 2] = std::array::from_fn(|_| {
        (0..params.div_ceil(span))
            .map(|k| RwLock::new(vec![0.0; span.min(params - k * span)]))
            .collect()
    });
    let barrier = SpinBarrier::new(workers);
    let work = |w: usize, replica: &mut Box<dyn Replica + '_>| {
        let mut losses = Vec::new();
        let mut first = 0;
        for (n, minibatch) in minibatches.iter().enumerate() {
            let total = &totals[n % 2];
            let chunks = minibatch.len().div_ceil(CHUNK);
            let per = chunks.div_ceil(workers);
            for c in (w * per..(w + 1) * per).take_while(|&c| c < chunks) {
                replica.buffers_mut().1[..params].fill(0.0);
                let end = ((c + 1) * CHUNK).min(minibatch.len());
                for (i, x) in minibatch.iter().enumerate().take(end).skip(c * CHUNK) {
                    replica.buffers_mut().0[base..base + width].copy_from_slice(x);
                    replica.forward();
                    losses.push((first + i, replica.buffers_mut().0[loss.index()]));
                    replica.backward();
                }
                replica.swap_grads(&mut write(&chunk_sums[c]));
            }
            barrier.wait();
            if let Some(range) = total.get(w) {
                let mut g = write(range);
                let at = w * span;
                g.copy_from_slice(&read(&chunk_sums[0])[at..at + span.min(params - at)]);
                for sum in &chunk_sums[1..chunks] {
                    for (g, x) in g.iter_mut().zip(&read(sum)[at..]) {
                        *g += x;
                    }
                }
            }
            barrier.wait();
            let scale = lr / minibatch.len() as f64;
            let vals = &mut replica.buffers_mut().0[..params];
            for (vals, g) in vals.chunks_mut(span).zip(total) {
                for (p, g) in vals.iter_mut().zip(read(g).iter()) {
                    *p -= scale * g;
                }
            }
            first += minibatch.len();
        }
        losses
    };
    let done: Vec<Vec<(usize, f64)>> = std::thread::scope(|s| {
        let work = &work;
        let (first, others) = replicas.split_first_mut().expect("at least one worker");
        let others: Vec<_> = others
            .iter_mut()
            .enumerate()
            .map(|(w, r)| s.spawn(move || work(w + 1, r)))
            .collect();
        let mut done = vec![work(0, first)];
        // A worker that panicked (it cannot: the hooks assume only what `Program` checked)
        // would leave its barrier waiting forever, so a join never sees one.
        done.extend(others.into_iter().filter_map(|h| h.join().ok()));
        done
    });
    let mut losses = vec![0.0; samples.len()];
    for &(i, l) in done.iter().flatten() {
        losses[i] = l;
    }
    // The last sample ran on the worker of the last minibatch's last chunk, whose
    // gradients went to that chunk's sum.
    let last = minibatches.last().map_or(1, |m| m.len());
    let chunks = last.div_ceil(CHUNK);
    let vals = replicas[(chunks - 1) / chunks.div_ceil(workers)]
        .buffers_mut()
        .0
        .to_vec();
    let mut grads = read(&chunk_sums[chunks - 1]).clone();
    let total = totals[(minibatches.len() - 1) % 2].iter();
    for (g, t) in grads[..params]
        .iter_mut()
        .zip(total.flat_map(|t| read(t).to_vec()))
    {
        *g = t / last as f64;
    }
    drop(replicas);
    let (own_vals, own_grads) = b.buffers_mut();
    own_vals.copy_from_slice(&vals);
    own_grads.copy_from_slice(&grads);
    losses
}

/// A lock no thread holds while another wants it (the barrier separates them), so a
/// poisoned one still holds good numbers.
fn read(lock: &RwLock<Vec<f64>>) -> std::sync::RwLockReadGuard<'_, Vec<f64>> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write(lock: &RwLock<Vec<f64>>) -> std::sync::RwLockWriteGuard<'_, Vec<f64>> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// A barrier for `n` threads that spins (yielding now and then, in case the threads
/// outnumber the cores) instead of sleeping.
struct SpinBarrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    fn new(n: usize) -> SpinBarrier {
        SpinBarrier {
            n,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
