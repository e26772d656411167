//! The compiler half of the JIT: each of the plan's modules emitted, verified, optimized and
//! written out as an object file, in an LLVM context of its own that is freed as soon as the
//! object exists. Modules compile side by side on [`super::JitBuilder::compile_threads`]
//! threads (an LLVM context is single-threaded, so each module gets its own); the objects come
//! back in module order, whatever the order they finished in, and `engine` links them.
//! With the persistent cache on (`cache/`), a module found there is not compiled, and one
//! compiled is stored.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use inkwell::context::Context;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{CodeModel, FileType, RelocMode, Target, TargetMachine};
use inkwell::OptimizationLevel;

use super::cache::{Digest, Sizes, Source};
use super::emit::{Emitter, HostCpu, LazyEntry, Lowered, ModuleRole};
use super::options::{JitBuilder, JitStats};
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::tape::Tape;

pub(super) fn llvm_error(stage: &'static str, message: impl ToString) -> Error {
    Error::Llvm {
        stage,
        message: message.to_string(),
    }
}

/// One module compiled: its object file, the IR text if kept, and what [`JitStats`] counts
/// of it (the stage times, functions, instructions, code bytes).
pub(super) struct Object {
    pub bytes: Vec<u8>,
    pub ir: Option<String>,
    pub stats: JitStats,
}

/// Compiles every module of `plan` on up to `threads` threads; the objects in module order,
/// or the first module's error.
pub(super) fn compile_modules(
    tape: &Tape,
    plan: &Plan,
    options: &JitBuilder,
    threads: usize,
) -> Result<Vec<Object>> {
    let roles: Vec<ModuleRole> = (0..plan.modules.len()).map(ModuleRole::Plan).collect();
    compile_roles(tape, plan, options, &roles, threads)
}

/// The module of a lazy entry point ([`ModuleRole::Lazy`]), compiled on this thread.
pub(super) fn compile_lazy(
    tape: &Tape,
    plan: &Plan,
    options: &JitBuilder,
    entry: LazyEntry,
) -> Result<Object> {
    let mut objects = compile_roles(tape, plan, options, &[ModuleRole::Lazy(entry)], 1)?;
    Ok(objects.pop().expect("one module"))
}

/// Compiles the modules `roles` of `plan` on up to `threads` threads; the objects in the
/// order of `roles`, or the first one's error.
pub(super) fn compile_roles(
    tape: &Tape,
    plan: &Plan,
    options: &JitBuilder,
    roles: &[ModuleRole],
    threads: usize,
) -> Result<Vec<Object>> {
    let cpu = host_cpu();
    let count = roles.len();
    let next = AtomicUsize::new(0);
    // Each thread takes the next module not yet taken, so a slow module does not hold
    // up the others.
    let work = || {
        let mut done = Vec::new();
        loop {
            let m = next.fetch_add(1, Ordering::Relaxed);
            if m >= count {
                return done;
            }
            if options.cancelled() {
                // (Its program is gone: the modules left are not wanted.)
                done.push((m, Err(llvm_error("compile", "called off"))));
                return done;
            }
            done.push((m, compile_module(tape, plan, options, &cpu, roles[m])));
        }
    };
    let mut results = std::thread::scope(|scope| {
        // A thread the system refuses leaves its share to the others.
        let helpers: Vec<_> = (1..threads.clamp(1, count.max(1)))
            .filter_map(|_| std::thread::Builder::new().spawn_scoped(scope, work).ok())
            .collect();
        let mut results = work();
        for helper in helpers {
            match helper.join() {
                Ok(done) => results.extend(done),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        results
    });
    results.sort_by_key(|&(m, _)| m);
    let objects: Result<Vec<Object>> = results.into_iter().map(|(_, object)| object).collect();
    evict_after(options, objects.iter().flatten());
    objects
}

/// Keeps the cache within its bound once a compile stored modules in it.
fn evict_after<'a>(options: &JitBuilder, mut objects: impl Iterator<Item = &'a Object>) {
    if let Some(source) = &options.cache_source {
        if objects.any(|o| o.stats.cache_misses > 0) {
            source.evict();
        }
    }
}

/// Module `role`'s key in the cache: the compile's, the host's and the role's.
fn cache_key(source: &Source, cpu: &HostCpu, role: ModuleRole) -> Digest {
    source.key(&[&host().0, &cpu.name, &cpu.features, &format!("{role:?}")])
}

/// Module `role` of `plan`: from the cache, else compiled in a context of its own (and
/// stored in the cache).
fn compile_module(
    tape: &Tape,
    plan: &Plan,
    options: &JitBuilder,
    cpu: &HostCpu,
    role: ModuleRole,
) -> Result<Object> {
    let cached =
        (options.cache_source.as_deref()).map(|source| (source, cache_key(source, cpu, role)));
    let dir = cached.map(|(source, _)| source.dir().to_path_buf());
    if let Some((bytes, sizes)) = cached.and_then(|(source, key)| source.load(&key)) {
        let stats = JitStats {
            functions: sizes.functions as usize,
            ir_instructions: sizes.ir_instructions as usize,
            code_bytes: sizes.code_bytes as usize,
            cache_dir: dir,
            cache_hits: 1,
            ..JitStats::default()
        };
        return Ok(Object {
            bytes,
            ir: None,
            stats,
        });
    }
    let context = Context::create();
    let object = build(&context, tape, plan, options, cpu, role);
    let start = Instant::now();
    drop(context);
    let mut object = object?;
    object.stats.codegen_secs += start.elapsed().as_secs_f64();
    if let Some((source, key)) = cached {
        let sizes = Sizes {
            functions: object.stats.functions as u64,
            ir_instructions: object.stats.ir_instructions as u64,
            code_bytes: object.stats.code_bytes as u64,
        };
        source.store(&key, &object.bytes, sizes);
        object.stats.cache_dir = dir;
        object.stats.cache_misses = 1;
    }
    Ok(object)
}

/// Emits, verifies and optimizes module `role` in `ctx`, and writes its machine code as an
/// object file. Everything it builds in `ctx` is dropped on return.
fn build(
    ctx: &Context,
    tape: &Tape,
    plan: &Plan,
    options: &JitBuilder,
    cpu: &HostCpu,
    role: ModuleRole,
) -> Result<Object> {
    let mut stats = JitStats::default();
    let start = Instant::now();
    let functions = || role.functions(plan).into_iter().map(|f| &plan.functions[f]);
    let (pipeline, scalar_lanes) = options.module_pipeline(tape, functions);
    let Lowered { module } = Emitter::new(ctx, tape, plan, cpu, role, scalar_lanes)
        .emit()
        .map_err(|e| llvm_error("IR emission", e))?;
    module
        .verify()
        .map_err(|e| llvm_error("module verification", e))?;
    stats.ir_build_secs = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let machine = host_target_machine(cpu, options.codegen_level())?;
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    if let Some(pipeline) = pipeline {
        module
            .run_passes(&pipeline, &machine, PassBuilderOptions::create())
            .map_err(|e| llvm_error("optimization", e))?;
    }
    stats.optimize_secs = start.elapsed().as_secs_f64();
    stats.ir_instructions = count_instructions(&module);
    stats.functions = module
        .get_functions()
        .filter(|f| f.count_basic_blocks() > 0)
        .count();
    let ir = options
        .keep_ir
        .then(|| module.print_to_string().to_string());

    let start = Instant::now();
    let buffer = machine
        .write_to_memory_buffer(&module, FileType::Object)
        .map_err(|e| llvm_error("code generation", e))?;
    drop(module);
    stats.code_bytes = code_bytes(&buffer);
    let bytes = buffer.as_slice().to_vec();
    stats.codegen_secs = start.elapsed().as_secs_f64();
    Ok(Object { bytes, ir, stats })
}

/// The host's CPU, asked of LLVM once per process (first on the program's thread: a
/// background compile reads it before it may enter LLVM).
pub(super) fn host_cpu() -> HostCpu {
    host().1.clone()
}

/// The host's triple and CPU ([`host_cpu`]).
fn host() -> &'static (String, HostCpu) {
    static HOST: std::sync::OnceLock<(String, HostCpu)> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        let triple = TargetMachine::get_default_triple();
        let cpu = HostCpu {
            name: TargetMachine::get_host_cpu_name().to_string(),
            features: TargetMachine::get_host_cpu_features().to_string(),
        };
        (triple.as_str().to_string_lossy().into_owned(), cpu)
    })
}

/// Whether the cache holds every module of `plan` (then the compile is a load and a link).
pub(super) fn all_cached(plan: &Plan, options: &JitBuilder) -> bool {
    let Some(source) = options.cache_source.as_deref() else {
        return false;
    };
    let cpu = host_cpu();
    (0..plan.modules.len()).all(|m| source.contains(&cache_key(source, &cpu, ModuleRole::Plan(m))))
}

/// Whether the host has AVX-512 F and VL ([`crate::plan::PlanOptions::host_avx512`]).
/// (Asked once per process: a background compile reads it before it may enter LLVM.)
pub(super) fn host_avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| host_cpu().has_avx512())
}

/// The host's target machine at `level`, for both the pass pipeline (whose cost models must
/// see the CPU the functions are stamped with) and code generation. Small code model and PIC:
/// the objects are linked by a JIT linker, so code and its constants are near each other, and
/// calls to the math functions and between modules go through stubs the linker makes.
fn host_target_machine(cpu: &HostCpu, level: OptimizationLevel) -> Result<TargetMachine> {
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| llvm_error("target lookup", e))?;
    target
        .create_target_machine(
            &triple,
            &cpu.name,
            &cpu.features,
            level,
            RelocMode::PIC,
            CodeModel::Small,
        )
        .ok_or_else(|| llvm_error("target machine", "cannot create a machine for the host"))
}

/// The bytes of machine code and constants in `object`: its text and read-only data sections,
/// which is what the linker copies into executable and read-only memory.
fn code_bytes(object: &MemoryBuffer<'_>) -> usize {
    let Ok(binary) = object.create_binary_file(None) else {
        return 0;
    };
    let Some(mut sections) = binary.get_sections() else {
        return 0;
    };
    let mut bytes = 0;
    while let Some(section) = sections.next_section() {
        let name = section
            .get_name()
            .map(std::ffi::CStr::to_bytes)
            .unwrap_or_default();
        let code = [
            &b".text"[..],
            b".rodata",
            b"__text",
            b"__const",
            b"__literal",
        ];
        if code.iter().any(|prefix| name.starts_with(prefix)) {
            bytes += section.get_size() as usize;
        }
    }
    bytes
}

fn count_instructions(module: &Module<'_>) -> usize {
    module
        .get_functions()
        .flat_map(|f| f.get_basic_block_iter())
        .map(|b| b.get_instructions().count())
        .sum()
}
