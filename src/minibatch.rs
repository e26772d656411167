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
//! 1. its share of the chunks (consecutive ones), each chunk's sum copied to `chunk_sums`;
//! 2. `g`, the chunk sums added in order, and its own copy of every param: `p -= (lr / m) *
//!    g`. Every thread adds up the whole `g` (cheap arithmetic): then the chunk sums cross
//!    cores once and nothing else does.
//!
//! Threads wait for each other after step 1 at a barrier that spins before it sleeps: a
//! minibatch lasts a few hundred microseconds, and waking a sleeping thread on a virtual
//! machine takes about as long. (Chunk sums of two minibatches alternate, so a thread may
//! fill the next minibatch's while another still adds up this one's.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, RwLock};

use crate::program::{Backend, Replica};

/// Samples per chunk: the unit of work a thread takes, and of the order of additions.
pub const CHUNK: usize = 16;

/// What a thread hands back: its samples' losses (by sample index), and the last
/// minibatch's gradient sum.
type Worked = (Vec<(usize, f64)>, Vec<f64>);

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
    // The params' part of each chunk's gradients, copied (a swap would hand the thread a
    // buffer that is cold in its cache). One set per parity of the minibatch: a thread may
    // still add up minibatch n's while another has gone on to fill minibatch n + 1's.
    let chunk_sums: [Vec<RwLock<Vec<f64>>>; 2] = std::array::from_fn(|_| {
        (0..chunks_per_batch)
            .map(|_| RwLock::new(vec![0.0; params]))
            .collect()
    });
    let barrier = SpinBarrier::new(workers);
    let work = |w: usize, replica: &mut Box<dyn Replica + '_>| {
        let mut losses = Vec::new();
        let mut total = vec![0.0; params];
        let mut first = 0;
        for (n, minibatch) in minibatches.iter().enumerate() {
            let sums = &chunk_sums[n % 2];
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
                write(&sums[c]).copy_from_slice(&replica.buffers_mut().1[..params]);
            }
            barrier.wait();
            // Every thread adds up the whole gradient for its own copy of the params: the
            // chunk sums cross cores once, and nothing else needs to.
            total.copy_from_slice(&read(&sums[0]));
            for sum in &sums[1..chunks] {
                for (g, x) in total.iter_mut().zip(read(sum).iter()) {
                    *g += x;
                }
            }
            let scale = lr / minibatch.len() as f64;
            for (p, g) in replica.buffers_mut().0[..params].iter_mut().zip(&total) {
                *p -= scale * g;
            }
            first += minibatch.len();
        }
        (losses, total)
    };
    let done: Vec<Worked> = std::thread::scope(|s| {
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
    for &(i, l) in done.iter().flat_map(|(l, _)| l) {
        losses[i] = l;
    }
    // The last sample ran on the worker of the last minibatch's last chunk.
    let last = minibatches.last().map_or(1, |m| m.len());
    let chunks = last.div_ceil(CHUNK);
    let (vals, grads) = replicas[(chunks - 1) / chunks.div_ceil(workers)].buffers_mut();
    let (vals, mut grads) = (vals.to_vec(), grads.to_vec());
    for (g, t) in grads[..params].iter_mut().zip(&done[0].1) {
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

/// A barrier for `n` threads that spins for a while (a step's threads arrive within
/// microseconds of each other when each has a core) and then sleeps (when they do not, as
/// on a busy machine, spinning would keep the late thread from running).
struct SpinBarrier {
    n: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    sleepers: Mutex<()>,
    wake: Condvar,
}

/// How many times a waiting thread looks before it sleeps (some tens of microseconds).
const SPINS: u32 = 1 << 15;

impl SpinBarrier {
    fn new(n: usize) -> SpinBarrier {
        SpinBarrier {
            n,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            sleepers: Mutex::new(()),
            wake: Condvar::new(),
        }
    }

    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.arrived.store(0, Ordering::Relaxed);
            // Under the lock, so that a thread about to sleep either sees the new
            // generation or is asleep when the notification comes.
            let _guard = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
            self.generation.fetch_add(1, Ordering::Release);
            self.wake.notify_all();
            return;
        }
        for _ in 0..SPINS {
            if self.generation.load(Ordering::Acquire) != generation {
                return;
            }
            std::hint::spin_loop();
        }
        let mut guard = self.sleepers.lock().unwrap_or_else(|e| e.into_inner());
        while self.generation.load(Ordering::Acquire) == generation {
            guard = self.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
    }
}
