//! Minibatch SGD on every core ([`crate::Program::train_minibatches`]), written once for
//! every backend, so the interpreter and the JIT follow the same order of additions.
//!
//! A minibatch of `m` samples is cut into chunks of [`CHUNK`] samples (the last may be
//! shorter). Each chunk starts from params' gradients of 0 and runs forward and backward per
//! sample, in order, so its samples' gradients accumulate as `backward` accumulates them
//! (`Replica::accumulate`; the JIT's skips inputs that are exactly 0 where `train` does). The
//! minibatch's gradient is the chunks' sums added in chunk order (`((c0 + c1) + c2) + ...`),
//! and each param moves by `p -= (lr / m) * g`. None of this depends on the thread count.
//!
//! Where the backend can cut the first layer by its rows (`plan::first_layer::split`: the JIT, for a
//! layer on inputs without gradient that skips zero inputs), threads share out the rows
//! (`stages.rs`), on one thread too: the stages beat `accumulate` there at every minibatch
//! size (MNIST 784-50-10, 2,000 samples, best of 7 passes: 1.78-1.99 us per sample against
//! 2.28-2.36 at B = 64-256, 11.7 against 13.5 at B = 1). Elsewhere they share out the
//! samples, as follows.
//!
//! Each thread has its own copy of the values (a `Replica`) and a range of the params (a
//! share of whole cache lines), and runs, per minibatch:
//! 1. its share of the chunks (consecutive ones), each into a gradient buffer of its own
//!    (`chunk_grads`; zero inputs skipped as `train` skips them, exactly);
//! 2. at a barrier, for its range of params: `g`, the chunks' sums added in order, and
//!    `p -= (lr / m) * g`, the new values also copied out to `updated`;
//! 3. at a second barrier, the other ranges' new values copied in.
//!
//! So each param's gradient is added up once, and what crosses cores per minibatch is the
//! gradient and the params once each. That exchange (some 300 KB each way for MNIST's first
//! layer) is the part that does not shrink with more threads. Measured per thread for one
//! minibatch of 32 MNIST samples on two cores: its chunk 83-97 us (16 samples at a few
//! microseconds each, zero-skipping), then some 40 us exchanging: 19 us to sum and update
//! its half of the params (on one thread, all of them take 17-20 us: the other chunk's half
//! comes across cores), 11 us each to copy its half out and the other half in, and 5-10 us
//! at the barriers. Publishing only the lines whose bits changed, and marking the gradient
//! lines that are all `+0.0` so the summing thread need not read them, saved nothing
//! measurable: finding those lines costs about what skipping them saves.
//!
//! The barriers spin before they sleep: a minibatch lasts some hundred microseconds, and
//! waking a sleeping thread on a virtual machine takes about as long. No buffer needs two
//! generations: a thread writes chunk gradients and its `updated` range only after every
//! thread has passed the barrier after which they were last read.

mod stages;
mod workspace;

pub(crate) use stages::{SplitRows, Stages};
pub(crate) use workspace::Workspace;

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, RwLock};

use crate::aligned::{AlignedBuf, Spares};
use crate::error::Result;
use crate::finite::all_finite;
use crate::optim::{self, Optimizer, Scalars};
use crate::program::Backend;
use crate::samples::Samples;

/// What a backend supplies for minibatches, beside its [`Backend`] hooks.
pub(crate) trait Replicas: Backend {
    /// Called before `replica`s are made: a backend may build what they run (the JIT
    /// compiles `accumulate` when minibatches first need it). Fails only as compiling does.
    fn prepare_replicas(&mut self) -> Result<()> {
        Ok(())
    }
    /// A copy of the buffers that runs forward and backward as this backend does, on
    /// another thread if need be; after `prepare_replicas`.
    fn replica(&self) -> Box<dyn Replica + '_>;
    /// What `train_minibatches` keeps from one call to the next.
    fn workspace(&self) -> &Workspace;
    /// Whether replicas have [`Stages`] (after `prepare_replicas`).
    fn has_stages(&self) -> bool {
        false
    }
}

/// A values buffer of its own, and this program's forward and backward over it.
pub(crate) trait Replica: Send {
    fn values_mut(&mut self) -> &mut [f64];
    /// The values, the replica done with.
    fn into_values(self: Box<Self>) -> AlignedBuf;
    /// A chunk of a minibatch with `grads` (one per slot) as the
    /// gradients: params' gradients set to 0, then each sample of `inputs`
    /// (`losses.len() >= 1` whole samples) written to the inputs, run forward (its loss
    /// into `losses`) and backward. Only called when the tape has a loss.
    fn accumulate(&mut self, inputs: &[f64], losses: &mut [f64], grads: &mut [f64]);
    /// `accumulate` in stages, `train`'s dot cut by its rows, if this backend can
    /// ([`crate::plan::first_layer::split`]).
    fn stages(&mut self) -> Option<&mut dyn stages::Stages> {
        None
    }
}

/// Samples per chunk: the unit of work a thread takes, and of the order of additions.
pub const CHUNK: usize = 16;

/// Minibatch SGD on `samples` (at least one, of the tape's width), `batch >= 1`
/// samples at a time, a finite `lr`, a tape with a loss, on `threads >= 1` threads. Returns
/// each sample's loss (before its minibatch's update). Afterwards the buffers hold the last
/// sample's values and gradients, but params' gradients hold the last minibatch's mean
/// gradient. Each thread checks its chunk's inputs right before it runs them (in cache, and
/// side by side); if a minibatch holds a non-finite number, every thread stops at its
/// barrier, the error is the first sample of the first chunk holding one (every number
/// before it is finite) and the buffers are as they were (the threads work on copies,
/// written back only at the end). Samples not stored as `train`'s numbers are converted by
/// the thread that reads them, into a buffer of its own.
pub(crate) fn train<B: Replicas + ?Sized>(
    b: &mut B,
    samples: &Samples<'_>,
    batch: usize,
    lr: f64,
    threads: usize,
) -> Result<Vec<f64>> {
    b.prepare_replicas()?;
    train_prepared(b, samples, batch, lr, threads).map_err(|sample| {
        match samples.check_finite_from(sample) {
            Err(e) => e,
            Ok(()) => unreachable!("the threads stop at a non-finite input"),
        }
    })
}

/// [`train`], its replicas' code built; the error is the sample the threads stopped at.
fn train_prepared<B: Replicas + ?Sized>(
    b: &mut B,
    samples: &Samples<'_>,
    batch: usize,
    lr: f64,
    threads: usize,
) -> std::result::Result<Vec<f64>, usize> {
    let tape = b.program_tape();
    if tape.loss().is_none() {
        return Ok(Vec::new());
    }
    let shape = Shape::of(b, samples, batch);
    // (The stages update the params every thread keeps in every copy alike: by plain SGD,
    // which keeps no state.)
    let mut stepper = b.stepper().clone();
    if b.has_stages() && stepper.optimizer.is_plain() {
        return stages::train(b, &shape, lr, threads);
    }
    let Shape {
        minibatches,
        samples,
        buffer_len,
        params,
        ..
    } = shape;
    let chunks_per_batch = shape.batch.div_ceil(CHUNK);
    let workers = threads.clamp(1, chunks_per_batch);
    let workspace = b.workspace();
    let spares = &workspace.spares;
    let mut replicas: Vec<Box<dyn Replica + '_>> = (0..workers).map(|_| b.replica()).collect();
    // Each chunk's gradients (every slot's: backward needs them all), accumulated in place.
    let chunk_grads: Vec<RwLock<AlignedBuf>> = (0..chunks_per_batch)
        .map(|_| RwLock::new(spares.zeros(buffer_len)))
        .collect();
    // The params each thread adds up and updates (consecutive ranges, whole cache lines),
    // and the new values of each range, which the other threads copy.
    let share = params.div_ceil(workers).next_multiple_of(8);
    let ranges: Vec<Range<usize>> = (0..workers)
        .map(|w| (w * share).min(params)..((w + 1) * share).min(params))
        .collect();
    let updated: Vec<RwLock<AlignedBuf>> = ranges
        .iter()
        .map(|r| RwLock::new(spares.zeros(r.len())))
        .collect();
    let mut mean = spares.zeros(params);
    // The optimizer's buffers (a copy, kept only if every minibatch ran), cut as the params.
    let (optimizer, steps) = (stepper.optimizer, stepper.steps);
    let mut buffers: Vec<Vec<&mut [f64]>> = ranges.iter().map(|_| Vec::new()).collect();
    for buffer in &mut stepper.buffers {
        for (mine, part) in buffers
            .iter_mut()
            .zip(split(&mut buffer[..params], &ranges))
        {
            mine.push(part);
        }
    }
    let barrier = SpinBarrier::new(workers);
    // The first sample of the first chunk holding a non-finite number, once a thread has
    // seen one (each thread's chunks follow the previous thread's).
    let non_finite = AtomicUsize::new(usize::MAX);
    let work = |w: usize,
                replica: &mut Box<dyn Replica + '_>,
                mean: &mut [f64],
                buffers: &mut Vec<&mut [f64]>| {
        let mut losses = Vec::new();
        let mut first = 0;
        let mut converted = Vec::new();
        for (n, minibatch) in minibatches.iter().enumerate() {
            let m = minibatch.len();
            for c in chunks_of(w, m, workers) {
                let samples = c * CHUNK..((c + 1) * CHUNK).min(m);
                let x = numbers(minibatch, samples.clone(), &mut converted);
                // (Converted samples were checked before the first step.)
                if minibatch.as_numbers().is_some() && !all_finite(x) {
                    non_finite.fetch_min(first + samples.start, Ordering::Relaxed);
                    break;
                }
                let mut chunk_losses = vec![0.0; samples.len()];
                replica.accumulate(x, &mut chunk_losses, &mut write(&chunk_grads[c]));
                losses.extend(samples.zip(chunk_losses).map(|(i, l)| (first + i, l)));
            }
            barrier.wait();
            // (Every thread has checked its chunks of this minibatch; all stop alike.)
            if non_finite.load(Ordering::Relaxed) != usize::MAX {
                break;
            }
            let guards: Vec<_> = chunk_grads[..m.div_ceil(CHUNK)].iter().map(read).collect();
            let sums: Vec<&[f64]> = guards.iter().map(|g| &g[..]).collect();
            let last = n + 1 == minibatches.len();
            let mean = last.then_some(&mut *mean);
            let own = ranges[w].clone();
            let vals = replica.values_mut();
            let update = Update {
                lr,
                optimizer: (!optimizer.is_plain()).then(|| {
                    let s = Scalars::of(&optimizer, steps + n as u64 + 1, lr);
                    (&optimizer, s, &mut buffers[..])
                }),
            };
            let _ = step(&sums, own.clone(), m, update, &mut vals[own.clone()], mean);
            drop(guards);
            if workers > 1 {
                write(&updated[w]).copy_from_slice(&vals[own]);
                barrier.wait();
                for (v, range) in ranges.iter().enumerate().filter(|&(v, _)| v != w) {
                    vals[range.clone()].copy_from_slice(&read(&updated[v]));
                }
            }
            first += m;
        }
        losses
    };
    let mut means = split(&mut mean, &ranges);
    let jobs: Vec<_> = replicas
        .iter_mut()
        .zip(means.iter_mut())
        .zip(buffers.iter_mut())
        .collect();
    let done = workspace.on_threads(jobs, |w, ((r, m), o)| work(w, r, m, o));
    let losses = in_order(done, non_finite.into_inner(), samples)?;
    drop(buffers);
    if !optimizer.is_plain() {
        stepper.steps += minibatches.len() as u64;
    }
    let (chunks, last) = last_chunk(&minibatches, workers);
    let vals = replicas.swap_remove(last).into_values();
    drop(replicas);
    let mut chunk_grads: Vec<AlignedBuf> = chunk_grads.into_iter().map(into_inner).collect();
    write_back(b, &vals, &mut chunk_grads[chunks - 1], &mean);
    *b.stepper_mut() = stepper;
    let kept = chunk_grads
        .into_iter()
        .chain(updated.into_iter().map(into_inner));
    keep(&b.workspace().spares, kept.chain([vals, mean]));
    Ok(losses)
}

/// Into `b`'s buffers: the last sample's values `vals` and gradients `grads`, but params'
/// gradients the last minibatch's `mean` (written over `grads`' params).
fn write_back<B: Backend + ?Sized>(b: &mut B, vals: &[f64], grads: &mut [f64], mean: &[f64]) {
    grads[..mean.len()].copy_from_slice(mean);
    let (own_vals, own_grads) = b.buffers_mut();
    own_vals.copy_from_slice(vals);
    own_grads.copy_from_slice(grads);
}

/// Hands `bufs` to `spares` for the next call.
fn keep(spares: &Spares, bufs: impl IntoIterator<Item = AlignedBuf>) {
    for buf in bufs {
        spares.keep(buf);
    }
}

/// Samples `part` of `samples` as `train`'s numbers: where they are stored so, or else
/// converted into `converted`.
fn numbers<'a>(
    samples: &'a Samples<'_>,
    part: Range<usize>,
    converted: &'a mut Vec<f64>,
) -> &'a [f64] {
    let width = samples.width();
    if let Some(numbers) = samples.as_numbers() {
        return &numbers[part.start * width..part.end * width];
    }
    converted.resize(part.len() * width, 0.0);
    samples.fill(part, converted);
    converted
}

/// What both ways of sharing out the work start from.
struct Shape<'i> {
    /// The samples cut into minibatches of `batch` samples (the last maybe shorter).
    minibatches: Vec<Samples<'i>>,
    /// Numbers per sample; samples in all; samples per minibatch (at most `samples`).
    width: usize,
    samples: usize,
    batch: usize,
    /// Numbers per buffer (gradients are laid out as the backend's buffers: the JIT's hold
    /// fewer numbers than the tape has slots), and where params end in them (params at
    /// `0..params`, whatever else lies among them 0).
    buffer_len: usize,
    params: usize,
}

impl<'i> Shape<'i> {
    fn of<B: Backend + ?Sized>(b: &B, all: &Samples<'i>, batch: usize) -> Shape<'i> {
        let width = b.program_tape().num_inputs();
        let samples = all.len();
        let starts = (0..samples).step_by(batch);
        Shape {
            minibatches: starts
                .map(|s| all.part(s..(s + batch).min(samples)))
                .collect(),
            width,
            samples,
            batch: batch.min(samples),
            buffer_len: b.value_buffer().len(),
            params: b.params_len(),
        }
    }
}

/// The losses of `samples` samples from the workers' `(sample, loss)` pairs, or the first
/// sample of the first chunk holding a non-finite number (`usize::MAX`: none did).
fn in_order(
    done: Vec<Vec<(usize, f64)>>,
    non_finite: usize,
    samples: usize,
) -> std::result::Result<Vec<f64>, usize> {
    if non_finite != usize::MAX {
        return Err(non_finite);
    }
    let mut losses = vec![0.0; samples];
    for (i, l) in done.into_iter().flatten() {
        losses[i] = l;
    }
    Ok(losses)
}

/// The chunks (of [`CHUNK`] samples) worker `w` of `workers` takes of a minibatch of `m`
/// samples: the same number to each, in order, the last workers' fewer.
fn chunks_of(w: usize, m: usize, workers: usize) -> impl Iterator<Item = usize> + Clone {
    let chunks = m.div_ceil(CHUNK);
    let per = chunks.div_ceil(workers);
    (w * per..(w + 1) * per).take_while(move |&c| c < chunks)
}

/// How many chunks the last minibatch has, and which of `workers` ran its last chunk (the
/// last sample).
fn last_chunk(minibatches: &[Samples<'_>], workers: usize) -> (usize, usize) {
    let chunks = minibatches.last().map_or(1, Samples::len).div_ceil(CHUNK);
    (chunks, (chunks - 1) / chunks.div_ceil(workers))
}

/// How a minibatch moves its params: plain SGD at rate `lr`, or an optimizer's step (its
/// buffers over the params being updated).
pub(crate) struct Update<'a, 'b> {
    pub lr: f64,
    pub optimizer: Option<(&'a Optimizer, Scalars, &'a mut [&'b mut [f64]])>,
}

impl Update<'_, '_> {
    /// Plain SGD at rate `lr`.
    pub fn sgd(lr: f64) -> Self {
        Update {
            lr,
            optimizer: None,
        }
    }
}

/// Params `range` (whose values are `params`) after a minibatch of `m` samples whose chunks'
/// gradients are `sums`: `g` the sums added in chunk order, then `p -= (lr / m) * g` (plain
/// SGD), or the optimizer's step on the mean gradient `g / m`; and `g / m` into `mean` if
/// given. In blocks that stay in L1. Whether every new value is finite.
fn step(
    sums: &[&[f64]],
    range: Range<usize>,
    m: usize,
    mut update: Update<'_, '_>,
    params: &mut [f64],
    mut mean: Option<&mut [f64]>,
) -> bool {
    const BLOCK: usize = 256;
    let (m, scale) = (m as f64, update.lr / m as f64);
    let mut finite = true;
    let mut total = [0.0; BLOCK];
    let mut g_mean = [0.0; BLOCK];
    for start in range.clone().step_by(BLOCK) {
        let end = (start + BLOCK).min(range.end);
        // (One sum is read where it lies: the stages' rows have one.)
        let g: &[f64] = match sums {
            [only] => &only[start..end],
            [first, second, rest @ ..] => {
                let total = &mut total[..end - start];
                let (first, second) = (&first[start..end], &second[start..end]);
                for ((g, a), b) in total.iter_mut().zip(first).zip(second) {
                    *g = a + b;
                }
                for sum in rest {
                    for (g, x) in total.iter_mut().zip(&sum[start..end]) {
                        *g += x;
                    }
                }
                total
            }
            [] => unreachable!("a minibatch has a chunk"),
        };
        let at = start - range.start..end - range.start;
        let g_mean = &mut g_mean[..end - start];
        if update.optimizer.is_some() || mean.is_some() {
            for (mean, g) in g_mean.iter_mut().zip(g.iter()) {
                *mean = g / m;
            }
        }
        match update.optimizer.as_mut() {
            None => {
                for (p, g) in params[at.clone()].iter_mut().zip(g.iter()) {
                    *p -= scale * g;
                    finite &= p.is_finite();
                }
            }
            Some((optimizer, s, buffers)) => {
                let mut block: Vec<&mut [f64]> =
                    buffers.iter_mut().map(|b| &mut b[at.clone()]).collect();
                let params = &mut params[at.clone()];
                finite &= optim::update(optimizer, s, params, g_mean, &mut block);
            }
        }
        if let Some(mean) = mean.as_deref_mut() {
            mean[at].copy_from_slice(g_mean);
        }
    }
    finite
}

/// `xs` cut into `ranges` (consecutive, from 0, covering it).
fn split<'a>(mut xs: &'a mut [f64], ranges: &[Range<usize>]) -> Vec<&'a mut [f64]> {
    ranges
        .iter()
        .map(|r| {
            let (head, tail) = std::mem::take(&mut xs).split_at_mut(r.len());
            xs = tail;
            head
        })
        .collect()
}

/// A lock no thread holds while another wants it (the barrier separates them), so a
/// poisoned one still holds good numbers.
fn read(lock: &RwLock<AlignedBuf>) -> std::sync::RwLockReadGuard<'_, AlignedBuf> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write(lock: &RwLock<AlignedBuf>) -> std::sync::RwLockWriteGuard<'_, AlignedBuf> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

fn into_inner(lock: RwLock<AlignedBuf>) -> AlignedBuf {
    lock.into_inner().unwrap_or_else(|e| e.into_inner())
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

#[cfg(test)]
mod tests {
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use crate::nn::Classifier;
    use crate::{Graph, Jit, Program, Samples, Tiering};

    /// More threads than this machine may have cores (`Program` makes at most one per
    /// core): the JIT's stages on 3 and 4 threads, each a middle stage that takes sums and
    /// hands them on, give one thread's bits.
    #[test]
    fn stages_on_more_threads_than_cores_give_one_threads_bits() {
        let g = Graph::new();
        Classifier::new(&g, 24, &[12], 3, &mut StdRng::seed_from_u64(1)).unwrap();
        let width = g.num_inputs();
        let mut rng = StdRng::seed_from_u64(2);
        let inputs: Vec<f64> = (0..40)
            .flat_map(|s| {
                let mut x: Vec<f64> = (0..width).map(|_| rng.gen_range(0.0..1.0)).collect();
                x.iter_mut().take(24).step_by(3).for_each(|v| *v = 0.0);
                x[24..].fill(0.0);
                x[24 + s % 3] = 1.0;
                x
            })
            .collect();
        let samples = Samples::new().numbers(&inputs, width).unwrap();
        let run = |threads: usize| {
            let builder = Jit::builder().tiering(Tiering::Off);
            let mut jit = builder.compile(&g).unwrap();
            let losses = super::train(&mut jit, &samples, 8, 0.1, threads).unwrap();
            let bits = |v: Vec<f64>| v.into_iter().map(f64::to_bits).collect::<Vec<_>>();
            (bits(losses), bits(jit.params()))
        };
        let one = run(1);
        for threads in [3, 4] {
            assert_eq!(run(threads), one, "{threads} threads");
        }
    }
}
