//! Tiered running: what a [`super::Jit`] runs its calls on, and the hand-over from the first
//! tier (the kernel tier, [`crate::kernels`]) to native code compiled in the background.
//!
//! The hand-over happens between two calls (or between two samples of one `train` call, the
//! same numbers as separate calls), never inside a pass. It carries every number a program
//! can show or read: each value and gradient the native buffers keep (params, inputs, the
//! loss, gradients that accumulate), and the optimizer's state, moved to the native
//! addresses. Both tiers compute the interpreter's bits, so the switch is invisible but in
//! time.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use inkwell::OptimizationLevel;

use super::compiler::Object;
use super::emit::{LazyEntry, ModuleRole};
use super::engine::Native;
use super::options::{CompileState, JitBuilder, JitStats, OptLevel};
use crate::error::Result;
use crate::kernels::Kernels;
use crate::plan::{PerSlot, Plan};
use crate::tape::{Slot, Tape};

/// The code a program runs now.
pub(super) enum Engine {
    Kernels(Box<Kernels>),
    Native(Box<Compiled>),
}

/// Native code and what it was compiled from.
pub(super) struct Compiled {
    pub native: Native,
    /// The tape compiled: the tape as built, params perhaps moved ([`Native::compiled_slot`]).
    pub tape: Tape,
    /// Per compiled slot: whether the buffers hold its value ([`Plan::kept`], but local values).
    pub kept: PerSlot<bool>,
    /// Per compiled slot: whether its gradient lives in registers ([`crate::plan::local`]);
    /// empty where none does.
    pub local_grads: PerSlot<bool>,
    /// The plan and options the lazy entry points' modules are compiled from when first
    /// called ([`super::emit::ModuleRole::Lazy`]), while one is left to link.
    pub unlinked: Option<Arc<(Plan, JitBuilder)>>,
    /// A lazy entry point's module compiling on a thread of its own ([`Compiled::start_lazy`]).
    pub compiling: Option<LazyCompile>,
    /// The lazy entry points whose compile failed (bit `entry as u8`): their methods run
    /// without them (`train` as `step` per sample), and no compile starts again.
    pub failed: u8,
    /// What compiling it measured.
    pub stats: JitStats,
}

/// A lazy entry point's module compiling on a thread of its own, while the program runs its
/// calls without it (`train` steps sample by sample meanwhile: the same numbers).
pub(super) struct LazyCompile {
    entry: LazyEntry,
    handle: Option<JoinHandle<(Result<Object>, Duration)>>,
    state: Arc<CompileState>,
}

impl Drop for LazyCompile {
    /// Calls the compile off, and waits for it if it is inside LLVM (which must not run on
    /// into the process's exit): at most one module.
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            if self.state.call_off() {
                let _ = handle.join();
            }
        }
    }
}

/// A lazy entry point's module, linked: what compiling it measured, and how long it took.
pub(super) struct LinkedLazy {
    pub module: JitStats,
    pub secs: f64,
}

impl Compiled {
    /// Whether the buffers hold slot `s`'s value (a slot of the tape as built).
    pub fn keeps(&self, s: Slot) -> bool {
        let c = self.native.compiled_slot(s);
        c.index() >= self.kept.len() || self.kept.get(c.index())
    }

    /// Compiles and links lazy entry point `entry`'s module if this code has that entry and
    /// has not linked it; what compiling it measured, if it did. The plan is dropped once
    /// no lazy entry is left to link.
    pub fn link_lazy(&mut self, entry: LazyEntry) -> Result<Option<JitStats>> {
        if self.is_compiling(entry) {
            // Compiling on its thread already: waits for it.
            return Ok(self.finish_lazy(true)?.map(|linked| linked.module));
        }
        if !self.needs(entry) {
            return Ok(None);
        }
        let unlinked = self.unlinked.clone().expect("needed entries have a plan");
        let (plan, options) = &*unlinked;
        let object = super::compiler::compile_lazy(&self.tape, plan, options, entry)?;
        let module = object.stats.clone();
        self.link_object(entry, object)?;
        Ok(Some(module))
    }

    /// Compiles the modules of every lazy entry point this code has (side by side on up to
    /// `threads` threads) and links them: [`JitBuilder::compile_ahead`]. What compiling them
    /// measured, each.
    pub fn link_ahead(&mut self, threads: usize) -> Result<Vec<JitStats>> {
        let entries: Vec<LazyEntry> = LazyEntry::ALL
            .into_iter()
            .filter(|&e| self.needs(e))
            .collect();
        let Some(unlinked) = self.unlinked.clone() else {
            return Ok(Vec::new());
        };
        let (plan, options) = &*unlinked;
        let roles: Vec<ModuleRole> = entries.iter().map(|&e| ModuleRole::Lazy(e)).collect();
        let objects = super::compiler::compile_roles(&self.tape, plan, options, &roles, threads)?;
        let mut modules = Vec::new();
        for (entry, object) in entries.into_iter().zip(objects) {
            modules.push(object.stats.clone());
            self.link_object(entry, object)?;
        }
        Ok(modules)
    }

    /// Starts compiling `entry`'s module on a thread of its own, if this code has that entry
    /// and has not linked it, and no other lazy compile runs; whether one for `entry` runs
    /// now. (The thread is not lowered in priority, as native code's background compile is:
    /// the program runs slower code until it ends.)
    pub fn start_lazy(&mut self, entry: LazyEntry) -> bool {
        if self.compiling.is_some() || !self.needs(entry) {
            return self.is_compiling(entry);
        }
        let unlinked = self.unlinked.clone().expect("needed entries have a plan");
        let tape = self.tape.clone();
        let state = Arc::new(CompileState::default());
        let options = JitBuilder {
            background: Some(state.clone()),
            ..unlinked.1.clone()
        };
        // The process waits at exit for this compile (see `Background::start`).
        let work = super::engine::LlvmWork::begin();
        let spawned = std::thread::Builder::new()
            .name("tapejit-compile-lazy".into())
            .spawn(move || {
                let start = Instant::now();
                let object = match options.enter_llvm() {
                    true => super::compiler::compile_lazy(&tape, &unlinked.0, &options, entry),
                    false => Err(super::called_off()),
                };
                let took = start.elapsed();
                // (Dropped on this thread while the process still waits for it.)
                drop((tape, unlinked));
                drop(work);
                (object, took)
            });
        match spawned {
            Ok(handle) => {
                self.compiling = Some(LazyCompile {
                    entry,
                    handle: Some(handle),
                    state,
                });
                true
            }
            // (No thread to spare: the caller compiles it where it stands.)
            Err(_) => false,
        }
    }

    /// Whether `entry`'s module is compiling on a thread of its own.
    pub fn is_compiling(&self, entry: LazyEntry) -> bool {
        self.compiling.as_ref().is_some_and(|c| c.entry == entry)
    }

    /// Links the module [`Compiled::start_lazy`] compiled, if its compile has ended (or
    /// once it has, if `wait`). A failed compile is the error, and its entry is then never
    /// compiled again.
    pub fn finish_lazy(&mut self, wait: bool) -> Result<Option<LinkedLazy>> {
        let handle = self.compiling.as_ref().and_then(|c| c.handle.as_ref());
        if !handle.is_some_and(|h| wait || h.is_finished()) {
            return Ok(None);
        }
        let mut compile = self.compiling.take().expect("a compile ran");
        let entry = compile.entry;
        let handle = compile.handle.take().expect("joined once");
        let (object, took) = match handle.join() {
            Ok(done) => done,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        let linked = object.and_then(|object| {
            let module = object.stats.clone();
            self.link_object(entry, object)?;
            Ok(LinkedLazy {
                module,
                secs: took.as_secs_f64(),
            })
        });
        if linked.is_err() {
            self.failed |= 1 << entry as u8;
        }
        linked.map(Some)
    }

    /// Whether this code has lazy entry point `entry`, not linked yet, nor failed.
    fn needs(&self, entry: LazyEntry) -> bool {
        let Some((plan, _)) = self.unlinked.as_deref() else {
            return false;
        };
        self.failed & (1 << entry as u8) == 0
            && !self.native.links(entry)
            && has_entry(&self.tape, plan, entry)
    }

    /// Links `entry`'s compiled module; the plan is dropped once no lazy entry is left.
    fn link_object(&mut self, entry: LazyEntry, object: Object) -> Result<()> {
        let unlinked = self.unlinked.clone().expect("linked from a plan");
        self.native.link(entry, object, unlinked.0.split.as_ref())?;
        if !LazyEntry::ALL.into_iter().any(|e| self.needs(e)) {
            self.unlinked = None;
        }
        Ok(())
    }

    /// Whether the gradients buffer holds slot `s`'s gradient.
    pub fn keeps_grad(&self, s: Slot) -> bool {
        let c = self.native.compiled_slot(s);
        let local = c.index() < self.local_grads.len() && self.local_grads.get(c.index());
        self.keeps(s) && !local && !self.tape.drops_grad(c)
    }
}

/// Whether a program of `tape` planned as `plan` has the lazy entry point `entry`: `train`
/// where the plan merges a layer (elsewhere `train` is `step` per sample), `accumulate` where
/// the tape has a loss.
fn has_entry(tape: &Tape, plan: &Plan, entry: LazyEntry) -> bool {
    match entry {
        LazyEntry::Train => plan.step.as_ref().is_some_and(|s| s.train.is_some()),
        LazyEntry::Accumulate => tape.loss().is_some(),
    }
}

/// Links the lazy entry points the program asked for on the first tier, so that no call
/// waits for them once native code takes over (one that fails is compiled again, and its
/// error reported, when first called).
fn link_wanted(compiled: &mut Compiled, builder: &JitBuilder, wanted: &AtomicU8) {
    for entry in LazyEntry::ALL {
        let wants = wanted.load(Ordering::SeqCst) & (1 << entry as u8) != 0;
        if wants && !builder.cancelled() {
            let start = Instant::now();
            if let Ok(Some(module)) = compiled.link_lazy(entry) {
                compiled.stats.add_lazy_module(&module);
                compiled.stats.compile_secs += start.elapsed().as_secs_f64();
            }
        }
    }
}

/// What LLVM is estimated to take at pipeline level `level` and code-generator level
/// `codegen` for a plan with `straight` operations outside loops (a loop compiles once per
/// body: the rollouts of `docs/benchmarks.md`, 33k-37k nodes in loops, compile in 70 ms at
/// O2): low, a third to a sixth of what it measures on straight-line code (95-150 us per node
/// at O2 on the irregular graphs and random DAGs; 20-40 with the fast code generator, O1's or
/// `JitBuilder::codegen(O1)`; 20 at O0), so that a graph run long starts its compile early
/// rather than late.
pub(super) fn compile_estimate(
    level: OptLevel,
    codegen: OptimizationLevel,
    straight: usize,
) -> Duration {
    let per_node = match (level, codegen) {
        (OptLevel::O0, _) => Duration::from_micros(5),
        (_, OptimizationLevel::None) => Duration::from_micros(10),
        _ => Duration::from_micros(30),
    };
    Duration::from_millis(20) + per_node * straight.min(u32::MAX as usize) as u32
}

/// A native compile running on a thread of its own.
pub(super) struct Background {
    handle: Option<JoinHandle<Result<Compiled>>>,
    state: Arc<CompileState>,
    /// The lazy entry points the program asked for (bit `entry as u8`): linked before native
    /// code takes over ([`Background::want`]).
    wanted: Arc<AtomicU8>,
}

impl Background {
    /// Compiles `tape` with `builder`'s options on a new thread (the clock started at
    /// `start`); `None` if the system refuses a thread.
    pub fn start(builder: &JitBuilder, tape: Tape, start: Instant) -> Option<Background> {
        let state = Arc::new(CompileState::default());
        let wanted = Arc::new(AtomicU8::new(0));
        // (One core stays with the program, which runs on meanwhile.)
        let builder = JitBuilder {
            background: Some(state.clone()),
            compile_threads: builder.threads().saturating_sub(1).max(1),
            ..builder.clone()
        };
        // The process waits at exit for this compile (counted from before it starts, so
        // that no exit misses it), which stops at its next stage or module once the process
        // exits or its program is dropped.
        let work = super::engine::LlvmWork::begin();
        let wanted_by_program = wanted.clone();
        let handle = std::thread::Builder::new()
            .name("tapejit-compile".into())
            .spawn(move || {
                super::engine::yield_to_the_program();
                let mut compiled = builder.compile_native(tape, start);
                if let Ok(compiled) = &mut compiled {
                    link_wanted(compiled, &builder, &wanted_by_program);
                }
                // Native code nobody will run is dropped here, while the process still waits
                // for this thread. (Called off after this check, the code is dropped with the
                // thread's result, outside: a window of a few instructions.)
                let result = match builder.cancelled() {
                    true => {
                        drop(compiled);
                        Err(super::called_off())
                    }
                    false => compiled,
                };
                drop(work);
                result
            })
            .ok()?;
        Some(Background {
            handle: Some(handle),
            state,
            wanted,
        })
    }

    pub fn is_finished(&self) -> bool {
        self.handle.as_ref().map_or(true, JoinHandle::is_finished)
    }

    /// The program called a method that runs lazy entry point `entry` on native code: it is
    /// linked before native code takes over, if asked before the compile's end.
    pub fn want(&self, entry: LazyEntry) {
        self.wanted.fetch_or(1 << entry as u8, Ordering::SeqCst);
    }

    /// The program ran on the first tier for `time` more (the compile waits until that is
    /// about what it will take: [`CompileState::wait_until_worth`]).
    pub fn ran_first_tier(&self, time: Duration) {
        self.state
            .ran_first_tier(time.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// The compile's result, waiting for it (no longer deferred) if it runs still.
    pub fn join(mut self) -> Result<Compiled> {
        self.state.hurry();
        let handle = self.handle.take().expect("joined once");
        match handle.join() {
            Ok(compiled) => compiled,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for Background {
    /// Calls the compile off. One that has not entered LLVM stops at its next stage and is
    /// left to end on its own; one inside LLVM stops after the module it is on, and the
    /// program waits for it (LLVM must not run on into the process's exit).
    fn drop(&mut self) {
        if self.state.call_off() {
            if let Some(handle) = self.handle.take() {
                let _ = handle.join();
            }
        }
    }
}

/// Copies into `to`'s buffers every number of `from` that they hold: values and gradients
/// of the tape as built, slot by slot.
pub(super) fn carry_over(tape: &Tape, from: &Kernels, to: &mut Compiled) {
    // (Addresses first: `buffers_mut` borrows the native code mutably.)
    let kept: Vec<(usize, usize, bool)> = tape
        .slots()
        .filter(|&s| to.keeps(s))
        .map(|s| (s.index(), to.native.address(s), to.keeps_grad(s)))
        .collect();
    let (values, grads) = to.native.buffers_mut();
    for (s, address, keeps_grad) in kept {
        let at = from.address(Slot(s as u32));
        values[address] = from.values()[at];
        if keeps_grad {
            grads[address] = from.grads()[at];
        }
    }
}
