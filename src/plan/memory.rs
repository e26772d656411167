//! Where backward's gradients live.
//!
//! Straight-line code keeps gradients in registers and stores each once, at the end of its
//! function (or before a loop in it); loops work on memory. So when a backward function
//! starts, a gradient is in memory if loops accumulate it (`backward`'s first function zeroes
//! those whose first addition adds rather than stores) or if a function that ran before
//! (backward runs functions from the last) stored it. Otherwise it holds the interpreter's
//! starting value: 1 for the loss, the accumulated gradient for a param (0 in `step`), 0 for
//! anything else.

use std::collections::HashSet;
use std::num::NonZeroU32;

use crate::passes::lane_order::{vertical_map, VERTICAL_BLOCK};
use crate::passes::schedule::{
    every_iteration, every_repetition, Access, AccessKind, Affine, Item, MapLoop, SumLoop,
};
use crate::plan::local::Locals;
use crate::plan::per_slot::CopyRule;
use crate::plan::{CopiesRunAlike, Lanes, Nests, PerSlot, StepPlan};
use crate::tape::{Consumers, Slot, Tape};

/// The gradients' places, per slot (a batch's copies alike stored once, [`PerSlot`]).
#[derive(Clone, Debug, PartialEq)]
pub struct GradMemory {
    /// Loops read or accumulate its gradient in memory.
    pub in_loops: PerSlot<bool>,
    /// The backward function whose straight-line code stores its gradient first (the one
    /// with the highest index), plus one.
    first_store: PerSlot<Option<NonZeroU32>>,
    /// Whether a loop starts its gradient from 0 itself: then nothing zeroes the slot first.
    whole: PerSlot<Whole>,
    /// The loop operands that store their first additions ([`Whole::Stored`]).
    stored: HashSet<Addition>,
    /// The gradients a repetition keeps in its function's scratch, not in memory
    /// ([`crate::plan::local`]).
    pub local: Locals,
}

/// How a loop starts a gradient from 0 itself (never a param's, whose gradients accumulate
/// across `backward` calls, or the loss's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Whole {
    No,
    /// Its first addition in backward (the interpreter's order) comes from a loop operand
    /// that makes the first addition to every slot it adds into: the loop stores `0 + g`
    /// (what the zeroed buffer would hold after the addition) instead of adding, and any
    /// later additions add to that. A rollout's state, used by several nodes of the next
    /// step, is such a slot: on a rollout that leaves almost nothing for backward's first
    /// function to zero, which saves a pass over the gradients.
    Stored,
    /// Its additions all come from one vertical block of a map whose every lane adds into it
    /// (the operand the lanes share, [`Lanes::Both`] `vertical`, all the nest's repetitions in
    /// one group): the block starts its running sums from 0.
    Summed,
}

impl CopyRule for Whole {
    fn in_copy(_: Whole, copy1: Whole, _: u32) -> Whole {
        copy1
    }
}

/// Where a gradient starts when a backward function first needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradStart {
    /// Load it: memory holds its running value.
    Memory,
    /// The constant 1 (the loss).
    One,
    /// The constant 0.
    Zero,
}

impl GradMemory {
    /// The places of `tape`'s gradients as `functions` compute them; copies `2..` of
    /// `copies` (run alike in `functions`, [`CopiesRunAlike::in_functions`]) stored once.
    pub fn new(
        tape: &Tape,
        functions: &[Vec<Item>],
        nests: &Nests,
        step: Option<&StepPlan>,
        local: Locals,
        copies: Option<&CopiesRunAlike>,
    ) -> GradMemory {
        let additions = Additions { tape };
        let mut in_loops = PerSlot::new(tape.len(), copies, false);
        let mut whole = PerSlot::new(tape.len(), copies, Whole::No);
        for item in functions.iter().flatten() {
            let around = CopiesRunAlike::around(copies, item);
            for (access, counts) in item.nested_accesses() {
                let marks = match access.kind {
                    AccessKind::Writes { .. } => true,
                    AccessKind::Reads { grad } => grad,
                };
                if !marks {
                    continue;
                }
                let counts = CopiesRunAlike::counts(around, access.at, &counts);
                access.for_each_slot_in(&counts, |s| in_loops.set(s.index(), true));
            }
        }
        for item in functions.iter().flatten() {
            let around = CopiesRunAlike::around(copies, item);
            mark_summed_whole(item, &[], &additions, nests, &mut whole, around);
        }
        let stored = mark_stored_whole(tape, &additions, functions, &mut whole, copies);
        if let Some(step) = step {
            // `step` updates fused params in the loops, and never reads their gradients.
            for s in (0..tape.num_params()).filter(|&s| step.fuses(s)) {
                in_loops.set(s, false);
            }
        }
        let mut first_store = PerSlot::new(tape.len(), copies, None);
        for (k, function) in functions.iter().enumerate().rev() {
            let mut touch = |s: Slot| {
                if first_store.get(s.index()).is_none() {
                    first_store.set(s.index(), NonZeroU32::new(k as u32 + 1));
                }
            };
            for item in function.iter().rev() {
                // A sum cut into parts is differentiated whole by its last part.
                let nodes = match item {
                    Item::Straight(range) => range.clone(),
                    Item::SumPart { slot, args } if args.end as usize == tape.args(*slot).len() => {
                        slot.0..slot.0 + 1
                    }
                    _ => continue,
                };
                for s in nodes.map(Slot).rev() {
                    if tape.op(s).is_leaf() || !tape.takes_grad(s) {
                        continue;
                    }
                    touch(s);
                    for a in tape.args(s).iter().filter(|&a| tape.takes_grad(a)) {
                        touch(a);
                    }
                }
            }
        }
        GradMemory {
            in_loops,
            first_store,
            whole,
            stored,
            local,
        }
    }

    /// Whether the vertical operand whose first slot is `slot` starts its block's sums from 0
    /// (see [`Whole::Summed`]): the plan marks an operand's slots all or none.
    pub fn sums_whole(&self, slot: i64) -> bool {
        self.whole_at(slot) == Whole::Summed
    }

    fn whole_at(&self, slot: i64) -> Whole {
        usize::try_from(slot)
            .ok()
            .filter(|&s| s < self.whole.len())
            .map_or(Whole::No, |s| self.whole.get(s))
    }

    /// Whether a loop operand's additions store rather than add (see [`Whole::Stored`]).
    pub fn stores_whole(&self, additions: Addition) -> bool {
        self.stored.contains(&additions)
    }

    /// How many loop operands store their first additions ([`Whole::Stored`]).
    pub fn stored_count(&self) -> usize {
        self.stored.len()
    }

    /// Whether `slot`'s gradient is stored by a loop operand's first addition.
    #[cfg(test)]
    pub fn stored_slot(&self, slot: i64) -> bool {
        self.whole_at(slot) == Whole::Stored
    }

    /// Which backward function's straight-line code stores `s`'s gradient first, if any.
    #[cfg(test)]
    pub fn first_store(&self, s: usize) -> Option<usize> {
        self.first_store.get(s).map(|k| k.get() as usize - 1)
    }

    /// Says `function`'s straight-line code stores `s`'s gradient first (none: no
    /// function's): a plan `Plan::verify` may have to refuse.
    #[cfg(test)]
    pub fn tamper_first_store(&mut self, s: usize, function: Option<usize>) {
        let k = function.and_then(|k| NonZeroU32::new(k as u32 + 1));
        self.first_store.set(s, k);
    }

    /// Says a vertical block sums `s`'s gradient from 0 ([`Whole::Summed`]): a plan
    /// `Plan::verify` may have to refuse.
    #[cfg(test)]
    pub fn tamper_summed(&mut self, s: usize) {
        self.whole.set(s, Whole::Summed);
    }

    /// The loop operands that store their first additions, to tamper with.
    #[cfg(test)]
    pub fn tamper_stored(&mut self) -> &mut HashSet<Addition> {
        &mut self.stored
    }

    /// Whether backward's first function zeroes `s`'s gradient: those loops accumulate,
    /// params excepted (they accumulate across `backward` calls) but in `step` (they start
    /// at 0; `step`'s fused params are not in the loops' set).
    pub fn zeroed(&self, tape: &Tape, s: Slot, step: bool) -> bool {
        self.in_loops.get(s.index())
            && self.whole.get(s.index()) == Whole::No
            && !self.local.is_local(s)
            && (step || s.index() >= tape.num_params())
    }

    /// Where `s`'s gradient starts in backward function `function` (`step`'s if `step`).
    pub fn start(&self, tape: &Tape, s: Slot, function: usize, step: bool) -> GradStart {
        let stored_before =
            (self.first_store.get(s.index())).is_some_and(|k| k.get() as usize > function + 1);
        let is_param = s.index() < tape.num_params();
        let accumulated = is_param && !step && Some(s) != tape.loss();
        let in_memory = self.zeroed(tape, s, step) || self.whole.get(s.index()) != Whole::No;
        if stored_before || in_memory || accumulated {
            GradStart::Memory
        } else if Some(s) == tape.loss() {
            GradStart::One
        } else {
            GradStart::Zero
        }
    }

    /// Whether backward's last function must write the loss's gradient, 1: a loss no node
    /// computes.
    pub fn loss_needs_one(&self, tape: &Tape, step: Option<&StepPlan>) -> bool {
        tape.loss().is_some_and(|l| !self.stored(l.index(), step))
    }

    /// Whether backward's last function must zero slot `s`'s gradient: a kept gradient
    /// nothing stores, which must read 0 (params only in `step`; `step`'s fused params are
    /// stored by their loops; never a dropped one, [`Tape::drops_grad`]).
    pub fn unstored(
        &self,
        tape: &Tape,
        kept: &PerSlot<bool>,
        step: Option<&StepPlan>,
        s: usize,
    ) -> bool {
        let p = if step.is_some() { 0 } else { tape.num_params() };
        let slot = Slot(s as u32);
        // (Not a dropped gradient: the program keeps none, and zeroing one per constant made
        // at every use costs a pass over them per backward.)
        s >= p
            && kept.get(s)
            && !self.stored(s, step)
            && Some(slot) != tape.loss()
            && !tape.drops_grad(slot)
    }

    /// Whether a loop or a function stores slot `s`'s gradient.
    fn stored(&self, s: usize, step: Option<&StepPlan>) -> bool {
        self.in_loops.get(s)
            || self.first_store.get(s).is_some()
            || step.is_some_and(|p| p.fuses(s))
    }
}

/// Per slot, the additions its gradient gets (as an operand of a node that takes a
/// gradient, counted in [`Tape::consumers`]), none for params and the loss (whose gradients
/// start from what is there).
struct Additions<'t> {
    tape: &'t Tape,
}

impl Additions<'_> {
    fn counted(&self, s: Slot) -> bool {
        s.index() >= self.tape.num_params() && Some(s) != self.tape.loss()
    }

    /// How many (at most 255 counted): what a vertical operand's slots must all get once
    /// per lane for [`Whole::Summed`].
    fn count(&self, s: Slot) -> u8 {
        match self.counted(s) {
            true => self.tape.consumers().grad_additions(s),
            false => 0,
        }
    }

    /// The last node that adds (backward's first, in the interpreter's order), if any: for
    /// [`Whole::Stored`].
    fn last_consumer(&self, s: Slot) -> Option<u32> {
        let last = self.tape.consumers().last_grad_consumer(s);
        (self.counted(s) && last != Consumers::NONE).then_some(last)
    }
}

/// Marks in `whole` the slots of `item` (inside nests of `counts` repetitions) that
/// [`Whole::Summed`] describes: each vertical map's shared operand (a dot's products' or a
/// map's, [`vertical_map`], of whole blocks of steps) in a nest whose repetitions all run in
/// one group, when every
/// slot's additions are that many (so all of them come from that map: it adds once per lane
/// into each slot, distinct across steps and the nests around).
/// (`around`: the copies, if `item` lies in their nest.)
fn mark_summed_whole(
    item: &Item,
    counts: &[u32],
    additions: &Additions,
    nests: &Nests,
    whole: &mut PerSlot<Whole>,
    around: Option<&CopiesRunAlike>,
) {
    let Item::Nest(nest) = item else { return };
    let inner: Vec<u32> = counts.iter().copied().chain([nest.count]).collect();
    for b in &nest.body {
        mark_summed_whole(b, &inner, additions, nests, whole, around);
    }
    let Lanes::Both {
        group,
        vertical: true,
    } = nests.of(nest).lanes
    else {
        return;
    };
    if group != nest.count || nest.count > u8::MAX as u32 {
        return;
    }
    for b in &nest.body {
        // (Steps after the last whole block add lane by lane, into zeroed memory.)
        let Some((map, k)) =
            vertical_map(b, counts.len()).filter(|(map, _)| map.len % VERTICAL_BLOCK == 0)
        else {
            continue;
        };
        let access = Access {
            at: map.args[k],
            len: map.len,
            kind: AccessKind::Reads { grad: true },
        };
        let counts = CopiesRunAlike::counts(around, access.at, counts);
        let mut all = true;
        access.for_each_slot_in(&counts, |s| all &= additions.count(s) as u32 == nest.count);
        if all {
            access.for_each_slot_in(&counts, |s| whole.set(s.index(), Whole::Summed));
        }
    }
}

/// The most runs one repetition of [`RepeatedRuns`] holds (a copy's gradients in a batch
/// written as copies are a few dozen runs, a rollout step's a few hundred).
const MAX_RUNS_PERIOD: usize = 4096;

/// The repetition lengths [`repeated_runs`] tries at a run: the distances to the next runs
/// of the same length and gap to their successor.
const CANDIDATE_PERIODS: usize = 16;

/// Slots to write (zero, say) as runs repeated at a constant stride: `runs`, then each run
/// moved by `stride` slots, `count` times in all. A batch written as copies zeroes the same
/// few gradients in every copy: as straight-line code that is one `memset` per run and copy
/// (1,700 in micrograd's moons demo), as a loop over the copies a few.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepeatedRuns {
    pub runs: Vec<std::ops::Range<u32>>,
    pub stride: u32,
    pub count: u32,
}

/// How many times the `period` runs from `i` repeat, each time moved by the same stride.
fn repetitions(runs: &[std::ops::Range<u32>], i: usize, period: usize) -> usize {
    let stride = runs[i + period].start - runs[i].start;
    let moved = |r: &std::ops::Range<u32>, by: u32| r.start + by..r.end + by;
    let mut count = 1;
    while i + (count + 1) * period <= runs.len()
        && (0..period)
            .all(|q| runs[i + count * period + q] == moved(&runs[i + q], count as u32 * stride))
    {
        count += 1;
    }
    count
}

/// The slots where `which` is true, as [`RepeatedRuns`] in slot order, each repeating the
/// most runs it can; runs that repeat nothing come one by one (`count` 1).
pub fn repeated_runs(which: &[bool]) -> Vec<RepeatedRuns> {
    let mut runs = Vec::new();
    let mut s = 0;
    while s < which.len() {
        if which[s] {
            let start = s;
            while s < which.len() && which[s] {
                s += 1;
            }
            runs.push(start as u32..s as u32);
        } else {
            s += 1;
        }
    }
    // A repetition starts again where a run of the same length and gap to the next begins.
    let key = |k: usize| {
        (
            runs[k].len(),
            runs.get(k + 1).map(|n| n.start - runs[k].end),
        )
    };
    let mut next_alike = vec![None; runs.len()];
    let mut last_seen = std::collections::HashMap::new();
    for k in (0..runs.len()).rev() {
        next_alike[k] = last_seen.insert(key(k), k);
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < runs.len() {
        // (runs per repetition, repetitions, stride) covering the most runs from `i`; the
        // shortest repetition among equals.
        let mut best = (1, 1, 0);
        let alike = || std::iter::successors(next_alike[i], |&k| next_alike[k]);
        let fits = |p: usize| p <= MAX_RUNS_PERIOD && i + 2 * p <= runs.len();
        let nearest: Vec<usize> = alike()
            .map(|k| k - i)
            .take(CANDIDATE_PERIODS)
            .take_while(|&p| fits(p))
            .collect();
        for period in nearest {
            let stride = runs[i + period].start - runs[i].start;
            let count = repetitions(&runs, i, period);
            if count >= 2 && count * period > best.0 * best.1 {
                best = (period, count, stride);
            }
        }
        // A repetition of repetitions (a rollout step of 16 alike masses): try once the
        // period from here to where the pattern found so far starts again.
        let covered = i + best.0 * best.1;
        if let Some(p) = alike()
            .map(|k| k - i)
            .find(|&p| i + p >= covered && p > best.0)
        {
            if fits(p) {
                let count = repetitions(&runs, i, p);
                if count >= 2 && count * p > best.0 * best.1 {
                    best = (p, count, runs[i + p].start - runs[i].start);
                }
            }
        }
        let (period, count, stride) = best;
        out.push(RepeatedRuns {
            runs: runs[i..i + period].to_vec(),
            stride,
            count: count as u32,
        });
        i += period * count;
    }
    out
}

/// Marks in `whole` the slots of the loop operands that [`Whole::Stored`] describes, and
/// returns those operands: an operand's emission is the same in every iteration and
/// repetition, so one is marked only if it makes the first addition to each of its slots.
fn mark_stored_whole(
    tape: &Tape,
    additions: &Additions,
    functions: &[Vec<Item>],
    whole: &mut PerSlot<Whole>,
    copies: Option<&CopiesRunAlike>,
) -> HashSet<Addition> {
    let mut marked = Vec::new();
    for item in functions.iter().flatten() {
        let around = CopiesRunAlike::around(copies, item);
        for (add, len, counts) in grad_additions(item) {
            // (Where the operand moves with the copies, so does its consumer.)
            let counts = CopiesRunAlike::cut(around, add.operand, &counts);
            // Slots computed per repetition, then moved along by their strides.
            let consumer_stride = if add.per_step { add.consumer.stride } else { 0 };
            let makes_first = every_repetition(&counts, |js| {
                let (s0, c0) = (add.operand.at_levels(0, js), add.consumer.at_levels(0, js));
                (0..len as i64).all(|t| {
                    let s = Slot((s0.0 as i64 + add.operand.stride * t) as u32);
                    let consumer = Slot((c0.0 as i64 + consumer_stride * t) as u32);
                    // Not an operand of the consumer before this one: a map's earlier
                    // operands, a sum's first and (unless the tail moves) its tail's earlier
                    // iterations.
                    let first_position = || match add.per_step {
                        true => !(tape.args(consumer))
                            .slice(0..add.position as usize)
                            .contains(s),
                        false => {
                            add.position == 0
                                || (tape.args(consumer).get(0) != s
                                    && (add.operand.stride != 0 || t == 0))
                        }
                    };
                    whole.get(s.index()) == Whole::No
                        && additions.last_consumer(s) == Some(consumer.0)
                        && first_position()
                })
            });
            if makes_first {
                marked.push((add, len, counts));
            }
        }
    }
    let mut stored = HashSet::new();
    for (add, len, counts) in marked {
        every_iteration(&counts, len, |t, js| {
            whole.set(add.operand.at_levels(t, js).index(), Whole::Stored);
            true
        });
        stored.insert(add);
    }
    stored
}

/// A loop operand's gradient additions: into `operand` at iteration `t`, each from the node
/// `consumer` at `t` as its operand `position` (`per_step`: a map's), or from the one node
/// `consumer` as its operand `position + t` (a sum's). What the emitter asks
/// [`GradMemory::stores_whole`] about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Addition {
    operand: Affine,
    consumer: Affine,
    per_step: bool,
    position: u32,
}

impl Addition {
    /// Into operand `j` of `map`.
    pub fn map_arg(map: &MapLoop, j: usize) -> Addition {
        Addition {
            operand: map.args[j],
            consumer: map.out,
            per_step: true,
            position: j as u32,
        }
    }

    /// Into `sum`'s first operand.
    pub fn sum_first(sum: &SumLoop) -> Addition {
        Addition {
            operand: sum.first,
            consumer: sum.slot,
            per_step: false,
            position: 0,
        }
    }

    /// Into `sum`'s tail.
    pub fn sum_tail(sum: &SumLoop) -> Addition {
        Addition {
            operand: sum.tail,
            consumer: sum.slot,
            per_step: false,
            position: 1,
        }
    }

    pub fn operand(&self) -> Affine {
        self.operand
    }
}

/// The gradient additions of a loop item (a nest's body's too), each with its iterations
/// and the repetition counts of the nests around it, outermost first: what
/// [`Item::accesses`] reads with a gradient, with the nodes that add.
fn grad_additions(item: &Item) -> Vec<(Addition, u32, Vec<u32>)> {
    fn visit(item: &Item, counts: &[u32], out: &mut Vec<(Addition, u32, Vec<u32>)>) {
        let mut add = |addition, len| out.push((addition, len, counts.to_vec()));
        let map = |m: &MapLoop, needs_grad: bool, add: &mut dyn FnMut(Addition, u32)| {
            for (j, &g) in m.grad_args.iter().enumerate() {
                if g && needs_grad {
                    add(Addition::map_arg(m, j), m.len);
                }
            }
        };
        match item {
            Item::Map(m) => map(m, m.needs_grad, &mut add),
            // The terms before the products and the products' operands, as
            // `Item::accesses` has them.
            Item::Dot(d) => {
                if d.sum.needs_grad && d.sum.grad_first {
                    add(Addition::sum_first(&d.sum), 1);
                }
                if d.sum.needs_grad && d.sum.grad_tail && d.head() > 0 {
                    add(Addition::sum_tail(&d.sum), d.head());
                }
                map(&d.products, d.sum.needs_grad, &mut add);
            }
            Item::Sum(s) => {
                if s.needs_grad && s.grad_first {
                    add(Addition::sum_first(s), 1);
                }
                if s.needs_grad && s.grad_tail {
                    add(Addition::sum_tail(s), s.tail_len);
                }
            }
            Item::Nest(n) => {
                let inner: Vec<u32> = counts.iter().copied().chain([n.count]).collect();
                for b in &n.body {
                    visit(b, &inner, out);
                }
            }
            Item::Straight(_) | Item::SumPart { .. } => {}
        }
    }
    let mut out = Vec::new();
    visit(item, &[], &mut out);
    out
}
