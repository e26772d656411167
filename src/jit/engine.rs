//! The JIT boundary: LLVM's initialization, loading, and the native functions. This is the
//! only module with `unsafe` code.
//!
//! Compiling is a pipeline whose compiler half is temporary (`compiler`): each module is
//! emitted, optimized and written out as an object file in memory in an LLVM context of its
//! own, which is then freed (the IR text is kept only on request,
//! [`super::JitBuilder::keep_ir`]). An ORC LLJIT links the objects into executable memory; all
//! that a live [`Native`] keeps of LLVM is that LLJIT with the machine code it linked.
//!
//! **Invariant:** a [`Native`] owns the LLJIT that owns the machine code its function pointers
//! point into, and drops it only when it is dropped itself; the pointers are private and called
//! only through `&mut Native` (or `&Native` for `materialize`), so no compiled function can run
//! after its code is gone.

use std::cell::{Cell, UnsafeCell};
use std::ffi::{CStr, CString};
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::{Arc, Once};
use std::time::Instant;

use inkwell::llvm_sys::error::{LLVMDisposeErrorMessage, LLVMErrorRef, LLVMGetErrorMessage};
use inkwell::llvm_sys::orc2::lljit::{
    LLVMOrcCreateLLJIT, LLVMOrcDisposeLLJIT, LLVMOrcLLJITAddObjectFile,
    LLVMOrcLLJITGetGlobalPrefix, LLVMOrcLLJITGetMainJITDylib, LLVMOrcLLJITLookup,
    LLVMOrcLLJITMangleAndIntern, LLVMOrcOpaqueLLJIT,
};
use inkwell::llvm_sys::orc2::{
    LLVMJITEvaluatedSymbol, LLVMJITSymbolFlags, LLVMJITSymbolGenericFlags, LLVMOrcAbsoluteSymbols,
    LLVMOrcCSymbolMapPair, LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess,
    LLVMOrcDisposeMaterializationUnit, LLVMOrcJITDylibAddGenerator, LLVMOrcJITDylibDefine,
};
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::targets::{InitializationConfig, Target};

use super::compiler::{compile_modules, llvm_error};
use super::emit::LazyEntry;
use super::options::{JitBuilder, JitStats};
use crate::aligned::{AlignedBuf, Spares};
use crate::error::Result;
use crate::finite::finite_without_negative_zero;
use crate::minibatch::SplitRows;
use crate::minibatch::Workspace;
use crate::op::MathFn;
use crate::plan::{Buffers, Plan, GUARD_FINITE, GUARD_NO_NEGATIVE_ZERO};
use crate::tape::{Slot, Tape};
use strum::IntoEnumIterator;

use super::abi::{
    AccumulateFn, Entry, HeadFn, PassFn, RestFn, Signature, TailFn, TrainFn, UpdateFn,
};
use super::abi::{
    ACCUMULATE, ACC_HEAD, ACC_REST, ACC_TAIL, BACKWARD, FORWARD, MATERIALIZE, STEP, TRAIN, UPDATE,
};

/// `accumulate`'s stages where the plan splits `train`'s dot (`emit/split.rs`).
#[derive(Clone)]
struct StageFns {
    head: HeadFn,
    rest: RestFn,
    tail: TailFn,
    split: SplitRows,
}

/// Initializes the native target and sets LLVM's global codegen options, once per process.
///
/// Both options are about compile time on long straight-line blocks: the post-RA scheduler and
/// SelectionDAG's huge-region handling are superlinear there and buy no run time on this code.
pub(super) fn initialize_llvm() -> Result<()> {
    static INIT: Once = Once::new();
    static mut INIT_ERROR: Option<String> = None;
    INIT.call_once(|| {
        if let Err(e) = Target::initialize_native(&InitializationConfig::default()) {
            // SAFETY: written only here, inside call_once, before any read below.
            unsafe { INIT_ERROR = Some(e) };
            return;
        }
        let args = [
            c"tapejit",
            c"-post-RA-scheduler=false",
            c"-dag-maps-huge-region=64",
        ];
        let argv: Vec<_> = args.iter().map(|a| a.as_ptr()).collect();
        // SAFETY: argv holds NUL-terminated static strings; called once, before any pass runs.
        unsafe {
            inkwell::llvm_sys::support::LLVMParseCommandLineOptions(
                argv.len() as i32,
                argv.as_ptr(),
                std::ptr::null(),
            )
        };
    });
    // SAFETY: call_once has completed, so INIT_ERROR is no longer written.
    match unsafe { (*std::ptr::addr_of!(INIT_ERROR)).clone() } {
        Some(e) => Err(llvm_error("target initialization", e)),
        None => Ok(()),
    }
}

/// Compiled native code and everything it lives in.
pub struct Native {
    /// One value and one gradient per kept slot, where `buffers` says; the only memory the
    /// native code touches.
    vals: AlignedBuf,
    /// In a cell because reading gradients (a `&self` method) may first have to store the
    /// ones `step` deferred (`pending`).
    grads: UnsafeCell<AlignedBuf>,
    /// `step` deferred gradients to `materialize`; nothing has read `grads` since.
    pending: Cell<bool>,
    /// Where each slot lives in the buffers.
    buffers: Arc<Buffers>,
    /// The buffers in slot order, for readers of every slot ([`Native::slot_values`]), made
    /// when first asked for after the buffers changed (unless `buffers` is in place).
    in_slot_order: UnsafeCell<(Vec<f64>, Vec<f64>)>,
    /// Whether `in_slot_order` holds the buffers as they are.
    in_slot_order_fresh: Cell<bool>,
    /// Per param slot of the tape as built, its slot in the compiled tape, where the layout
    /// pass moved params ([`Native::set_moved_params`]).
    moved_params: Option<Vec<u32>>,
    /// What minibatch calls keep (replicas' values among the buffers).
    workspace: Workspace,
    /// Whether `step` defers any gradient.
    defers: bool,
    /// The numbers per sample `train` reads: the tape's `num_inputs`, which the code was
    /// compiled for.
    sample_width: usize,
    /// `train`'s guard word (see [`crate::plan::ZeroSkip`]).
    guard: ZeroSkipGuard,
    /// The optimized IR, when [`JitBuilder::keep_ir`] asked for it.
    ir: Option<String>,
    /// Pointers into `code`, which is declared (and so dropped) after them.
    entries: Entries,
    /// The machine code: its `Drop` frees it; `accumulate`'s module is added to it later.
    code: Code,
}

/// The guard word of `train` and `accumulate`: [`GUARD_FINITE`] is set only while every
/// weight whose zero products they skip is finite, [`GUARD_NO_NEGATIVE_ZERO`] only while none
/// is -0 (the bits above are `train`'s own, see `emit/sparse.rs`). `train` keeps them true
/// (after each sample the first is whether every sum its updated weights went into is
/// finite; it makes no -0 weight), `accumulate` changes no weight; anything else that may
/// change params makes the word stale, and the next call computes it again from the
/// weights.
#[derive(Clone)]
struct ZeroSkipGuard {
    weights: Vec<std::ops::Range<u32>>,
    word: i64,
    fresh: bool,
}

impl ZeroSkipGuard {
    /// The word, computed again from `vals` if it is stale.
    fn word(&mut self, vals: &[f64]) -> &mut i64 {
        if !self.fresh {
            let (mut finite, mut no_negative_zero) = (true, true);
            for r in &self.weights {
                let (f, n) = finite_without_negative_zero(&vals[r.start as usize..r.end as usize]);
                finite &= f;
                no_negative_zero &= n;
            }
            self.word = if finite { GUARD_FINITE } else { 0 }
                | if no_negative_zero {
                    GUARD_NO_NEGATIVE_ZERO
                } else {
                    0
                };
            self.fresh = true;
        }
        &mut self.word
    }
}

/// The entry points' machine code (see `emit/mod.rs` for their signatures).
struct Entries {
    forward: PassFn,
    backward: PassFn,
    update: UpdateFn,
    step: UpdateFn,
    materialize: PassFn,
    /// Linked on first use ([`Native::link`]), where the plan merges a layer.
    train: Option<TrainFn>,
    /// Linked on first use ([`Native::link`]).
    accumulate: Option<AccumulateFn>,
    /// Linked with `accumulate`, where the plan splits `train`'s dot.
    stages: Option<StageFns>,
}

// SAFETY: the LLJIT is used by one thread at a time (linked in `compile` and, once per lazy
// entry, `link` through `&mut self`, disposed in `drop`, never touched in between), ORC
// is thread-safe anyway, and the machine code keeps no thread-local state. `Native` stays
// `!Sync` through its cells.
unsafe impl Send for Native {}

/// An ORC LLJIT that has linked the objects: it owns the executable memory, the symbol table
/// and the math functions' absolute symbols, and frees them all when dropped. No LLVM context,
/// module or code generator lives in it.
struct Code {
    jit: NonNull<LLVMOrcOpaqueLLJIT>,
}

impl Drop for Code {
    fn drop(&mut self) {
        // SAFETY: `jit` came from `LLVMOrcCreateLLJIT` and is disposed exactly once, here; the
        // function pointers into its memory are dropped with (and never escape) the `Native`
        // that owns this `Code`. A disposal error is consumed: there is no one to report it to.
        let error = unsafe { LLVMOrcDisposeLLJIT(self.jit.as_ptr()) };
        let _ = take_error("LLJIT disposal", error);
    }
}

/// `Ok` for a null error; otherwise the error's message (consuming the error).
fn take_error(stage: &'static str, error: LLVMErrorRef) -> Result<()> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: `error` is a live error that nothing else consumes; `LLVMGetErrorMessage`
    // consumes it and returns a C string that we copy and then dispose once.
    let message = unsafe {
        let raw = LLVMGetErrorMessage(error);
        let message = CStr::from_ptr(raw).to_string_lossy().into_owned();
        LLVMDisposeErrorMessage(raw);
        message
    };
    Err(llvm_error(stage, message))
}

impl Code {
    /// Links `objects` into a fresh LLJIT's main library, next to absolute symbols for the
    /// math functions and, for what else the objects call (`memset`, `memcpy`), the process's
    /// own. Calls between the objects resolve by name.
    fn load(objects: impl Iterator<Item = Vec<u8>>) -> Result<Code> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: a null builder asks for the default one (host target machine, in-process
        // executor); on success `raw` is a new LLJIT that `Code` owns from here on.
        let error = unsafe { LLVMOrcCreateLLJIT(&mut raw, std::ptr::null_mut()) };
        take_error("LLJIT creation", error)?;
        let code = Code {
            jit: NonNull::new(raw).ok_or_else(|| llvm_error("LLJIT creation", "null LLJIT"))?,
        };
        code.define_math_symbols()?;
        let jit = code.jit.as_ptr();
        // SAFETY: `jit` is live. The generator is owned by the library once added.
        unsafe {
            let library = LLVMOrcLLJITGetMainJITDylib(jit);
            let mut generator = std::ptr::null_mut();
            let error = LLVMOrcCreateDynamicLibrarySearchGeneratorForProcess(
                &mut generator,
                LLVMOrcLLJITGetGlobalPrefix(jit),
                None,
                std::ptr::null_mut(),
            );
            take_error("process symbols", error)?;
            LLVMOrcJITDylibAddGenerator(library, generator);
        }
        for bytes in objects {
            code.add(bytes)?;
        }
        Ok(code)
    }

    /// Adds an object to the main library; its calls to the objects already there (and
    /// theirs to it) resolve by name when a lookup first links it.
    fn add(&self, bytes: Vec<u8>) -> Result<()> {
        let jit = self.jit.as_ptr();
        let object = MemoryBuffer::create_from_memory_range_copy(&bytes, "tapejit");
        drop(bytes);
        let buffer = object.as_mut_ptr();
        std::mem::forget(object);
        // SAFETY: `jit` is live; the buffer is owned by the LLJIT from the call on (even on
        // error), so it was forgotten above.
        let error =
            unsafe { LLVMOrcLLJITAddObjectFile(jit, LLVMOrcLLJITGetMainJITDylib(jit), buffer) };
        take_error("object loading", error)
    }

    /// Binds each [`MathFn::symbol`] to its [`MathFn::address`] in the main library, so the
    /// code calls the very functions the interpreter calls (all but the intrinsics, which
    /// are instructions).
    fn define_math_symbols(&self) -> Result<()> {
        let jit = self.jit.as_ptr();
        let exported_callable = LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsExported as u8
            | LLVMJITSymbolGenericFlags::LLVMJITSymbolGenericFlagsCallable as u8;
        let mut pairs: Vec<LLVMOrcCSymbolMapPair> = MathFn::iter()
            .filter(|f| f.intrinsic().is_none())
            .map(|f| {
                let name = CString::new(f.symbol()).expect("symbol names have no NUL");
                LLVMOrcCSymbolMapPair {
                    // SAFETY: `jit` is live and `name` a C string; the interned name comes
                    // back retained once, a reference `LLVMOrcAbsoluteSymbols` takes over.
                    Name: unsafe { LLVMOrcLLJITMangleAndIntern(jit, name.as_ptr()) },
                    Sym: LLVMJITEvaluatedSymbol {
                        Address: f.address() as u64,
                        Flags: LLVMJITSymbolFlags {
                            GenericFlags: exported_callable,
                            TargetFlags: 0,
                        },
                    },
                }
            })
            .collect();
        // SAFETY: `pairs` holds retained names and the addresses of `extern "C"` functions that
        // live as long as the process; `LLVMOrcAbsoluteSymbols` takes ownership of the names.
        // `LLVMOrcJITDylibDefine` takes the unit on success; on failure it is ours to dispose.
        unsafe {
            let unit = LLVMOrcAbsoluteSymbols(pairs.as_mut_ptr(), pairs.len());
            let error = LLVMOrcJITDylibDefine(LLVMOrcLLJITGetMainJITDylib(jit), unit);
            if !error.is_null() {
                LLVMOrcDisposeMaterializationUnit(unit);
            }
            take_error("math symbols", error)
        }
    }

    /// The entry point `entry`, under its Rust type; the first lookup links the objects.
    fn entry<F: Signature>(&self, entry: &Entry<F>) -> Result<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
        let address = self.address(entry.name)? as usize;
        // SAFETY: the emitter declared `entry.name` from `F` itself (`Emitter::begin_entry`:
        // the two buffers, then `F::PARAMS`), so the code there is a function of type `F`; a
        // function pointer is an address. It stays valid while `self` lives.
        Ok(unsafe { std::mem::transmute_copy::<usize, F>(&address) })
    }

    /// The address of the function `name` defines; the first lookup links the object.
    fn address(&self, name: &str) -> Result<u64> {
        let name = CString::new(name).expect("entry names have no NUL");
        let mut address = 0;
        // SAFETY: `jit` is live and `name` a C string; the result is written to `address`.
        let error = unsafe { LLVMOrcLLJITLookup(self.jit.as_ptr(), &mut address, name.as_ptr()) };
        take_error("symbol lookup", error)?;
        Ok(address)
    }
}

/// Whether to tell `perf` where the compiled functions are (`TAPEJIT_PERF_MAP` set in the
/// environment): a profiler otherwise sees anonymous JIT code.
fn perf_map_wanted() -> bool {
    std::env::var_os("TAPEJIT_PERF_MAP").is_some()
}

/// The name and size of every function the objects define.
fn function_symbols(objects: &[super::compiler::Object]) -> Vec<(String, u64)> {
    let mut functions = Vec::new();
    for object in objects {
        let buffer = MemoryBuffer::create_from_memory_range_copy(&object.bytes, "tapejit");
        let Ok(binary) = buffer.create_binary_file(None) else {
            continue;
        };
        let Some(mut symbols) = binary.get_symbols() else {
            continue;
        };
        while let Some(symbol) = symbols.next_symbol() {
            let name = symbol.get_name().map(|n| n.to_string_lossy().into_owned());
            if let Some(name) = name.filter(|n| !n.is_empty() && symbol.get_size() > 0) {
                functions.push((name, symbol.get_size()));
            }
        }
    }
    functions
}

/// Appends `functions` at their linked addresses to `/tmp/perf-PID.map`, the file `perf
/// report` reads to name JIT code (one `start size name` line each, in hex). Best effort: a
/// profiling aid that cannot be written changes nothing else.
fn write_perf_map(code: &Code, functions: &[(String, u64)]) {
    use std::io::Write;
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    else {
        return;
    };
    for (name, size) in functions {
        if let Ok(start) = code.address(name) {
            let _ = writeln!(file, "{start:x} {size:x} {name}");
        }
    }
}

/// Background compiles running ([`LlvmWork`]), and the signal that one ended.
static LLVM_WORK: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

/// A background compile's life: while one lives, the process waits for it at exit (LLVM's
/// globals are torn down at exit, and a compile running on would use them). At exit every
/// background compile is called off ([`super::options::EXITING`]), so the wait lasts until
/// each reaches its next stage or module. The program that started a compile does not
/// wait: dropping it calls the compile off.
pub struct LlvmWork(());

impl LlvmWork {
    pub fn begin() -> LlvmWork {
        static AT_EXIT: std::sync::Once = std::sync::Once::new();
        AT_EXIT.call_once(|| {
            extern "C" {
                fn atexit(f: extern "C" fn()) -> i32;
            }
            // (LLVM first, so that the exit handlers of what it sets up are registered
            // before this one, which then runs before them. A failure here is the
            // compile's to report.)
            let _ = initialize_llvm();
            // SAFETY: `atexit` registers a function with no arguments to run at `exit`;
            // `wait_for_llvm_work` is one, and it touches only statics.
            unsafe { atexit(wait_for_llvm_work) };
        });
        *LLVM_WORK.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        LlvmWork(())
    }
}

impl Drop for LlvmWork {
    fn drop(&mut self) {
        *LLVM_WORK.0.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        LLVM_WORK.1.notify_all();
    }
}

/// `f()`, and what LLVM wrote to the standard error meanwhile (which then goes to it after
/// all; empty where that cannot be caught). LLVM warns there of what its C API cannot
/// report: a CPU a target does not have (which, where that target then lacks a feature it
/// needs, ends the process in code generation), so an export asks before it compiles.
/// One call at a time: two would swap each other's descriptors.
#[cfg(target_os = "linux")]
pub(super) fn with_stderr_caught<T>(f: impl FnOnce() -> T) -> (T, String) {
    extern "C" {
        fn pipe2(fds: *mut i32, flags: i32) -> i32;
        fn dup(fd: i32) -> i32;
        fn dup2(from: i32, to: i32) -> i32;
        fn close(fd: i32) -> i32;
        fn read(fd: i32, buf: *mut u8, n: usize) -> isize;
        fn fcntl(fd: i32, command: i32, arg: i32) -> i32;
    }
    const O_CLOEXEC: i32 = 0o2000000;
    const O_NONBLOCK: i32 = 0o4000;
    const F_SETFL: i32 = 4;
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    use std::io::Write;
    let _ = std::io::stderr().flush();
    let mut fds = [-1i32; 2];
    // SAFETY: `pipe2` writes two descriptors into `fds` (closed in any process this one
    // starts); `dup` copies descriptor 2. Each descriptor made here is closed below, and
    // descriptor 2 is put back before `f`'s result is returned. The read end does not
    // block, so what a process started meanwhile still holds does not matter (a message
    // longer than the pipe's buffer, 64 KB, would block LLVM: its warnings are one line).
    let (saved, ok) = unsafe {
        let ok = pipe2(fds.as_mut_ptr(), O_CLOEXEC) == 0 && fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0;
        let saved = if ok { dup(2) } else { -1 };
        let ok = ok && saved >= 0 && dup2(fds[1], 2) >= 0;
        (saved, ok)
    };
    if !ok {
        // SAFETY: closes only what was opened above.
        unsafe {
            for fd in [fds[0], fds[1], saved].into_iter().filter(|&fd| fd >= 0) {
                close(fd);
            }
        }
        return (f(), String::new());
    }
    let result = f();
    let mut caught = Vec::new();
    // SAFETY: descriptor 2 is put back, then what the pipe holds is read (until it is
    // empty) into a buffer of ours as long as `read` is told, and the pipe is closed.
    unsafe {
        dup2(saved, 2);
        close(saved);
        close(fds[1]);
        let mut buf = [0u8; 4096];
        loop {
            let n = read(fds[0], buf.as_mut_ptr(), buf.len());
            if n <= 0 {
                break;
            }
            caught.extend_from_slice(&buf[..n as usize]);
        }
        close(fds[0]);
    }
    let _ = std::io::stderr().write_all(&caught);
    (result, String::from_utf8_lossy(&caught).into_owned())
}

#[cfg(not(target_os = "linux"))]
pub(super) fn with_stderr_caught<T>(f: impl FnOnce() -> T) -> (T, String) {
    (f(), String::new())
}

/// At exit: calls every background compile off and waits until none runs.
extern "C" fn wait_for_llvm_work() {
    super::options::EXITING.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut running = LLVM_WORK.0.lock().unwrap_or_else(|e| e.into_inner());
    while *running > 0 {
        running = LLVM_WORK.1.wait(running).unwrap_or_else(|e| e.into_inner());
    }
}

/// Lowers the calling thread's scheduling priority (Linux: nice 10), for a compile that runs
/// beside the program it compiles for ([`super::tiers`]): on a machine with a core to spare
/// it takes that core, on a busy one it yields to the program rather than slowing it down.
pub fn yield_to_the_program() {
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn setpriority(which: i32, who: u32, priority: i32) -> i32;
        }
        const PRIO_PROCESS: i32 = 0;
        // SAFETY: `setpriority` only changes a scheduling value; `who` 0 is the calling
        // thread on Linux (each thread is a task with its own nice value). Failure leaves
        // the priority as it was, which is harmless.
        unsafe { setpriority(PRIO_PROCESS, 0, 10) };
    }
}

/// Returns the heap memory freed with the compiler and the linker to the system (glibc keeps
/// it otherwise: gigabytes of small blocks for a million-node tape).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's `malloc_trim` only returns free pages to the kernel; it is
        // thread-safe and has no precondition.
        unsafe { malloc_trim(0) };
    }
}

impl Native {
    /// Compiles `plan`'s modules to objects on `threads` threads, frees the compiler, and
    /// links the objects; fills in `stats`.
    pub fn compile(
        tape: &Tape,
        plan: &Plan,
        options: &JitBuilder,
        threads: usize,
        stats: &mut JitStats,
    ) -> Result<Native> {
        initialize_llvm()?;
        let objects = compile_modules(tape, plan, options, threads)?;
        let start = Instant::now();
        for object in &objects {
            stats.add_module(&object.stats);
        }
        let ir = options.keep_ir.then(|| {
            let texts: Vec<&str> = objects.iter().filter_map(|o| o.ir.as_deref()).collect();
            texts.concat()
        });
        let profiled = perf_map_wanted().then(|| function_symbols(&objects));
        let code = Code::load(objects.into_iter().map(|o| o.bytes))?;
        if let Some(functions) = profiled {
            write_perf_map(&code, &functions);
        }
        let entries = Entries {
            forward: code.entry(&FORWARD)?,
            backward: code.entry(&BACKWARD)?,
            update: code.entry(&UPDATE)?,
            step: code.entry(&STEP)?,
            materialize: code.entry(&MATERIALIZE)?,
            train: None,
            accumulate: None,
            stages: None,
        };
        // The first lookup linked the objects; the linker's graph of them is gone too.
        release_free_memory();
        stats.codegen_secs += start.elapsed().as_secs_f64();
        let buffers = plan.buffers.clone();
        Ok(Native {
            vals: buffers.initial_values(tape),
            grads: UnsafeCell::new(AlignedBuf::zeros(buffers.buffer_len())),
            pending: Cell::new(false),
            buffers,
            in_slot_order: UnsafeCell::new((Vec::new(), Vec::new())),
            in_slot_order_fresh: Cell::new(false),
            moved_params: None,
            workspace: Workspace::default(),
            defers: plan.step.as_ref().is_some_and(|s| !s.deferred.is_empty()),
            sample_width: tape.num_inputs(),
            guard: ZeroSkipGuard {
                weights: plan
                    .step
                    .iter()
                    .flat_map(|s| &s.train)
                    .flat_map(|t| &t.skip_zeros)
                    .flat_map(|z| &z.weights)
                    .filter(|r| !r.is_empty())
                    // As addresses (a lined matrix's gaps hold finite +0s).
                    .map(|r| {
                        let at = |s: u32| plan.buffers.address(Slot(s)) as u32;
                        at(r.start)..at(r.end - 1) + 1
                    })
                    .collect(),
                word: 0,
                fresh: false,
            },
            ir,
            entries,
            code,
        })
    }

    /// Whether the lazy entry point `entry` is linked.
    pub fn links(&self, entry: LazyEntry) -> bool {
        match entry {
            LazyEntry::Train => self.entries.train.is_some(),
            LazyEntry::Accumulate => self.entries.accumulate.is_some(),
        }
    }

    /// Links the module of `entry` ([`super::emit::ModuleRole::Lazy`], compiled from the plan
    /// this `Native` was compiled from, whose split of `train`'s dot is `split`) next to the
    /// others.
    pub fn link(
        &mut self,
        entry: LazyEntry,
        object: super::compiler::Object,
        split: Option<&SplitRows>,
    ) -> Result<()> {
        let profiled = perf_map_wanted().then(|| function_symbols(std::slice::from_ref(&object)));
        if let (Some(ir), Some(more)) = (self.ir.as_mut(), object.ir.as_deref()) {
            ir.push_str(more);
        }
        self.code.add(object.bytes)?;
        match entry {
            LazyEntry::Train => self.entries.train = Some(self.code.entry(&TRAIN)?),
            LazyEntry::Accumulate => self.entries.accumulate = Some(self.code.entry(&ACCUMULATE)?),
        }
        if let Some(functions) = profiled {
            write_perf_map(&self.code, &functions);
        }
        if let (LazyEntry::Accumulate, Some(split)) = (entry, split) {
            // (The emitter defines the stages where the plan splits the dot, `emit/split.rs`.)
            self.entries.stages = Some(StageFns {
                head: self.code.entry(&ACC_HEAD)?,
                rest: self.code.entry(&ACC_REST)?,
                tail: self.code.entry(&ACC_TAIL)?,
                split: split.clone(),
            });
        }
        Ok(())
    }

    /// The values buffer, laid out as the plan's [`Buffers`] say.
    pub fn values(&self) -> &[f64] {
        &self.vals
    }

    /// The gradients buffer, after storing any that `step` deferred.
    pub fn grads(&self) -> &[f64] {
        self.materialize();
        // SAFETY: `materialize` has returned; from here on no `&self` method writes `grads`
        // until a `&mut self` method (which ends this borrow) sets `pending` again.
        unsafe { &*self.grads.get() }
    }

    /// Where each slot of the compiled tape lives in the buffers.
    pub fn buffers(&self) -> &Buffers {
        &self.buffers
    }

    /// Has the methods below speak the slots of the tape as built, whose param in slot `u`
    /// the compiled tape holds in slot `compiled[u]` (the layout pass moved params).
    pub fn set_moved_params(&mut self, compiled: Vec<u32>) {
        self.moved_params = Some(compiled);
        self.in_slot_order_fresh.set(false);
    }

    /// The compiled tape's slot of the built tape's slot `s`.
    pub fn compiled_slot(&self, s: Slot) -> Slot {
        match &self.moved_params {
            Some(compiled) if s.index() < compiled.len() => Slot(compiled[s.index()]),
            _ => s,
        }
    }

    /// Where the buffers hold slot `s` (of the tape as built).
    pub fn address(&self, s: Slot) -> usize {
        self.buffers.address(self.compiled_slot(s))
    }

    /// The value of kept slot `s`.
    pub fn value_at(&self, s: Slot) -> f64 {
        self.vals[self.address(s)]
    }

    /// The gradient of kept slot `s`.
    pub fn grad_at(&self, s: Slot) -> f64 {
        self.grads()[self.address(s)]
    }

    /// Every slot's value in slot order (0 for slots the buffers do not hold).
    pub fn slot_values(&self) -> &[f64] {
        if self.buffers.in_place() && self.moved_params.is_none() {
            return &self.vals;
        }
        &self.in_slot_order().0
    }

    /// Every slot's gradient in slot order (0 for slots the buffers do not hold).
    pub fn slot_grads(&self) -> &[f64] {
        if self.buffers.in_place() && self.moved_params.is_none() {
            return self.grads();
        }
        &self.in_slot_order().1
    }

    /// The buffers in slot order, made again if they changed since.
    fn in_slot_order(&self) -> &(Vec<f64>, Vec<f64>) {
        let grads = self.grads();
        if !self.in_slot_order_fresh.replace(true) {
            // SAFETY: references into `in_slot_order` are handed out only while it is fresh,
            // and only `&mut self` methods (which end those borrows) make it stale: none is
            // alive here.
            let (vals, slot_grads) = unsafe { &mut *self.in_slot_order.get() };
            self.buffers.in_slot_order(&self.vals, vals);
            self.buffers.in_slot_order(grads, slot_grads);
            if let Some(compiled) = &self.moved_params {
                for buffer in [vals, slot_grads] {
                    let params: Vec<f64> = compiled.iter().map(|&c| buffer[c as usize]).collect();
                    buffer[..params.len()].copy_from_slice(&params);
                }
            }
        }
        // SAFETY: fresh from here until a `&mut self` method, which ends this borrow.
        unsafe { &*self.in_slot_order.get() }
    }

    /// Both buffers, for writing (deferred gradients stored first).
    pub fn buffers_mut(&mut self) -> (&mut [f64], &mut [f64]) {
        self.materialize();
        self.guard.fresh = false;
        self.in_slot_order_fresh.set(false);
        (&mut self.vals, self.grads.get_mut())
    }

    /// Stores the gradients `step` deferred, if it did and they are still pending. They
    /// depend on values and sum gradients every other entry point may change, so each of
    /// them (and every reader of `grads`) calls this first.
    fn materialize(&self) {
        if self.pending.replace(false) {
            // SAFETY: as in `forward`; `materialize` only reads `vals` (so the `*mut` made
            // from a shared borrow is never written through) and writes `grads`, to which
            // no reference exists while `pending` is set: `pending` is set only by
            // `step(&mut self)`, and every path that hands out a borrow of `grads` clears it
            // (here) first.
            unsafe {
                let grads = (*self.grads.get()).as_mut_ptr();
                (self.entries.materialize)(self.vals.as_ptr() as *mut f64, grads)
            }
        }
    }

    /// Forgets deferred gradients: the caller is about to run `step`, which recomputes them.
    pub fn discard_deferred(&mut self) {
        self.pending.set(false);
    }

    /// Runs `forward` over the buffers.
    pub fn forward(&mut self) {
        let f = self.entries.forward;
        let (vals, grads) = self.buffers_mut();
        // SAFETY: the code reads and writes addresses below the buffers' length only, both
        // buffers have that length (they are never resized), and the code is alive (owned
        // by self).
        unsafe { f(vals.as_mut_ptr(), grads.as_mut_ptr()) }
    }

    /// Runs `backward` over the buffers.
    pub fn backward(&mut self) {
        let f = self.entries.backward;
        let (vals, grads) = self.buffers_mut();
        // SAFETY: as in `forward`.
        unsafe { f(vals.as_mut_ptr(), grads.as_mut_ptr()) }
    }

    /// Runs `update` over the buffers.
    pub fn update(&mut self, lr: f64) {
        let f = self.entries.update;
        let (vals, grads) = self.buffers_mut();
        // SAFETY: as in `forward`.
        unsafe { f(vals.as_mut_ptr(), grads.as_mut_ptr(), lr) }
    }

    /// Runs `train` over the samples of `inputs` and returns their losses, or the index of
    /// the first sample holding a non-finite number (`train` checks each sample right before
    /// it reads it, and stops there, the buffers mid-way); `None` if the module has no
    /// `train`, or if `inputs` is not a whole number `>= 1` of samples of the width the code
    /// was compiled for.
    pub fn train(
        &mut self,
        inputs: &[f64],
        lr: f64,
    ) -> Option<std::result::Result<Vec<f64>, usize>> {
        let train = self.entries.train?;
        let width = self.sample_width;
        let n = inputs.len().checked_div(width).filter(|&n| n >= 1)?;
        if n * width != inputs.len() {
            return None;
        }
        let mut losses = vec![0.0; n];
        let mut trained: i64 = 0;
        self.pending.set(false);
        self.in_slot_order_fresh.set(false);
        let guard: *mut i64 = self.guard.word(&self.vals);
        let (vals, grads) = (self.vals.as_mut_ptr(), self.grads.get_mut().as_mut_ptr());
        // SAFETY: as in `forward`; `train` reads `n * sample_width` numbers of `inputs` (its
        // length, checked above), writes `n` losses, reads and writes the guard word, and
        // writes how many samples it trained on.
        unsafe {
            train(
                vals,
                grads,
                lr,
                inputs.as_ptr(),
                n as i64,
                losses.as_mut_ptr(),
                guard,
                &mut trained,
            )
        }
        self.pending.set(self.defers);
        if trained as usize != n {
            // It stopped at a sample holding a non-finite number; the caller puts the
            // buffers back.
            self.guard.fresh = false;
            return Some(Err(trained as usize));
        }
        Some(Ok(losses))
    }

    /// Runs `step` (zero_grad, forward, backward, update) over the buffers. The gradients it
    /// defers replace any still pending (it recomputes every gradient).
    pub fn step(&mut self, lr: f64) {
        self.pending.set(false);
        self.guard.fresh = false;
        self.in_slot_order_fresh.set(false);
        let (vals, grads) = (self.vals.as_mut_ptr(), self.grads.get_mut().as_mut_ptr());
        // SAFETY: as in `forward`.
        unsafe { (self.entries.step)(vals, grads, lr) }
        self.pending.set(self.defers);
    }

    /// A copy of the buffers with `forward` and `backward` over them, for another thread
    /// (deferred gradients stored first).
    pub fn replica(&self) -> NativeReplica<'_> {
        NativeReplica {
            accumulate: self.entries.accumulate,
            stages: self.entries.stages.clone(),
            sample_width: self.sample_width,
            guard: ZeroSkipGuard {
                fresh: false,
                ..self.guard.clone()
            },
            vals: self.workspace.spares.copy_of(&self.vals),
            masks: Vec::new(),
            spares: &self.workspace.spares,
        }
    }

    /// What minibatch calls keep.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// Whether replicas have stages (once `accumulate` is linked).
    pub fn has_stages(&self) -> bool {
        self.entries.stages.is_some()
    }

    /// The module's IR after optimization, if it was kept.
    pub fn ir(&self) -> Option<&str> {
        self.ir.as_deref()
    }
}

/// `Native`'s `accumulate` over a values buffer of its own; it borrows the `Native`, whose
/// code it runs.
pub struct NativeReplica<'a> {
    accumulate: Option<AccumulateFn>,
    stages: Option<StageFns>,
    sample_width: usize,
    guard: ZeroSkipGuard,
    vals: AlignedBuf,
    /// `tail`'s scratch: which samples each row of the split dot takes.
    masks: Vec<u64>,
    /// The `Native`'s, which takes `vals` back when the replica is done.
    spares: &'a Spares,
}

impl Drop for NativeReplica<'_> {
    fn drop(&mut self) {
        self.spares.keep(std::mem::take(&mut self.vals));
    }
}

impl crate::minibatch::Replica for NativeReplica<'_> {
    fn stages(&mut self) -> Option<&mut dyn crate::minibatch::Stages> {
        match self.stages {
            Some(_) => Some(self),
            None => None,
        }
    }

    fn into_values(mut self: Box<Self>) -> AlignedBuf {
        std::mem::take(&mut self.vals)
    }

    fn values_mut(&mut self) -> &mut [f64] {
        self.guard.fresh = false;
        &mut self.vals
    }

    fn accumulate(&mut self, inputs: &[f64], losses: &mut [f64], grads: &mut [f64]) {
        let accumulate = self
            .accumulate
            .expect("replicas run after `prepare_replicas` linked `accumulate`");
        let n = losses.len();
        let whole = n >= 1 && inputs.len() == n * self.sample_width;
        assert!(
            whole && grads.len() == self.vals.len(),
            "checked by the caller"
        );
        let guard: *mut i64 = self.guard.word(&self.vals);
        // SAFETY: as in `Native::forward`: both buffers have the tape's length (`vals` a copy
        // of the `Native`'s, never resized; `grads` asserted above), and the code lives while
        // the borrowed `Native` does. `accumulate` reads `n` samples of `inputs` (its length,
        // asserted above), writes `n` losses, and reads the guard word. The code keeps no
        // state of its own, so replicas may run it side by side.
        unsafe {
            accumulate(
                self.vals.as_mut_ptr(),
                grads.as_mut_ptr(),
                inputs.as_ptr(),
                n as i64,
                losses.as_mut_ptr(),
                guard,
            )
        }
    }
}

impl crate::minibatch::Stages for NativeReplica<'_> {
    fn split(&self) -> &SplitRows {
        &self.stage_fns().split
    }

    fn head(
        &mut self,
        sample: &[f64],
        ahead: &[f64],
        rows: Range<usize>,
        start: Option<&[f64]>,
    ) -> &[f64] {
        let StageFns { head, split, .. } = self.stage_fns().clone();
        self.check(sample, &rows, &split);
        self.check(ahead, &rows, &split);
        if let Some(start) = start {
            self.vals[split.sums.clone()].copy_from_slice(start);
        }
        let guard: *mut i64 = self.guard.word(&self.vals);
        // SAFETY: as in `accumulate`: `vals` has the tape's length; `head` reads the
        // sample's inputs of `rows` (checked: inside the dot's steps, the sample whole) and
        // the guard word, and writes the dot's sums; it does not touch `grads`, and only
        // prefetches `ahead` (also a whole sample).
        unsafe {
            head(
                self.vals.as_mut_ptr(),
                std::ptr::null_mut(),
                sample.as_ptr(),
                guard,
                rows.start as i64,
                rows.end as i64,
                start.is_none() as i64,
                ahead.as_ptr(),
            )
        }
        &self.vals[split.sums]
    }

    fn rest(&mut self, sample: &[f64], sums: &[f64], grads: &mut [f64]) -> f64 {
        let StageFns { rest, split, .. } = self.stage_fns().clone();
        self.check(sample, &(0..0), &split);
        assert_eq!(grads.len(), self.vals.len(), "checked by the caller");
        self.vals[split.sums].copy_from_slice(sums);
        let mut loss = 0.0;
        // SAFETY: as in `accumulate`, for one sample (whole, checked) and one loss.
        unsafe {
            rest(
                self.vals.as_mut_ptr(),
                grads.as_mut_ptr(),
                sample.as_ptr(),
                &mut loss,
            )
        };
        loss
    }

    fn tail(
        &mut self,
        samples: &[f64],
        rows: Range<usize>,
        sums_grads: &[f64],
        chunk: usize,
        grads: &mut [f64],
    ) {
        let StageFns { tail, split, .. } = self.stage_fns().clone();
        let m = samples.len() / self.sample_width;
        assert!(
            m >= 1
                && samples.len() == m * self.sample_width
                && chunk.is_power_of_two()
                && chunk <= 64
                && grads.len() == self.vals.len()
                && sums_grads.len() == m * split.sums.len(),
            "checked by the caller"
        );
        self.check(&samples[..self.sample_width], &rows, &split);
        self.masks.resize(m.div_ceil(64) * split.rows, 0);
        // SAFETY: as in `head`, for `m` whole samples side by side (checked); `tail` reads
        // them, the sums' gradients (`m` samples' worth, checked) and `vals`, and stores into
        // `grads` (the tape's length, checked) the weights' gradients of `rows`, using
        // `masks` (`ceil(m / 64)` words per row of the dot) as scratch.
        unsafe {
            tail(
                self.vals.as_mut_ptr(),
                grads.as_mut_ptr(),
                samples.as_ptr(),
                m as i64,
                rows.start as i64,
                rows.end as i64,
                sums_grads.as_ptr(),
                chunk as i64,
                self.masks.as_mut_ptr(),
            )
        }
    }

    fn set_rows_finite(&mut self, finite: bool) {
        self.guard.word = if finite { GUARD_FINITE } else { 0 };
        self.guard.fresh = true;
    }
}

impl NativeReplica<'_> {
    fn stage_fns(&self) -> &StageFns {
        self.stages
            .as_ref()
            .expect("`Replica::stages` hands out only replicas with stages")
    }

    /// The stages' arguments are whole: a sample of the tape's width, steps of the dot.
    fn check(&self, sample: &[f64], rows: &Range<usize>, split: &SplitRows) {
        assert!(
            sample.len() == self.sample_width && rows.start <= rows.end && rows.end <= split.rows,
            "checked by the caller"
        );
    }
}
