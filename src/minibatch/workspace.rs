//! What a program keeps from one `train_minibatches` call to the next.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::SPINS;
use crate::aligned::Spares;

/// What a program keeps from one `train_minibatches` call to the next: buffers, and the
/// threads that help the calling one.
#[derive(Debug, Default)]
pub struct Workspace {
    pub(crate) spares: Spares,
    /// A pool of as many threads as the last call's helpers, which no other code uses.
    helpers: Mutex<Option<rayon::ThreadPool>>,
}

impl Workspace {
    /// `work(w, job)` for job `w` of `jobs`, the first on this thread and each other on a
    /// thread of its own at the same time (they wait for each other); the results in order.
    pub(super) fn on_threads<J: Send, R: Send>(
        &self,
        jobs: Vec<J>,
        work: impl Fn(usize, J) -> R + Sync,
    ) -> Vec<R> {
        let helpers = jobs.len() - 1;
        let mut pool = self.helpers.lock().unwrap_or_else(|e| e.into_inner());
        if helpers > 0 && pool.as_ref().map(|p| p.current_num_threads()) != Some(helpers) {
            *pool = rayon::ThreadPoolBuilder::new()
                .num_threads(helpers)
                .thread_name(|i| format!("tapejit-minibatch-{}", i + 1))
                .build()
                .ok();
        }
        let work = &work;
        let mut done: Vec<Option<R>> = jobs.iter().map(|_| None).collect();
        let mut jobs = jobs.into_iter().zip(done.iter_mut()).enumerate();
        let (_, (first, first_done)) = jobs.next().expect("at least one worker");
        let finished = AtomicUsize::new(0);
        match pool.as_ref().filter(|_| helpers > 0) {
            // Each job gets a thread of the pool: it has one per helper, all idle. This thread
            // waits for them spinning before the scope's end: asleep there, it took some 20 us
            // to wake.
            Some(pool) => pool.in_place_scope(|s| {
                let finished = &finished;
                for (w, (job, done)) in jobs {
                    s.spawn(move |_| {
                        *done = Some(work(w, job));
                        finished.fetch_add(1, Ordering::Release);
                    });
                }
                *first_done = Some(work(0, first));
                let mut spins = 0u32;
                while finished.load(Ordering::Acquire) < helpers && spins < SPINS {
                    spins += 1;
                    std::hint::spin_loop();
                }
            }),
            // (No threads to keep, or none could be made: scoped ones, each started now.)
            None => std::thread::scope(|s| {
                for (w, (job, done)) in jobs {
                    s.spawn(move || *done = Some(work(w, job)));
                }
                *first_done = Some(work(0, first));
            }),
        }
        // A worker that panicked (it cannot: the hooks assume only what `Program` checked)
        // would leave its barrier waiting forever, so no job is missing here.
        done.into_iter().flatten().collect()
    }
}
