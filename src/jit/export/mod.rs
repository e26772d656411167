//! The deployment form: a program as a relocatable object file and a C header
//! ([`crate::Jit::export`]). The object holds the very code the JIT runs (the same plan,
//! emitter and pipeline), its math functions defined in it (ours as formulas, the rest as
//! calls to the C library), and a small C interface over the buffers (`c_api.rs`); every
//! other symbol is internal, so two exported models link into one binary. It needs libm
//! only: no LLVM, no tapejit, no Rust runtime.
//!
//! The object is made in four steps: plan as the JIT does (`JitBuilder::schedule_native`),
//! emit each plan module into one LLVM context and link them into one module, add the C
//! interface, then optimize and write it for the chosen target.

mod c_api;
mod header;

use std::path::{Path, PathBuf};
use std::time::Instant;

use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    ByteOrdering, CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine,
    TargetTriple,
};
use inkwell::OptimizationLevel;

use super::emit::{Emitter, HostCpu, Lowered, ModuleRole};
use super::options::JitBuilder;
use crate::error::{Error, Result};
use crate::optim::{Optimizer, State};
use crate::plan::Plan;
use crate::tape::{Slot, Tape};

/// What to export and for which machine ([`crate::Jit::export`]).
///
/// ```
/// use tapejit::{ExportOptions, ExportParams, ExportTarget};
/// let inference = ExportOptions::new("mnist"); // host CPU, params frozen in the object
/// let portable = ExportOptions::new("mnist").target(ExportTarget::Generic);
/// let trainable = ExportOptions::new("ctrl").training(true); // params in the caller's buffer
/// assert_eq!(trainable.params_mode(), ExportParams::Buffer);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct ExportOptions {
    prefix: String,
    target: ExportTarget,
    params: ExportParams,
    training: bool,
}

/// The machine the object is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportTarget {
    /// This machine's CPU and every feature it has (AVX-512 where present): the JIT's code.
    Host,
    /// The host's architecture at its baseline (x86-64: SSE2, no AVX), for any CPU of it.
    Generic,
    /// A target triple (`x86_64-unknown-linux-gnu`) and CPU (`x86-64-v3`, `znver3`) that the
    /// linked LLVM has.
    Named { triple: String, cpu: String },
}

/// Where an exported program's params live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportParams {
    /// In the object, as their values at export: `init` writes them into the workspace.
    Frozen,
    /// In the caller's hands: `set_params` and `get_params` move them, in creation order
    /// (as [`Program::params`] gives them). What training needs.
    Buffer,
}

/// What [`crate::Jit::export`] wrote.
#[derive(Clone, Debug, PartialEq)]
pub struct Exported {
    pub object: PathBuf,
    pub header: PathBuf,
    /// The `double`s of the workspace the caller passes to every function.
    pub workspace_doubles: usize,
    pub object_bytes: u64,
    /// From the call to the files written.
    pub secs: f64,
}

impl ExportOptions {
    /// Inference for the host with frozen params; symbols `prefix_init`, `prefix_forward`.
    pub fn new(prefix: impl Into<String>) -> ExportOptions {
        ExportOptions {
            prefix: prefix.into(),
            target: ExportTarget::Host,
            params: ExportParams::Frozen,
            training: false,
        }
    }

    pub fn target(mut self, target: ExportTarget) -> Self {
        self.target = target;
        self
    }

    pub fn params(mut self, params: ExportParams) -> Self {
        self.params = params;
        self
    }

    /// Also exports `step` and `train` with the program's optimizer (params then live in
    /// the caller's buffer: [`ExportParams::Buffer`]).
    pub fn training(mut self, on: bool) -> Self {
        self.training = on;
        if on {
            self.params = ExportParams::Buffer;
        }
        self
    }

    pub fn params_mode(&self) -> ExportParams {
        self.params
    }

    /// A request the program cannot honour, as the error that says why.
    fn check(&self, tape: &Tape) -> Result<()> {
        let refuse = |problem: String| Err(Error::Export { problem });
        let p = &self.prefix;
        let identifier = p
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !identifier {
            return refuse(format!("the prefix {p:?} is not a C identifier"));
        }
        if self.training {
            if self.params == ExportParams::Frozen {
                return refuse("training needs params in a buffer, not frozen".into());
            }
            if tape.num_params() == 0 {
                return refuse("training export of a program without params".into());
            }
            if tape.loss().is_none() {
                return refuse("training export of a program without a loss".into());
            }
        }
        Ok(())
    }
}

/// Where the C interface finds each number: addresses in the values buffer.
struct Layout {
    /// Numbers in each of the values and gradients buffers.
    buffer_len: usize,
    /// The params' addresses and their gaps: `0..params_len`.
    params_len: usize,
    /// The optimizer's numbers after the two buffers: its step count, then each of its
    /// buffers over `0..params_len` (trained exports only).
    state_len: usize,
    inputs: Vec<u32>,
    outputs: Vec<u32>,
    /// Per param in creation order.
    params: Vec<u32>,
    /// The loss's address, and whether it is a leaf (a param: read before the update).
    loss: Option<(u32, bool)>,
    /// The values buffer as `init` writes it, up to its last number that is not +0.
    image: Vec<f64>,
}

impl Layout {
    /// The layout of `plan` over `tape`, its image holding the constants, `program`'s
    /// params (if frozen) and its optimizer's state (if trained).
    fn of(tape: &Tape, plan: &Plan, program: &Snapshot, options: &ExportOptions) -> Self {
        let at = |s: Slot| plan.buffers.address(s) as u32;
        let mut image = plan.buffers.initial_values(tape).to_vec();
        let param_addresses: Vec<u32> = tape.param_slots().iter().map(|&s| at(s)).collect();
        for (&a, &p) in param_addresses.iter().zip(&program.params) {
            image[a as usize] = match options.params {
                ExportParams::Frozen => p,
                ExportParams::Buffer => 0.0,
            };
        }
        let (buffer_len, params_len) = (plan.buffers.buffer_len(), plan.buffers.params_len(tape));
        let optimizer = &program.optimizer;
        let state_len = match options.training && !optimizer.is_plain() {
            true => 1 + optimizer.buffer_names().len() * params_len,
            false => 0,
        };
        if state_len > 0 {
            // The state as of the export: its step count, then each buffer by address.
            image.resize(2 * buffer_len + state_len, 0.0);
            let state = &mut image[2 * buffer_len..];
            state[0] = program.state.steps as f64;
            for (b, (_, values)) in program.state.buffers.iter().enumerate() {
                for (&a, &x) in param_addresses.iter().zip(values) {
                    state[1 + b * params_len + a as usize] = x;
                }
            }
        }
        let end = image.iter().rposition(|x| x.to_bits() != 0);
        image.truncate(end.map_or(0, |i| i + 1));
        let input_base = tape.input_base();
        Layout {
            buffer_len,
            params_len,
            state_len,
            inputs: (0..tape.num_inputs())
                .map(|k| at(Slot((input_base + k) as u32)))
                .collect(),
            outputs: tape.outputs().iter().map(|&s| at(s)).collect(),
            params: param_addresses,
            loss: tape.loss().map(|s| (at(s), tape.op(s).is_leaf())),
            image,
        }
    }

    fn workspace_doubles(&self) -> usize {
        2 * self.buffer_len + self.state_len
    }
}

/// What an export takes of the program besides its tape: its numbers as of the export.
pub(super) struct Snapshot {
    /// In creation order.
    pub params: Vec<f64>,
    pub optimizer: Optimizer,
    /// The optimizer's state, in creation order.
    pub state: State,
}

/// Writes `tape` (as built) with `program`'s numbers, compiled with `builder`'s options, as
/// an object file at `path` and its header ([`crate::Jit::export`]).
pub(super) fn export(
    tape: &Tape,
    builder: &JitBuilder,
    program: &Snapshot,
    path: &Path,
    options: &ExportOptions,
) -> Result<Exported> {
    let start = Instant::now();
    options.check(tape)?;
    let header_path = path.with_extension("h");
    if header_path == path {
        let problem = format!(
            "{} is where the header goes: name the object .o",
            path.display()
        );
        return Err(Error::Export { problem });
    }
    // Writable, asked before compiling (without touching what the paths hold); a failed
    // export removes what this probe created, and leaves a file it found as it was.
    let mut created = Vec::new();
    let remove = |created: Vec<std::path::PathBuf>| {
        for p in created {
            let _ = std::fs::remove_file(p);
        }
    };
    for p in [path, header_path.as_path()] {
        let existed = p.exists();
        let probe = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(p);
        if let Err(e) = probe {
            // (The object's probe may have made a file before the header's failed.)
            remove(created);
            return Err(cannot_write(p, &e));
        }
        if !existed {
            created.push(p.to_path_buf());
        }
    }
    let exported = compile_and_write(start, tape, builder, program, path, &header_path, options);
    if exported.is_err() {
        remove(created);
    }
    exported
}

/// [`export`]'s work once the paths are known to be writable.
fn compile_and_write(
    start: Instant,
    tape: &Tape,
    builder: &JitBuilder,
    program: &Snapshot,
    path: &Path,
    header_path: &Path,
    options: &ExportOptions,
) -> Result<Exported> {
    super::engine::initialize_llvm()?;
    let machine = target_machine(&options.target, builder.codegen_level())?;
    let cpu = HostCpu {
        name: machine.get_cpu().to_string(),
        features: machine.get_feature_string().to_string_lossy().into_owned(),
    };
    let builder = JitBuilder {
        background: None,
        cache_source: None,
        ..builder.clone()
    };
    let built = tape;
    let (tape, schedule) = builder.schedule_native(built.clone())?;
    let plan = Plan::new(&tape, &schedule, builder.plan_options(cpu.has_avx512()))?;
    let layout = Layout::of(&tape, &plan, program, options);
    let optimizer = program.optimizer;
    let (pipeline, scalar_lanes) = builder.module_pipeline(&tape, || plan.functions.iter());

    let context = Context::create();
    let module = link_plan(&context, &tape, &plan, &cpu, scalar_lanes)?;
    c_api::define_math(&context, &module)?;
    let api = c_api::CApi {
        prefix: &options.prefix,
        layout: &layout,
        training: options.training,
        plain_step: optimizer.is_plain(),
        optimizer: &optimizer,
        params_mode: options.params,
        little_endian: machine.get_target_data().get_byte_ordering() == ByteOrdering::LittleEndian,
        attributes: (&cpu.name, &cpu.features),
    };
    let names = api.define(&context, &module)?;
    internalize(&module, &names);
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    module
        .verify()
        .map_err(|e| super::compiler::llvm_error("module verification", e))?;
    // The JIT's pipeline, after dropping what the interface does not reach (an inference
    // export's backward passes, the math functions no op calls).
    let pipeline = match pipeline {
        Some(functions) => format!("globaldce,{functions}"),
        None => "globaldce".to_string(),
    };
    module
        .run_passes(&pipeline, &machine, PassBuilderOptions::create())
        .map_err(|e| super::compiler::llvm_error("optimization", e))?;
    let object = machine
        .write_to_memory_buffer(&module, FileType::Object)
        .map_err(|e| super::compiler::llvm_error("code generation", e))?;
    write_replacing(path, object.as_slice())?;
    let header = header::text(
        &options.prefix,
        &layout,
        options,
        &optimizer,
        built,
        (&machine.get_triple().as_str().to_string_lossy(), &cpu.name),
    );
    write_replacing(header_path, header.as_bytes())?;
    Ok(Exported {
        object: path.to_path_buf(),
        header: header_path.to_path_buf(),
        workspace_doubles: layout.workspace_doubles(),
        object_bytes: object.get_size() as u64,
        secs: start.elapsed().as_secs_f64(),
    })
}

/// `bytes` written beside `path`, then renamed over it: a reader (a build linking the
/// object) sees the old file or the new one whole, never a part.
fn write_replacing(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = std::path::PathBuf::from(partial);
    let written = std::fs::write(&partial, bytes).and_then(|()| std::fs::rename(&partial, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        cannot_write(path, &e)
    })
}

fn cannot_write(path: &Path, e: &std::io::Error) -> Error {
    Error::Export {
        problem: format!("cannot write {}: {e}", path.display()),
    }
}

/// The machine for `target` at `level`: position-independent code (it links into a PIE or
/// a shared library), the default code model.
fn target_machine(target: &ExportTarget, level: OptimizationLevel) -> Result<TargetMachine> {
    let host = TargetMachine::get_default_triple();
    let (triple, cpu, features) = match target {
        ExportTarget::Host => (
            host,
            TargetMachine::get_host_cpu_name().to_string(),
            TargetMachine::get_host_cpu_features().to_string(),
        ),
        ExportTarget::Generic => {
            let cpu = match host.as_str().to_string_lossy().starts_with("x86_64") {
                true => "x86-64",
                false => "generic",
            };
            (host, cpu.to_string(), String::new())
        }
        ExportTarget::Named { triple, cpu } => {
            (TargetTriple::create(triple), cpu.clone(), String::new())
        }
    };
    // (Every target this LLVM build has; only the host's is initialized for the JIT.)
    Target::initialize_all(&InitializationConfig::default());
    let lacks = |why: String| Error::Export {
        problem: format!("no target {}{why}", triple.as_str().to_string_lossy()),
    };
    let found = Target::from_triple(&triple).map_err(|e| lacks(format!(": {e}")))?;
    let (machine, warned) = super::engine::with_stderr_caught(|| {
        found.create_target_machine(
            &triple,
            &cpu,
            &features,
            level,
            RelocMode::PIC,
            CodeModel::Default,
        )
    });
    if warned.contains("not a recognized processor") {
        return Err(lacks(format!(" with a CPU named {cpu:?}")));
    }
    machine.ok_or_else(|| lacks(format!(" with CPU {cpu:?}")))
}

/// Every module of `plan`, emitted in `context` for `cpu` and linked into the first
/// (`scalar_lanes`: as `JitBuilder::module_pipeline` says).
fn link_plan<'ctx>(
    context: &'ctx Context,
    tape: &Tape,
    plan: &Plan,
    cpu: &HostCpu,
    scalar_lanes: bool,
) -> Result<Module<'ctx>> {
    let emit = |m: usize| -> Result<Module<'ctx>> {
        let Lowered { module } =
            Emitter::new(context, tape, plan, cpu, ModuleRole::Plan(m), scalar_lanes)
                .emit()
                .map_err(|e| super::compiler::llvm_error("IR emission", e))?;
        Ok(module)
    };
    let first = emit(0)?;
    for m in 1..plan.modules.len() {
        first
            .link_in_module(emit(m)?)
            .map_err(|e| super::compiler::llvm_error("module linking", e))?;
    }
    Ok(first)
}

/// Makes every function and global but the C interface's `names` internal: the plan's own
/// names (`forward`, `fwd0`) would clash between two models, and internal code can be
/// inlined into the interface.
fn internalize(module: &Module<'_>, names: &[String]) {
    for f in module.get_functions() {
        let name = f.get_name().to_string_lossy();
        if f.count_basic_blocks() > 0 && !names.iter().any(|n| *n == name) {
            f.set_linkage(Linkage::Internal);
        }
    }
    for g in module.get_globals() {
        if g.get_initializer().is_some() {
            g.set_linkage(Linkage::Internal);
        }
    }
}
