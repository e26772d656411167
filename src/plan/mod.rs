//! The lowering plan: every decision about how a scheduled tape becomes native code, made
//! without LLVM, so each one is a pure function of the tape and the schedule that tests can
//! check directly.
//!
//! - [`functions`]: the schedule cut into native functions of bounded size (a straight-line
//!   `sum` too wide for one function is cut into [`Item::SumPart`]s), and the functions
//!   grouped into LLVM modules of bounded size, compiled side by side.
//! - [`nests`]: the decisions for each nest of the schedule, under its number, which the
//!   next three passes make:
//! - [`lanes`]: which nests run their repetitions side by side in vector lanes, and how many
//!   at a time.
//! - [`shared`]: which gradients a nest adds over its repetitions after its backward (the
//!   weights a batch's copies share), instead of in every repetition.
//! - [`order`]: the order in which forward runs a rollout's body: what the next repetition
//!   reads first.
//! - [`constants`]: which loop operands read one number everywhere (a constant made at
//!   every use), which the code uses itself instead of loading.
//! - [`memory`]: which slots the buffers keep and which gradients live in memory when a
//!   backward function starts; [`local`]: which never leave a repetition's registers.
//! - [`step`]: what `step` does better than the four passes it stands for: params updated
//!   where their gradient is computed, gradients deferred to `materialize`.
//! - [`first_layer`]: the first layer `train` merges with the next sample's forward, how it
//!   skips zero inputs, and ([`first_layer::split`]) where minibatches cut that layer by its
//!   rows across threads.
//! - [`tactics`]: the shapes of the emitter's code (unroll counts, thresholds).
//! - [`copies`]: a batch's copies that the schedule runs alike, whose per-slot data
//!   ([`per_slot`]) every decision stores once.
//!
//! [`Plan::verify`] checks the invariants the emitter relies on, as [`Tape::verify`] does for
//! the tape.

pub mod buffers;
pub mod constants;
pub mod copies;
pub mod first_layer;
pub mod functions;
pub mod lanes;
pub mod local;
pub mod memory;
pub mod nests;
pub mod order;
pub mod per_slot;
pub mod shared;
pub mod step;
pub mod tactics;
mod verify;
mod verify_grads;

#[cfg(test)]
mod grad_placement_tests;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;

use crate::passes::schedule::{Item, Nest, Schedule};
use crate::tape::Tape;

pub use buffers::Buffers;
pub use copies::CopiesRunAlike;
pub use first_layer::{
    TrainPlan, ZeroSkip, ZeroSkipping, GUARD_FINITE, GUARD_NO_NEGATIVE_ZERO, GUARD_WAIT_SHIFT,
};
pub use memory::GradMemory;
pub use nests::{Lanes, NestPlan, Nests, SharedGrad};
pub use per_slot::PerSlot;
pub use step::StepPlan;

/// How the emitter lowers a tape: the result of every planning decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The native functions of `forward` (in order) and `backward` (from the last), each a
    /// run of straight-line code, loops and nests in tape order.
    pub functions: Vec<Vec<Item>>,
    /// How each nest runs ([`Plan::nest`]).
    pub nests: Nests,
    /// The functions grouped into modules, each compiled on its own (module 0 also holds
    /// the entry points): runs of consecutive functions that together cover them all.
    pub modules: Vec<Range<usize>>,
    /// A batch's copies the functions run alike, whose per-slot data the plan stores once
    /// ([`copies`]).
    pub copies: Option<CopiesRunAlike>,
    /// Per slot: whether its value and gradient reach the buffers. Everything does but the
    /// products of fused dots ([`buffers::kept`]).
    pub kept: PerSlot<bool>,
    /// The values a repetition keeps in its forward function's scratch, which the code
    /// never stores ([`local`]; `kept` still says where a slot has room in the buffers).
    pub local_values: local::Locals,
    /// The loop operands that read one constant wherever they run ([`constants`]).
    pub constants: constants::Constants,
    /// Where each slot lives in the buffers (see [`Buffers`]): shared with the compiled code,
    /// which keeps it (an address per slot: millions for a batch of copies).
    pub buffers: Arc<Buffers>,
    /// Where backward's gradients live (see [`GradMemory`]).
    pub grads: GradMemory,
    /// `step`'s own backward, if it pays (else `step` calls the four passes).
    pub step: Option<StepPlan>,
    /// Where minibatches cut `train`'s dot by its rows across threads, if they can.
    pub split: Option<crate::minibatch::SplitRows>,
    /// Whether recovered loops may use fast-math ([`crate::JitBuilder::fast_math`]).
    pub fast_math: bool,
    /// The shapes of the code the emitter writes.
    pub tactics: tactics::Tactics,
    /// Loops made, tape nodes they cover, and how deep nests nest.
    pub loops: usize,
    pub loop_nodes: usize,
    pub nest_depth: usize,
}

/// What the plan takes from the builder.
#[derive(Clone, Copy, Debug)]
pub struct PlanOptions {
    /// About how many tape nodes (with their operands; a loop counts
    /// [`functions::LOOP_WEIGHT`]) go into one function.
    pub chunk_size: usize,
    pub fast_math: bool,
    pub zero_skipping: ZeroSkipping,
    /// Whether the host has AVX-512 (F and VL): 32 vector registers of 8 `f64`, and
    /// `vpcompressd` in its quick register form ([`tactics::Tactics`] shapes code by it).
    pub host_avx512: bool,
}

impl Plan {
    /// Plans the lowering of `tape` as `schedule` lays it out, and verifies the plan
    /// ([`Plan::verify`]). A schedule that does not compute the tape (each non-leaf slot
    /// once, in order, as the tape says) is an [`crate::Error::InvalidPlan`].
    pub fn new(tape: &Tape, schedule: &Schedule, options: PlanOptions) -> crate::Result<Plan> {
        Plan::with_copies(
            tape,
            schedule,
            options,
            CopiesRunAlike::of(tape, &schedule.items),
        )
    }

    /// [`Plan::new`], storing copies `2..` of `copies` once (every slot, with `None`).
    fn with_copies(
        tape: &Tape,
        schedule: &Schedule,
        options: PlanOptions,
        copies: Option<CopiesRunAlike>,
    ) -> crate::Result<Plan> {
        verify::verify_shapes(schedule, tape)?;
        let items = &schedule.items;
        let kept = buffers::kept(tape, items, copies.as_ref());
        // Before the lanes, which pay where their slots' addresses are adjacent. (Cutting
        // the items into functions cuts straight-line runs and wide sums only: every loop
        // keeps its accesses.)
        let buffers = Buffers::new(tape, &kept, items, copies.as_ref());
        let mut nests = Nests::new(schedule.nests);
        for item in items {
            lanes::decide(item, &buffers, &mut nests);
            shared::decide(tape, item, &mut nests);
            order::decide(item, &mut nests);
        }
        let step = step::plan(tape, items, &nests, options.zero_skipping);
        let functions = functions::cut(tape, items, options.chunk_size);
        // (Cutting sums into parts may read the copies in parts.)
        let copies = copies.and_then(|c| c.in_functions(tape, &functions));
        let (local_grads, local_values) = local::find(tape, &functions, &nests, copies.as_ref());
        let constants = constants::Constants::find(tape, &functions);
        let grads = GradMemory::new(
            tape,
            &functions,
            &nests,
            step.as_ref(),
            local_grads,
            copies.as_ref(),
        );
        let split = first_layer::split::find(tape, &functions, &nests, &buffers, step.as_ref());
        let plan = Plan {
            nests,
            copies,
            split,
            buffers: Arc::new(buffers),
            kept,
            local_values,
            constants,
            grads,
            step,
            fast_math: options.fast_math,
            tactics: tactics::Tactics::new(options.host_avx512),
            loops: items.iter().map(Item::loops).sum(),
            loop_nodes: items.iter().map(Item::loop_nodes).sum(),
            nest_depth: items.iter().map(Item::depth).max().unwrap_or(0),
            modules: functions::modules(functions.len()),
            functions,
        };
        plan.verify(tape)?;
        Ok(plan)
    }

    /// How `nest` (a nest of the plan's functions) runs.
    pub fn nest(&self, nest: &Nest) -> &NestPlan {
        self.nests.of(nest)
    }

    /// Checks the invariants the emitter relies on: every non-leaf slot of `tape` computed
    /// exactly once, in slot order, by an item that says what the tape says; loop bodies
    /// hold only what the emitter lowers; every address a loop forms lies inside the buffers.
    pub fn verify(&self, tape: &Tape) -> crate::Result<()> {
        verify::verify(self, tape)
    }
}
