//! The emitter: one of a [`Plan`]'s modules -> an LLVM IR module.
//!
//! Every decision was made by the plan; the emitter only writes IR. Module `m` defines the
//! backward variants (plain and `step`'s) of the plan's functions `plan.modules[m]` and the
//! forward variants of the module before it's (`plan::functions::forward_functions`); module
//! 0 also defines the entry points, which call the other modules' functions by name (the
//! linker resolves them). `train` and `accumulate`, which only `train` and
//! minibatches run, are modules of their own ([`ModuleRole::Lazy`]) that the JIT compiles
//! when they are first called. Its state is what every function shares (context,
//! module, builder, the math-function table, tape and plan); what
//! varies per function (its buffers, `step`'s learning rate, `train`'s samples) is a
//! [`Frame`] passed down. Straight-line code (`straight.rs`) keeps values in SSA registers;
//! loops (`items.rs`) work on memory, each item kind lowered once for scalars and for vector
//! lanes (`lane_io.rs`); the entry points that train (`step.rs`) call the rest.
//!
//! The arithmetic itself is [`crate::op`]'s formulas, instantiated with [`IrArith`]: the IR
//! performs exactly the interpreter's IEEE operations in the interpreter's order.
//!
//! The entry points' names and signatures are [`super::abi`]'s: the emitter declares each
//! from its Rust type there, which the engine calls it under.

mod blocks;
mod first_layer;
mod items;
mod known;
mod lane_io;
mod local;
mod neighbours;
mod step;
mod straight;
mod vertical;

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::types::{BasicMetadataTypeEnum, FloatType};
use inkwell::values::{BasicMetadataValueEnum, FloatValue, FunctionValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use std::ops::Range;
use strum::IntoEnumIterator;

use super::abi::{Entry, Param, Signature};
use super::abi::{ACCUMULATE, BACKWARD, FORWARD, STEP_UPDATE, TRAIN, UPDATE};
pub(super) use super::ir_arith::Emit;
use super::ir_arith::{IrArith, MathTable, ScalarOrVector};
use crate::op::MathFn;
use crate::plan::lanes::VECTOR_WIDTH;
use crate::plan::memory::repeated_runs;
use crate::plan::Plan;
use crate::tape::{Slot, Tape};

/// The host CPU, stamped on every function so codegen uses its features (AVX2, FMA, ...).
#[derive(Clone)]
pub struct HostCpu {
    pub name: String,
    pub features: String,
}

impl HostCpu {
    /// Whether this CPU has AVX-512 F and VL ([`crate::plan::PlanOptions::host_avx512`]).
    pub fn has_avx512(&self) -> bool {
        ["+avx512f", "+avx512vl"]
            .iter()
            .all(|f| self.features.split(',').any(|g| g == *f))
    }
}

/// A lowered module.
pub struct Lowered<'ctx> {
    pub module: Module<'ctx>,
}

/// Which module of a plan to emit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleRole {
    /// The plan's module `m` (below `plan.modules.len()`); module 0 with the entry points but
    /// the lazy ones.
    Plan(usize),
    /// A lazy entry point and the functions only it calls, declaring the rest.
    Lazy(LazyEntry),
}

impl ModuleRole {
    /// The plan functions whose backward variants (plain and `step`'s) the module defines,
    /// and those whose forward variant it defines (`plan::functions::forward_functions`). A
    /// lazy entry point's module defines none of these: only its own variants of function 0.
    fn defines(self, plan: &Plan) -> (Range<usize>, Range<usize>) {
        match self {
            ModuleRole::Plan(m) => (
                plan.modules[m].clone(),
                crate::plan::functions::forward_functions(&plan.modules, m),
            ),
            ModuleRole::Lazy(_) => (0..0, 0..0),
        }
    }

    /// The plan functions the module defines a variant of (a lazy entry point's: function
    /// 0's).
    pub fn functions(self, plan: &Plan) -> Vec<usize> {
        match self {
            ModuleRole::Plan(_) => {
                let (backward, forward) = self.defines(plan);
                backward.chain(forward).collect()
            }
            ModuleRole::Lazy(_) => (!plan.functions.is_empty())
                .then_some(0)
                .into_iter()
                .collect(),
        }
    }
}

/// An entry point only one method runs, compiled when it first does: together they were
/// half of compiling MNIST's graph, for programs that may never call either.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LazyEntry {
    /// `train` (where the plan merges a first layer) and its merged first-layer functions:
    /// [`crate::Program::train`].
    Train,
    /// `accumulate` and its zero-skipping functions: [`crate::Program::train_minibatches`].
    Accumulate,
}

impl LazyEntry {
    pub const ALL: [LazyEntry; 2] = [LazyEntry::Train, LazyEntry::Accumulate];

    /// The entry point's name.
    pub fn name(self) -> &'static str {
        match self {
            LazyEntry::Train => TRAIN.name,
            LazyEntry::Accumulate => ACCUMULATE.name,
        }
    }
}

/// Builds the module for one plan.
pub struct Emitter<'ctx, 't> {
    context: &'ctx Context,
    module: Module<'ctx>,
    builder: Builder<'ctx>,
    /// The math functions ops call, declared in the module.
    math: MathTable<'ctx>,
    tape: &'t Tape,
    plan: &'t Plan,
    /// Which module this is and which plan functions it defines.
    scope: Scope,
    /// How its functions are written for the host.
    style: ModuleStyle,
    /// Lane vectors in registers, while a loop item is emitted ([`known`]).
    known: known::Known<'ctx>,
}

/// Which module an [`Emitter`] writes, and the plan functions it defines.
struct Scope {
    role: ModuleRole,
    /// The plan functions whose backward variants (plain and `step`'s) the module defines.
    backward: Range<usize>,
    /// The plan functions whose forward variant it defines.
    forward: Range<usize>,
}

/// How a module's functions are written for the host.
struct ModuleStyle {
    /// Every function's attributes: the host CPU and its features, `nounwind`, the stack
    /// alignment.
    attributes: Vec<Attribute>,
    /// Lanes whose slots are not adjacent are read and written one slot at a time, not by
    /// masked gathers and scatters (in modules of loop code at O2-O3, whose pass pipeline
    /// leaves SLP out: [`crate::plan::functions::loop_code`],
    /// `JitBuilder::module_pipeline`).
    scalar_lanes: bool,
}

/// What varies per function: its buffers, and what the pass it belongs to adds.
#[derive(Clone, Copy)]
pub(super) struct Frame<'ctx> {
    vals: PointerValue<'ctx>,
    grads: PointerValue<'ctx>,
    /// Its values or gradients that never leave a repetition ([`crate::plan::local`]).
    scratch: local::Scratch<'ctx>,
    pass: Pass<'ctx>,
}

/// The pass a function belongs to.
#[derive(Clone, Copy)]
enum Pass<'ctx> {
    Forward,
    /// `train`'s forward: the merged dot was computed by the previous sample's backward.
    TrainForward,
    /// Backward function `function` (`step`'s with its learning rate, if `lr`).
    Backward {
        function: usize,
        lr: Option<FloatValue<'ctx>>,
    },
    /// `train`'s backward function 0, whose merged dot also runs the next sample's forward,
    /// reading both samples' inputs from `train`'s argument.
    TrainBackward {
        lr: FloatValue<'ctx>,
        samples: Samples<'ctx>,
        /// No weight of the merged dot is -0 (in the skipping loop that the guard word's
        /// [`crate::plan::GUARD_NO_NEGATIVE_ZERO`] selects): a deferred weight's update
        /// subtracts `lr * g`, not `lr * (0 + g)`, the same number then.
        plain_updates: bool,
    },
    /// `accumulate`'s forward or backward function 0, which skips the zero inputs of
    /// `train`'s dot while `guard` (an `i64` word) says the dot's weights are finite.
    Accumulate {
        guard: PointerValue<'ctx>,
    },
    /// `acc_rest`'s forward or backward function 0: `train`'s dot is left to `acc_head` and
    /// `acc_tail` (its sums are in the buffer; its backward only adds the sums' gradients
    /// into the biases'), everything else as `Accumulate`.
    AccumulateRest,
    /// `acc_head` and `acc_tail`: `train`'s dot alone, its inputs read from `sample` (one
    /// sample of the minibatch, not copied into the buffer); the same inputs of `ahead` (the
    /// sample the next call reads) asked into the cache meanwhile, if given.
    Stage {
        sample: PointerValue<'ctx>,
        ahead: Option<PointerValue<'ctx>>,
    },
    /// `materialize` and the updates.
    Other,
}

/// What `train`'s merged dot reads besides the buffers: this sample's inputs and the
/// next's (in `train`'s argument), the guard word of its zero-skipping
/// ([`crate::plan::ZeroSkip`]), and the sample after the next, whose lines its steps ask into
/// the cache ([`Emitter::prefetch_sample_line`]).
#[derive(Clone, Copy)]
pub(super) struct Samples<'ctx> {
    this: PointerValue<'ctx>,
    next: PointerValue<'ctx>,
    guard: PointerValue<'ctx>,
    ahead: PointerValue<'ctx>,
}

/// `train`'s merged dot, as its steps see it: the frame, the dot, the lanes, the samples and
/// the products' gradients per vector.
pub(super) struct MergedDot<'a, 'ctx, V> {
    frame: Frame<'ctx>,
    dot: &'a crate::passes::schedule::DotLoop,
    reps: lane_io::Reps<'ctx>,
    samples: Samples<'ctx>,
    g_products: Vec<V>,
}

impl<'a, 'ctx, V: Clone> MergedDot<'a, 'ctx, V> {
    /// The same dot restricted to its vectors `range` (of `reps.vectors`): the columns one
    /// pass over the steps computes.
    fn columns(&self, range: std::ops::Range<usize>) -> Self {
        let mut reps = self.reps.clone();
        reps.vectors = reps.vectors[range.clone()].to_vec();
        MergedDot {
            frame: self.frame,
            dot: self.dot,
            reps,
            samples: self.samples,
            g_products: self.g_products[range].to_vec(),
        }
    }

    /// The same dot in the skipping loop that runs without -0 weights.
    fn with_plain_updates(&self) -> Self {
        let Pass::TrainBackward { lr, samples, .. } = self.frame.pass else {
            unreachable!("a merged dot is in train's backward")
        };
        MergedDot {
            frame: Frame {
                pass: Pass::TrainBackward {
                    lr,
                    samples,
                    plain_updates: true,
                },
                ..self.frame
            },
            dot: self.dot,
            reps: self.reps.clone(),
            samples: self.samples,
            g_products: self.g_products.clone(),
        }
    }
}

impl<'a, 'ctx, V> MergedDot<'a, 'ctx, V> {
    /// The same dot with the products' gradients as `g_products` (vectors for scalars).
    fn with_products<W>(self, g_products: Vec<W>) -> MergedDot<'a, 'ctx, W> {
        MergedDot {
            frame: self.frame,
            dot: self.dot,
            reps: self.reps,
            samples: self.samples,
            g_products,
        }
    }
}

impl<'ctx> Frame<'ctx> {
    /// `step`'s learning rate, in its backward.
    fn lr(&self) -> Option<FloatValue<'ctx>> {
        match self.pass {
            Pass::Backward { lr, .. } => lr,
            Pass::TrainBackward { lr, .. } => Some(lr),
            _ => None,
        }
    }

    /// Whether deferred weights' updates may skip the `0 +` (see [`Pass::TrainBackward`]).
    fn plain_updates(&self) -> bool {
        matches!(
            self.pass,
            Pass::TrainBackward {
                plain_updates: true,
                ..
            }
        )
    }

    /// Whether this is `step`'s (or `train`'s) backward.
    fn steps(&self) -> bool {
        self.lr().is_some()
    }

    /// The backward function being emitted (`train`'s merged one is function 0).
    fn function(&self) -> usize {
        match self.pass {
            Pass::Backward { function, .. } => function,
            _ => 0,
        }
    }
}

/// A function an entry point calls: with `vals` and `second`, and `lr` if it takes one.
#[derive(Clone, Copy)]
pub(super) struct Part<'ctx> {
    f: FunctionValue<'ctx>,
    second: Buf,
    lr: bool,
}

/// The buffer a function takes as its second argument (the first is always `vals`).
#[derive(Clone, Copy)]
enum Buf {
    Vals,
    Grads,
}

impl<'ctx, 't> Emitter<'ctx, 't> {
    /// The emitter of the plan's module `role`.
    pub fn new(
        context: &'ctx Context,
        tape: &'t Tape,
        plan: &'t Plan,
        cpu: &HostCpu,
        role: ModuleRole,
        scalar_lanes: bool,
    ) -> Self {
        let (backward, forward) = role.defines(plan);
        let name = match role {
            ModuleRole::Plan(_) => format!("tapejit{}", backward.start),
            ModuleRole::Lazy(entry) => format!("tapejit_{}", entry.name()),
        };
        let module = context.create_module(&name);
        let f64_type = context.f64_type();
        let math = MathFn::iter()
            .filter(|m| m.intrinsic().is_none())
            .map(|m| {
                let params = vec![f64_type.into(); m.arity()];
                let f = module.add_function(m.symbol(), f64_type.fn_type(&params, false), None);
                // memory(none): pure, so LLVM may CSE, hoist or drop calls, never reorder
                // results.
                for (attr, val) in [("memory", 0), ("nounwind", 0), ("willreturn", 0)] {
                    let kind = Attribute::get_named_enum_kind_id(attr);
                    f.add_attribute(
                        AttributeLoc::Function,
                        context.create_enum_attribute(kind, val),
                    );
                }
                (m, f)
            })
            .collect();
        let fn_attributes = vec![
            context.create_string_attribute("target-cpu", &cpu.name),
            context.create_string_attribute("target-features", &cpu.features),
            context.create_enum_attribute(Attribute::get_named_enum_kind_id("nounwind"), 0),
            // Every function's frame on a cache line: a 512-bit register spilled in a loop
            // otherwise lands wherever the caller's stack pointer put it, and where its 64
            // bytes cross a line the reload cannot take the spilled value from the store
            // and waits for it to reach the cache, every iteration (`train()` on MNIST: one
            // process in two ran 30-40% slow, perf on one `vsubpd` reading the spill).
            context.create_enum_attribute(Attribute::get_named_enum_kind_id("alignstack"), 64),
        ];
        Emitter {
            context,
            module,
            builder: context.create_builder(),
            math,
            tape,
            plan,
            scope: Scope {
                role,
                backward,
                forward,
            },
            style: ModuleStyle {
                attributes: fn_attributes,
                scalar_lanes,
            },
            known: known::Known::default(),
        }
    }

    /// The IR type of a number.
    fn f64_type(&self) -> FloatType<'ctx> {
        self.context.f64_type()
    }

    /// Emits the module's functions (and, in module 0, the entry points) and hands the
    /// module over.
    pub fn emit(self) -> Emit<Lowered<'ctx>> {
        let forward = self.forward_parts("fwd", Pass::Forward)?;
        match self.scope.role {
            ModuleRole::Lazy(LazyEntry::Accumulate) => {
                let backward = self.backward_parts("bwd", false)?;
                if self.tape.loss().is_some() {
                    self.accumulate(&forward, &backward)?;
                    self.split_entries(&forward, &backward)?;
                }
                return Ok(Lowered {
                    module: self.module,
                });
            }
            ModuleRole::Lazy(LazyEntry::Train) => {
                let train = self.plan.step.as_ref().and_then(|s| s.train.as_ref());
                if let Some(train) = train {
                    let step_backward = self.backward_parts("step_bwd", true)?;
                    // Module 0 defines `step`'s update.
                    let update = Part {
                        f: self.declare_entry(&STEP_UPDATE, false),
                        second: Buf::Grads,
                        lr: true,
                    };
                    self.train(train, &forward, &step_backward, update)?;
                }
                return Ok(Lowered {
                    module: self.module,
                });
            }
            ModuleRole::Plan(_) => {}
        }
        let backward = self.backward_parts("bwd", false)?;
        let step_backward = match self.plan.step {
            Some(_) => self.backward_parts("step_bwd", true)?,
            None => Vec::new(),
        };
        if !self.entries() {
            return Ok(Lowered {
                module: self.module,
            });
        }
        self.driver(&FORWARD, &forward)?;
        self.driver(&BACKWARD, &backward)?;
        let update = self.update_function(&UPDATE, None)?;
        self.step_entries(&forward, &backward, &step_backward, update)?;
        Ok(Lowered {
            module: self.module,
        })
    }

    /// Whether this module defines the entry points but the lazy ones (module 0 does).
    fn entries(&self) -> bool {
        self.scope.role == ModuleRole::Plan(0)
    }

    /// Whether this is a lazy entry's module.
    fn is_lazy(&self) -> bool {
        matches!(self.scope.role, ModuleRole::Lazy(_))
    }

    /// The plan functions this module defines or calls (of a variant defined for `own`):
    /// all of them where entry points are (they call each), `own` elsewhere.
    fn visible(&self, own: &Range<usize>) -> Range<usize> {
        if self.entries() || self.is_lazy() {
            0..self.plan.functions.len()
        } else {
            own.clone()
        }
    }

    /// The forward functions this module sees, in order: defined here or declared.
    fn forward_parts(&self, prefix: &str, pass: Pass<'ctx>) -> Emit<Vec<Part<'ctx>>> {
        let visible = match pass {
            // `train`'s forward differs in function 0 only.
            Pass::TrainForward => 0..1,
            _ => self.visible(&self.scope.forward),
        };
        visible
            .map(|k| self.forward_function(k, &format!("{prefix}{k}"), pass))
            .collect()
    }

    /// `{prefix}{k}`: computes and stores the values of the function's slots, in slot order.
    ///
    /// A function of straight-line code only gets `vals` twice, loading through the first
    /// pointer (slots before the function) and storing through the second (its own slots):
    /// the two sets are disjoint, so both pointers may be `noalias`, and code generation
    /// need not order every load after every store (4-6x faster codegen at O2). A function
    /// with loops reads what it stored, so it takes `(vals, grads)`.
    fn forward_function(&self, k: usize, name: &str, pass: Pass<'ctx>) -> Emit<Part<'ctx>> {
        let items = &self.plan.functions[k];
        // A sum part that continues one reads its own slot: not through the other pointer.
        let straight_only = items.iter().all(|i| match i {
            Item::Straight(_) => true,
            Item::SumPart { args, .. } => args.start == 0,
            _ => false,
        });
        let part = Part {
            f: self.declare_function(name, &[], false),
            second: if straight_only { Buf::Vals } else { Buf::Grads },
            lr: false,
        };
        // `train`'s forward lives in `train`'s module.
        let defined = match pass {
            Pass::TrainForward => self.scope.role == ModuleRole::Lazy(LazyEntry::Train),
            _ => self.scope.forward.contains(&k),
        };
        if !defined {
            return Ok(part);
        }
        let f = self.begin_body(part.f);
        let (vals, second) = self.buffers(f);
        let out = if straight_only {
            second.set_name("out");
            second
        } else {
            vals
        };
        let frame = Frame {
            vals,
            grads: second,
            scratch: self.value_scratch(k)?,
            pass,
        };
        self.forward_body(frame, out, items)?;
        Ok(part)
    }

    /// The forward walk over a function's items, storing straight-line values through `out`.
    fn forward_body(
        &self,
        frame: Frame<'ctx>,
        out: PointerValue<'ctx>,
        items: &[Item],
    ) -> Emit<()> {
        let vals = frame.vals;
        let mut chunk = straight::ForwardChunk::default();
        for item in items {
            match item {
                Item::Straight(range) => self.straight_forward(&mut chunk, vals, out, range)?,
                Item::SumPart { slot, args } => {
                    self.sum_part_forward(&mut chunk, vals, out, *slot, args)?
                }
                loop_item => self.item_forward(frame, loop_item)?,
            }
        }
        self.builder.build_return(None)?;
        Ok(())
    }

    /// The backward pass as parts (none without a loss): `{prefix}_init`, the functions from
    /// the last, `{prefix}_rest`; `step`'s if `steps`. Outside module 0: only the module's
    /// own functions.
    fn backward_parts(&self, prefix: &str, steps: bool) -> Emit<Vec<Part<'ctx>>> {
        let mut parts = Vec::new();
        if self.tape.loss().is_none() {
            return Ok(parts);
        }
        let part = |f, lr| Part {
            f,
            second: Buf::Grads,
            lr,
        };
        // Module 0 defines `init` and `rest`; a lazy entry's module calls them.
        let declared = |name: String| self.declare_function(&name, &[], false);
        if self.entries() {
            parts.push(part(self.backward_init(prefix, steps)?, false));
        } else if self.is_lazy() {
            parts.push(part(declared(format!("{prefix}_init")), false));
        }
        for k in self.visible(&self.scope.backward).rev() {
            let f = self.backward_function(&format!("{prefix}{k}"), k, steps)?;
            parts.push(part(f, steps));
        }
        if self.entries() {
            parts.push(part(self.backward_rest(prefix, steps)?, false));
        } else if self.is_lazy() {
            parts.push(part(declared(format!("{prefix}_rest")), false));
        }
        Ok(parts)
    }

    /// `{prefix}{k}`: backward function `k` (`step`'s, taking `lr`, if `steps`); declared
    /// only, if another module defines it.
    fn backward_function(
        &self,
        name: &str,
        function: usize,
        steps: bool,
    ) -> Emit<FunctionValue<'ctx>> {
        let f = self.declare_function(name, &self.lr_param(steps), false);
        if !self.scope.backward.contains(&function) {
            return Ok(f);
        }
        self.begin_body(f);
        let (vals, grads) = self.buffers(f);
        let lr = f.get_nth_param(2).map(|lr| lr.into_float_value());
        let frame = Frame {
            vals,
            grads,
            scratch: local::Scratch::Backward(None),
            pass: Pass::Backward { function, lr },
        };
        self.backward_body(frame, &self.plan.functions[function])?;
        Ok(f)
    }

    /// The backward walk over a function's items in reverse order. Straight-line gradients
    /// live in registers until a loop (which works on memory) or the end of the function
    /// needs them stored; a nest's repetition keeps its own in the function's scratch.
    fn backward_body(&self, frame: Frame<'ctx>, items: &[Item]) -> Emit<()> {
        let frame = Frame {
            scratch: self.grad_scratch(frame.function())?,
            ..frame
        };
        let mut chunk = straight::BackwardChunk::default();
        for item in items.iter().rev() {
            match item {
                Item::Straight(range) => self.straight_backward(&mut chunk, frame, range)?,
                Item::SumPart { slot, args } => {
                    self.sum_part_backward(&mut chunk, frame, *slot, args)?
                }
                loop_item => {
                    self.store_grads(&mut chunk, frame.grads)?;
                    self.item_backward(frame, loop_item)?;
                }
            }
        }
        self.store_grads(&mut chunk, frame.grads)?;
        straight::erase_unused_loads(chunk.values.values());
        self.builder.build_return(None)?;
        Ok(())
    }

    /// `{prefix}_init`: zeroes the gradients loops accumulate in memory (they have no
    /// registers to start from 0 in) but those whose first addition stores
    /// ([`crate::plan::memory::Addition`]), and sets the loss's to 1 if it is among them.
    fn backward_init(&self, prefix: &str, steps: bool) -> Emit<FunctionValue<'ctx>> {
        let f = self.begin_function(&format!("{prefix}_init"), &[], false);
        let (_, grads) = self.buffers(f);
        let zeroed = |s: usize| self.plan.grads.zeroed(self.tape, Slot(s as u32), steps);
        self.zero_grads_where(grads, self.tape.len(), zeroed)?;
        if let Some(loss) = self.tape.loss().filter(|l| zeroed(l.index())) {
            self.store_slot(grads, loss, self.f64_type().const_float(1.0))?;
        }
        self.builder.build_return(None)?;
        Ok(f)
    }

    /// `{prefix}_rest`: what no function stored: 1 for a loss no node computes (a leaf), 0
    /// for every other kept slot outside the gradient cone (params only in `step`).
    fn backward_rest(&self, prefix: &str, steps: bool) -> Emit<FunctionValue<'ctx>> {
        let f = self.begin_function(&format!("{prefix}_rest"), &[], false);
        let (_, grads) = self.buffers(f);
        let step = self.plan.step.as_ref().filter(|_| steps);
        let memory = &self.plan.grads;
        if let Some(loss) = (self.tape.loss()).filter(|_| memory.loss_needs_one(self.tape, step)) {
            self.store_slot(grads, loss, self.f64_type().const_float(1.0))?;
        }
        let zero = |s| memory.unstored(self.tape, &self.plan.kept, step, s);
        self.zero_grads_where(grads, self.tape.len(), zero)?;
        self.builder.build_return(None)?;
        Ok(f)
    }

    /// A `void name(ptr noalias vals, ptr noalias grads, extra...)` with its entry block
    /// selected; `noinline` unless `inline`.
    fn begin_function(
        &self,
        name: &str,
        extra: &[BasicMetadataTypeEnum<'ctx>],
        inline: bool,
    ) -> FunctionValue<'ctx> {
        self.begin_body(self.declare_function(name, extra, inline))
    }

    /// [`Emitter::begin_function`] for an entry point (or a function of its convention),
    /// its parameters from [`super::abi`].
    fn begin_entry<F: Signature>(&self, entry: &Entry<F>, inline: bool) -> FunctionValue<'ctx> {
        self.begin_body(self.declare_entry(entry, inline))
    }

    /// [`Emitter::declare_function`] for an entry point (or a function of its convention).
    fn declare_entry<F: Signature>(&self, entry: &Entry<F>, inline: bool) -> FunctionValue<'ctx> {
        let ptr = self.context.ptr_type(Default::default());
        let params: Vec<BasicMetadataTypeEnum<'ctx>> = (entry.params().iter())
            .map(|p| match p {
                Param::Ptr => ptr.into(),
                Param::F64 => self.f64_type().into(),
                Param::I64 => self.context.i64_type().into(),
            })
            .collect();
        self.declare_function(entry.name, &params, inline)
    }

    /// The declaration of [`Emitter::begin_function`]'s function, without a body (which
    /// makes it a call to a function another module defines).
    fn declare_function(
        &self,
        name: &str,
        extra: &[BasicMetadataTypeEnum<'ctx>],
        inline: bool,
    ) -> FunctionValue<'ctx> {
        let ptr = self.context.ptr_type(Default::default());
        let params: Vec<BasicMetadataTypeEnum> = [ptr.into(), ptr.into()]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let ty = self.context.void_type().fn_type(&params, false);
        let f = self.module.add_function(name, ty, None);
        for &a in &self.style.attributes {
            f.add_attribute(AttributeLoc::Function, a);
        }
        let enum_attribute = |name| {
            self.context
                .create_enum_attribute(Attribute::get_named_enum_kind_id(name), 0)
        };
        for i in 0..2 {
            f.add_attribute(AttributeLoc::Param(i), enum_attribute("noalias"));
        }
        if !inline {
            f.add_attribute(AttributeLoc::Function, enum_attribute("noinline"));
        }
        f
    }

    /// Gives `f` its entry block and selects it.
    fn begin_body(&self, f: FunctionValue<'ctx>) -> FunctionValue<'ctx> {
        f.get_nth_param(0).unwrap().set_name("vals");
        f.get_nth_param(1).unwrap().set_name("grads");
        let entry = self.context.append_basic_block(f, "entry");
        self.builder.position_at_end(entry);
        f
    }

    /// The parameter list after the buffers: `double lr` if `with_lr`.
    fn lr_param(&self, with_lr: bool) -> Vec<BasicMetadataTypeEnum<'ctx>> {
        if with_lr {
            vec![self.f64_type().into()]
        } else {
            Vec::new()
        }
    }

    fn buffers(&self, f: FunctionValue<'ctx>) -> (PointerValue<'ctx>, PointerValue<'ctx>) {
        let vals = f.get_nth_param(0).unwrap().into_pointer_value();
        let grads = f.get_nth_param(1).unwrap().into_pointer_value();
        (vals, grads)
    }

    /// `&buf[index]` for an index the plan proved inside the buffer.
    fn element_ptr(
        &self,
        buf: PointerValue<'ctx>,
        index: IntValue<'ctx>,
    ) -> Emit<PointerValue<'ctx>> {
        // SAFETY: (of the GEP, not of Rust code) `Plan::verify` checked that every slot a
        // function forms lies below the tape length, the buffers' length.
        unsafe {
            self.builder
                .build_in_bounds_gep(self.f64_type(), buf, &[index], "")
        }
    }

    /// `&buf[slot]`, at its address.
    fn slot_ptr(&self, buf: PointerValue<'ctx>, slot: Slot) -> Emit<PointerValue<'ctx>> {
        let address = self.plan.buffers.address(slot) as u64;
        let index = self.context.i64_type().const_int(address, false);
        self.element_ptr(buf, index)
    }

    fn load_slot(&self, buf: PointerValue<'ctx>, slot: Slot, name: &str) -> Emit<FloatValue<'ctx>> {
        let ptr = self.slot_ptr(buf, slot)?;
        Ok(self
            .builder
            .build_load(self.f64_type(), ptr, name)?
            .into_float_value())
    }

    fn store_slot(&self, buf: PointerValue<'ctx>, slot: Slot, v: FloatValue<'ctx>) -> Emit<()> {
        let ptr = self.slot_ptr(buf, slot)?;
        self.builder.build_store(ptr, v)?;
        Ok(())
    }

    /// Scalar arithmetic without fast-math flags: straight-line code is always exact.
    fn scalar_arith(&self) -> IrArith<'_, 'ctx> {
        IrArith::new(&self.builder, &self.module, self.f64_type(), &self.math)
    }

    /// Zeroes the gradients of the slots (among the first `slots`) where `which` holds, in
    /// a loop where runs repeat at a stride ([`repeated_runs`]): a run of up to
    /// [`Tactics::inline_zeros`](crate::plan::tactics::Tactics::inline_zeros) slots as stores of zero vectors, a longer one as a memset (which code
    /// generation makes a call to the C library's above a few hundred bytes: in a loop over
    /// 100 copies that call cost more than the stores).
    fn zero_grads_where(
        &self,
        grads: PointerValue<'ctx>,
        slots: usize,
        which: impl Fn(usize) -> bool,
    ) -> Emit<()> {
        let zero = self.context.i8_type().const_zero();
        let i64t = self.context.i64_type();
        for block in repeated_runs(&self.plan.buffers.compact_bridged(self.tape, slots, which)) {
            let stride = i64t.const_int(block.stride as u64, false);
            let no_carried: &[FloatValue<'ctx>] = &[];
            self.emit_loop(block.count, false, no_carried, |this, c, _| {
                let shift = this.builder.build_int_mul(c, stride, "shift")?;
                for run in &block.runs {
                    let at = |slot: u32| {
                        let start = i64t.const_int(slot as u64, false);
                        let index = this.builder.build_int_add(start, shift, "run")?;
                        this.element_ptr(grads, index)
                    };
                    if run.len() > self.plan.tactics.inline_zeros {
                        let bytes = i64t.const_int(8 * run.len() as u64, false);
                        this.builder.build_memset(at(run.start)?, 8, zero, bytes)?;
                        continue;
                    }
                    let mut slot = run.start;
                    while slot < run.end {
                        let width = VECTOR_WIDTH.min(run.end - slot);
                        let zeros = this.f64_type().vec_type(width).const_zero();
                        this.store_vector(at(slot)?, zeros)?;
                        slot += width;
                    }
                }
                Ok(Vec::new())
            })?;
        }
        Ok(())
    }

    /// An entry point that calls `parts` in order (taking `lr` if `with_lr`).
    fn driver<F: Signature>(&self, entry: &Entry<F>, parts: &[Part<'ctx>]) -> Emit<()> {
        let f = self.begin_entry(entry, true);
        let (vals, grads) = self.buffers(f);
        let lr = f.get_nth_param(2).map(|lr| lr.into_float_value());
        self.calls(parts, vals, grads, lr)?;
        self.builder.build_return(None)?;
        Ok(())
    }

    /// Calls `parts` in order on the buffers (with `lr` where a part takes it).
    fn calls(
        &self,
        parts: &[Part<'ctx>],
        vals: PointerValue<'ctx>,
        grads: PointerValue<'ctx>,
        lr: Option<FloatValue<'ctx>>,
    ) -> Emit<()> {
        for part in parts {
            let second = match part.second {
                Buf::Vals => vals,
                Buf::Grads => grads,
            };
            let mut args: Vec<BasicMetadataValueEnum> = vec![vals.into(), second.into()];
            if let Some(lr) = lr.filter(|_| part.lr) {
                args.push(lr.into());
            }
            self.builder.build_call(part.f, &args, "")?;
        }
        Ok(())
    }

    /// Emits `for t in 0..len` (or `(0..len).rev()`) around `body` (which may emit loops of
    /// its own); `body` gets `t` and the carried values and returns their next values.
    /// Returns the carried values after the last iteration. For an item's elements: a loop
    /// of at most [`Tactics::unrolled_iterations`](crate::plan::tactics::Tactics::unrolled_iterations) is its iterations one after the other, each with
    /// `t` a constant.
    fn emit_loop<V: ScalarOrVector<'ctx>>(
        &self,
        len: u32,
        descending: bool,
        carried: &[V],
        mut body: impl FnMut(&Self, IntValue<'ctx>, &[V]) -> Emit<Vec<V>>,
    ) -> Emit<Vec<V>> {
        let i64t = self.context.i64_type();
        if len > self.plan.tactics.unrolled_iterations {
            return self.loop_to(i64t.const_int(len as u64, false), descending, carried, body);
        }
        let mut values = carried.to_vec();
        for k in 0..len {
            let t = if descending { len - 1 - k } else { k };
            values = body(self, i64t.const_int(t as u64, false), &values)?;
        }
        Ok(values)
    }

    /// [`Emitter::emit_loop`] over the repetitions of a nest or its groups of lanes, whose
    /// bodies may be large: a loop unless there is one repetition (then `t` = 0).
    fn emit_repetitions(
        &self,
        count: u32,
        descending: bool,
        mut body: impl FnMut(&Self, IntValue<'ctx>) -> Emit<()>,
    ) -> Emit<()> {
        let i64t = self.context.i64_type();
        if count == 1 {
            return body(self, i64t.const_zero());
        }
        let no_carried: &[FloatValue<'ctx>] = &[];
        let end = i64t.const_int(count as u64, false);
        self.loop_to(end, descending, no_carried, |this, j, _| {
            body(this, j)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// [`Emitter::emit_loop`] for `end` iterations, `end` at least 1 (maybe known only at
    /// run time).
    fn loop_to<V: ScalarOrVector<'ctx>>(
        &self,
        end: IntValue<'ctx>,
        descending: bool,
        carried: &[V],
        mut body: impl FnMut(&Self, IntValue<'ctx>, &[V]) -> Emit<Vec<V>>,
    ) -> Emit<Vec<V>> {
        let i64t = self.context.i64_type();
        let one = i64t.const_int(1, false);
        let entry = self
            .builder
            .get_insert_block()
            .expect("positioned in a function");
        let f = entry.get_parent().expect("the block is in a function");
        let start = if descending {
            self.builder.build_int_sub(end, one, "last")?
        } else {
            i64t.const_zero()
        };
        let header = self.context.append_basic_block(f, "loop");
        let exit = self.context.append_basic_block(f, "exit");
        self.builder.build_unconditional_branch(header)?;

        self.builder.position_at_end(header);
        let t = self.builder.build_phi(i64t, "t")?;
        let phis = carried
            .iter()
            .map(|c| {
                let ty = c.as_basic_value_enum().get_type();
                self.builder.build_phi(ty, "carried")
            })
            .collect::<Emit<Vec<_>>>()?;
        let t_value = t.as_basic_value().into_int_value();
        let current: Vec<V> = phis
            .iter()
            .map(|p| V::from_basic(p.as_basic_value()))
            .collect();
        let next_carried = body(self, t_value, &current)?;
        let (next, more) = if descending {
            let next = self.builder.build_int_sub(t_value, one, "t_next")?;
            let more = self.builder.build_int_compare(
                IntPredicate::NE,
                t_value,
                i64t.const_zero(),
                "more",
            )?;
            (next, more)
        } else {
            let next = self.builder.build_int_add(t_value, one, "t_next")?;
            let more = self
                .builder
                .build_int_compare(IntPredicate::ULT, next, end, "more")?;
            (next, more)
        };
        let latch = self.builder.get_insert_block().expect("positioned");
        self.builder.build_conditional_branch(more, header, exit)?;
        t.add_incoming(&[(&start, entry), (&next, latch)]);
        for ((phi, init), next) in phis.iter().zip(carried).zip(&next_carried) {
            phi.add_incoming(&[(init, entry), (next, latch)]);
        }

        // LCSSA: carried values leave the loop through phis of the exit block.
        self.builder.position_at_end(exit);
        next_carried
            .iter()
            .map(|v| {
                let out = self
                    .builder
                    .build_phi(v.as_basic_value_enum().get_type(), "total")?;
                out.add_incoming(&[(v, latch)]);
                Ok(V::from_basic(out.as_basic_value()))
            })
            .collect()
    }
}

use crate::passes::schedule::Item;
