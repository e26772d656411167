//! [`Plan::verify`]'s check that each gradient is stored where it is read: a simulation of
//! backward over the finished plan, independent of [`GradMemory::new`], which decided it.
//!
//! Backward runs `_init` (which zeroes what [`GradMemory::zeroed`] says, the loss's to 1),
//! then the functions from the last, each one's items from the last, then `_rest` (1 for a
//! loss nothing stored, [`GradMemory::loss_needs_one`]; 0 where [`GradMemory::unstored`]
//! says). The walk follows it, keeping per gradient slot a [`State`]: untouched, zeroed, in
//! memory, in the current function's registers, in a repetition's scratch, being summed by a
//! vertical block, or applied by `step`'s fused update. Every gradient starts untouched but
//! a param's outside `step`, which memory holds (it accumulates across `backward` calls).
//! Every answer the emitter takes from the plan is held to it:
//!
//! - straight-line code (a node's gradient, then its operands', nodes from the last) keeps
//!   gradients in registers and stores them before a loop and at the function's end. Where
//!   it first needs one, it asks [`GradMemory::start`]: `Memory` must find memory holding the
//!   running value, `One` the untouched loss, `Zero` any other gradient that nothing has
//!   added into;
//! - a loop reads its nodes' gradients, and adds into its operands', in memory, which must
//!   hold them (zeroed, or stored before), or in its repetition's scratch for a local. An
//!   operand that stores its first addition ([`GradMemory::stores_whole`]) must find every
//!   slot it reaches with nothing added yet; so must a vertical block that sums from 0
//!   ([`GradMemory::sums_whole`]), and nothing else may touch the slot until its lane group
//!   is done. A local's scratch is zeroed as its repetition starts, so nothing may have added
//!   into it before, nor reach it after. In `step`, a fused param's one addition is its whole
//!   gradient (`0 + d`, applied to the param at once, [`StepPlan::fuses`]): nothing added
//!   before it, nothing touches it after, and every fused param gets it;
//! - `_init` zeroes no param's gradient that accumulates, nor one the buffers do not keep;
//!   `_rest` writes the kept gradients backward left untouched, and none it wrote.
//!
//! Loops are walked in the interpreter's order (repetitions and steps from the last, a
//! node's gradient before its operands', operands in order): lanes change no slot's order of
//! additions ([`super::lanes::check`]), so each slot sees what it sees in the emitted code.
//! The emitter's choice per access (scratch, fused update, stored first addition, vertical
//! block) is taken as it takes it. `backward` and, where the plan has one, `step`'s backward
//! are walked at once, a state per slot for each.
//!
//! A batch's copies stored once ([`CopiesRunAlike`]) are walked as the plan stores them. The copies'
//! nest runs copies 0 and 1 for what moves with the copies, the last copy and copy 1 for what
//! they all reach alike (shared weights: the last copy adds first), and every copy for
//! anything else (inputs before the copies, read at a stride of their own). Copies `2..` of
//! other items are skipped: those read copies `1..` alike, so copy 1's slots stand for the
//! others'. So the walk costs what the plan's own walks cost: a pass over the slots, one over
//! the loops' accesses, one over straight-line code's operands.

use std::borrow::Cow;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::passes::lane_order::{vertical_map, VERTICAL_BLOCK};
use crate::passes::schedule::{Affine, Item, MapLoop};
use crate::plan::memory::{Addition, GradStart};
use crate::plan::{CopiesRunAlike, Plan, StepPlan};
use crate::tape::{Slot, Tape};

#[cfg(doc)]
use crate::plan::GradMemory;

/// Checks every answer [`GradMemory`] (and [`StepPlan::fuses`]) gives the emitter against a
/// walk of `backward` and `step`'s backward over `plan`.
pub(super) fn verify(plan: &Plan, tape: &Tape) -> Result<()> {
    if tape.loss().is_none() {
        return Ok(());
    }
    Sim::new(plan, tape)
        .and_then(Sim::run)
        .map_err(|(slot, what)| Error::InvalidPlan { slot, what })
}

/// A finding: the slot and what is wrong there.
type Check = std::result::Result<(), (u32, String)>;

/// The passes walked: `backward`, and `step`'s where the plan has one.
const PASSES: [&str; 2] = ["backward", "step's backward"];

/// Where a gradient's running value is, as one pass's walk reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Nothing has written it in this pass: memory holds a stale number, and its running
    /// value is where the interpreter starts it (1 for the loss, else 0).
    Untouched,
    /// `_init` zeroed it (the loss's: set it to 1), and nothing has added into it since:
    /// memory holds where the interpreter starts it.
    Zeroed,
    /// Memory holds its running value.
    Memory,
    /// Memory holds it, stored by the current function's straight-line code before a loop:
    /// the emitter loads it again without asking the plan.
    StoredHere,
    /// The current function's registers hold it.
    Registers,
    /// The scratch of the repetition being walked holds it (a local gradient).
    Scratch,
    /// A local gradient whose repetition has ended.
    Gone,
    /// The vertical block of the lane group being walked sums it from 0.
    Summing,
    /// A fused param's gradient in `step`: whole, and applied to the param.
    Applied,
}

impl State {
    /// What the state says of a gradient, for a finding.
    fn described(self) -> &'static str {
        match self {
            State::Untouched => "that nothing has written yet",
            State::Zeroed => "that _init zeroed",
            State::Memory | State::StoredHere => "that memory holds",
            State::Registers => "that registers hold",
            State::Scratch => "that a repetition's scratch holds",
            State::Gone => "of a local whose repetition has ended",
            State::Summing => "that a vertical block is summing from 0",
            State::Applied => "that step's fused update has applied",
        }
    }

    /// Memory holds the running value.
    fn in_memory(self) -> bool {
        matches!(self, State::Zeroed | State::Memory | State::StoredHere)
    }

    /// Nothing has added into it: its running value is where the interpreter starts it.
    fn unadded(self) -> bool {
        matches!(self, State::Untouched | State::Zeroed)
    }
}

/// How a loop adds into an operand's gradient, as the emitter chooses per access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// In its repetition's scratch.
    Scratch,
    /// Load, add, store.
    Add,
    /// Store `0 + d`: the first addition ([`GradMemory::stores_whole`]).
    Store,
    /// `step`'s fused update: the whole gradient, applied at once.
    Fused,
    /// A vertical block's steps (the operand every lane shares): all the lane group's
    /// additions, from 0 if `true` ([`GradMemory::sums_whole`]), else onto memory.
    Block(bool),
}

impl Mode {
    fn described(self) -> &'static str {
        match self {
            Mode::Scratch => "adds in the scratch into",
            Mode::Add => "adds in memory into",
            Mode::Store => "stores its first addition into",
            Mode::Fused => "makes a fused update's whole gradient of",
            Mode::Block(false) => "adds a vertical block onto",
            Mode::Block(true) => "sums a vertical block from 0 into",
        }
    }
}

/// A loop's additions into an operand, per pass: `modes`, but `block` at the steps below
/// `blocks_below` (a vertical block's).
#[derive(Clone, Copy)]
struct Add {
    at: Affine,
    modes: [Mode; 2],
    blocks_below: u32,
    block: Mode,
}

impl Add {
    fn modes(&self, t: u32) -> [Mode; 2] {
        match t < self.blocks_below {
            true => [self.block; 2],
            false => self.modes,
        }
    }
}

/// Operand `k`'s [`Add`] in one repetition: slot `base + stride * t`.
#[derive(Clone, Copy)]
struct Run {
    base: i64,
    stride: i64,
    k: usize,
}

impl Run {
    fn of(k: usize, add: &Add, js: &[u32]) -> Run {
        Run {
            base: first_slot(&add.at, js),
            stride: add.at.stride,
            k,
        }
    }

    fn slot(&self, t: u32) -> Slot {
        Slot((self.base + self.stride * t as i64) as u32)
    }
}

/// A loop item's backward with the emitter's choices made once (a rollout's nest is walked
/// in hundreds of thousands of repetitions).
enum Node {
    /// A map of `len` steps: each reads `out`'s gradient (from the scratch if `local`), then
    /// adds into `args`.
    Map {
        out: Affine,
        len: u32,
        local: bool,
        args: Vec<Add>,
    },
    /// A sum (or a dot): reads `slot`'s gradient, adds into `first`, the first `terms` of
    /// `tail`, then (a dot) into its products' operands, `len` steps from the last.
    Sum {
        slot: Affine,
        first: Option<Add>,
        tail: Option<Add>,
        terms: u32,
        products: Option<(u32, Vec<Add>)>,
    },
    /// Maps of one node (a rollout's body), as backward walks them: each reads its
    /// gradient, then adds into its operands'.
    Ops(Vec<Op>),
    Nest(NestNode),
}

/// A map of one node's access to a gradient: reading its own (from the scratch if a
/// local's), or adding into an operand's.
struct Op {
    at: Affine,
    read: Option<bool>,
    modes: [Mode; 2],
}

struct NestNode {
    count: u32,
    /// The body, as backward walks it: from the last item.
    body: Vec<Node>,
    /// The body's local gradients: zeroed in the scratch as each repetition starts.
    locals: Vec<Affine>,
    /// Repetitions per lane group in backward.
    group: u32,
    /// Additions after the repetitions ([`crate::plan::SharedGrad`]): an
    /// operand of `len` steps in a nest of `inner` repetitions, onto memory.
    shared: Vec<(Affine, u32, u32)>,
}

/// Which of its accesses a repetition of the copies' nest walks, by how they move with the
/// copies (at the nest's level): by the copies' period, not at all, or otherwise.
#[derive(Clone, Copy)]
struct Keep {
    period: i64,
    moving: bool,
    shared: bool,
    others: bool,
}

impl Keep {
    /// Every access (anywhere but in the copies' nest).
    const ALL: Keep = Keep {
        period: 0,
        moving: true,
        shared: true,
        others: true,
    };

    fn all(self) -> bool {
        self.moving && self.shared && self.others
    }

    #[inline]
    fn keeps(self, at: &Affine) -> bool {
        if self.all() {
            return true;
        }
        match at.outer[0] {
            0 => self.shared,
            step if step == self.period => self.moving,
            _ => self.others,
        }
    }

    /// Only what moves otherwise: nodes without such accesses are skipped whole.
    fn others_only(self) -> bool {
        !self.moving && !self.shared
    }
}

/// What is wrong, told only when found.
enum Finding {
    Said(&'static str),
    /// Straight-line code starts a gradient in this state as the plan says.
    Starts(State, GradStart),
    /// Straight-line code reaches a gradient in this state.
    Straight(State),
    /// A loop reads a gradient in this state.
    Reads(State),
    /// A loop adds into a gradient in this state so.
    Adds(Mode, State),
    /// A local's scratch is zeroed with its gradient in this state.
    Local(State),
    /// Backward ends with a gradient in this state.
    Ends(State),
}

struct Sim<'p> {
    plan: &'p Plan,
    tape: &'p Tape,
    /// `step`'s plan, if its backward is walked too.
    step: Option<&'p StepPlan>,
    /// How many passes are walked.
    passes: usize,
    /// Per slot stored, each pass's state ([`Sim::index`]; with one pass, the second the
    /// same).
    states: Vec<[State; 2]>,
    /// Copies `2..`, which copy 1 stands for (empty without copies stored once).
    ruled: Range<usize>,
    /// The loss's slot.
    loss: u32,
    /// The backward function being walked.
    function: usize,
    /// Slots in [`State::Registers`], [`State::StoredHere`], [`State::Summing`].
    registers: Vec<Slot>,
    stored_here: Vec<Slot>,
    summing: Vec<Slot>,
    /// A map's runs in the repetition being walked (kept to spare an allocation per visit).
    runs: Vec<Run>,
}

impl<'p> Sim<'p> {
    /// Every gradient as `_init` leaves it.
    fn new(plan: &'p Plan, tape: &'p Tape) -> std::result::Result<Sim<'p>, (u32, String)> {
        let step = plan.step.as_ref();
        let ruled = plan.copies.map_or(0..0, |a| {
            let past = a.past_second();
            past.start as usize..past.end as usize
        });
        let stored = (0..ruled.start).chain(ruled.end..tape.len());
        let mut sim = Sim {
            plan,
            tape,
            step,
            passes: 1 + step.is_some() as usize,
            states: Vec::with_capacity(stored.clone().count()),
            ruled,
            loss: tape.loss().map_or(u32::MAX, |l| l.0),
            function: 0,
            registers: Vec::new(),
            stored_here: Vec::new(),
            summing: Vec::new(),
            runs: Vec::new(),
        };
        let grads = &plan.grads;
        for s in stored.map(|s| Slot(s as u32)) {
            let mut states = [State::Untouched; 2];
            for (p, state) in states.iter_mut().enumerate().take(sim.passes) {
                let accumulates = s.index() < tape.num_params() && p == 0 && s.0 != sim.loss;
                if accumulates {
                    *state = State::Memory;
                }
                if !grads.zeroed(tape, s, p == 1) {
                    continue;
                }
                let unkept =
                    !plan.kept.get(s.index()) || grads.local.is_local(s) || tape.drops_grad(s);
                if accumulates || unkept {
                    let what = match accumulates {
                        true => "_init zeroes a param's gradient, which accumulates",
                        false => "_init zeroes a gradient the buffers do not keep",
                    };
                    return Err(sim.finding(p, s, Finding::Said(what)));
                }
                *state = State::Zeroed;
            }
            // (With one pass, a second that mirrors it: the walk updates both alike.)
            if sim.passes == 1 {
                states[1] = states[0];
            }
            sim.states.push(states);
        }
        Ok(sim)
    }

    /// Where `s`'s states are kept: none for copies `2..` (copy 1's stand for them).
    #[inline]
    fn index(&self, s: Slot) -> Option<usize> {
        let i = s.index();
        if i < self.ruled.start {
            Some(i)
        } else if i < self.ruled.end {
            None
        } else {
            Some(i - self.ruled.len())
        }
    }

    /// A finding of pass `p` at `s`, told (away from the walk's paths).
    #[cold]
    #[inline(never)]
    fn finding(&self, p: usize, s: Slot, finding: Finding) -> (u32, String) {
        let what = match finding {
            Finding::Said(what) => what.to_string(),
            Finding::Starts(state, start) => format!(
                "function {} starts a gradient {} from {start:?}",
                self.function,
                state.described()
            ),
            Finding::Straight(state) => {
                format!(
                    "straight-line code reaches a gradient {}",
                    state.described()
                )
            }
            Finding::Reads(state) => format!("a loop reads a gradient {}", state.described()),
            Finding::Adds(mode, state) => {
                format!(
                    "a loop {} a gradient {}",
                    mode.described(),
                    state.described()
                )
            }
            Finding::Local(state) => format!(
                "a repetition zeroes the scratch of a local gradient {}",
                state.described()
            ),
            Finding::Ends(state) => {
                format!("backward ends with a gradient {}", state.described())
            }
        };
        (s.0, format!("{}: {what}", PASSES[p]))
    }

    fn run(mut self) -> Check {
        let plan = self.plan;
        for (k, function) in plan.functions.iter().enumerate().rev() {
            self.function = k;
            for item in function.iter().rev() {
                match item {
                    Item::Straight(range) => {
                        for s in range.clone().rev().map(Slot) {
                            if !self.tape.op(s).is_leaf() {
                                self.node(s)?;
                            }
                        }
                    }
                    // A sum cut into parts is differentiated whole by its last part.
                    Item::SumPart { slot, args } => {
                        if args.end as usize == self.tape.args(*slot).len() {
                            self.node(*slot)?;
                        }
                    }
                    _ => {
                        self.store_registers();
                        self.loop_item(item)?;
                    }
                }
            }
            // The function's end stores its registers: memory holds them for the next.
            for s in std::mem::take(&mut self.registers) {
                self.set(s, State::Memory);
            }
            for s in std::mem::take(&mut self.stored_here) {
                self.set(s, State::Memory);
            }
        }
        self.rest()
    }

    /// Sets every pass's state of `s` (not one of copies `2..`).
    fn set(&mut self, s: Slot, state: State) {
        if let Some(i) = self.index(s) {
            self.states[i] = [state; 2];
        }
    }

    /// `_rest`: 1 for the loss, 0 for any other kept gradient, exactly where backward left
    /// it untouched; and every fused param applied.
    fn rest(&self) -> Check {
        let (tape, grads, kept) = (self.tape, &self.plan.grads, &self.plan.kept);
        let ruled = &self.ruled;
        let stored = (0..ruled.start).chain(ruled.end..tape.len());
        for (p, step) in [None, self.step].into_iter().enumerate().take(self.passes) {
            let one = grads.loss_needs_one(tape, step);
            for (i, s) in stored.clone().enumerate() {
                let (state, slot) = (self.states[i][p], Slot(s as u32));
                let fused = s < tape.num_params() && step.is_some_and(|step| step.fuses(s));
                let loss = slot.0 == self.loss;
                let what = match state {
                    _ if fused != (state == State::Applied) => match fused {
                        true => "step never applies a fused param's update",
                        false => "a fused update applies a gradient not fused",
                    },
                    // (Memory `_init` zeroed holds 0, the loss's 1: what `_rest` would write.)
                    State::Zeroed => continue,
                    State::Untouched if loss => match one {
                        true => continue,
                        false => "nothing writes the loss's gradient, 1",
                    },
                    // (Not a gradient the buffers do not hold: of a slot they do not keep,
                    // dropped, or local.)
                    State::Untouched if !kept.get(s) => continue,
                    State::Untouched => match tape.drops_grad(slot)
                        || grads.unstored(tape, kept, step, s)
                        || grads.local.is_local(slot)
                    {
                        true => continue,
                        false => "nothing writes the gradient, 0",
                    },
                    State::Memory | State::Applied if loss && one => {
                        "_rest writes 1 over the loss's gradient backward stored"
                    }
                    State::Memory | State::Applied => match grads.unstored(tape, kept, step, s) {
                        true => "_rest zeroes a gradient backward stored",
                        false => continue,
                    },
                    State::Gone if grads.local.is_local(slot) => continue,
                    _ => return Err(self.finding(p, slot, Finding::Ends(state))),
                };
                return Err(self.finding(p, slot, Finding::Said(what)));
            }
        }
        Ok(())
    }

    /// A node's backward in straight-line code: its gradient, then its operands'.
    fn node(&mut self, s: Slot) -> Check {
        let tape = self.tape;
        if !tape.takes_grad(s) {
            return Ok(());
        }
        self.in_registers(s)?;
        for a in tape.args(s) {
            if tape.takes_grad(a) {
                self.in_registers(a)?;
            }
        }
        Ok(())
    }

    /// Straight-line code needs `s`'s gradient in a register: where the plan says it
    /// starts ([`GradMemory::start`]), the first time in the function.
    #[inline]
    fn in_registers(&mut self, s: Slot) -> Check {
        let Some(i) = self.index(s) else {
            return Ok(());
        };
        let states = self.states[i];
        if states[0] == State::Registers {
            return Ok(());
        }
        for (p, &state) in states.iter().enumerate().take(self.passes) {
            match state {
                State::StoredHere => {}
                State::Untouched | State::Zeroed | State::Memory => {
                    let start = (self.plan.grads).start(self.tape, s, self.function, p == 1);
                    let loss = s.0 == self.loss;
                    let right = match start {
                        GradStart::Memory => state.in_memory(),
                        // (Memory `_init` zeroed holds where the interpreter starts.)
                        GradStart::One => state.unadded() && loss,
                        GradStart::Zero => state.unadded() && !loss,
                    };
                    if !right {
                        return Err(self.finding(p, s, Finding::Starts(state, start)));
                    }
                }
                _ => return Err(self.finding(p, s, Finding::Straight(state))),
            }
        }
        self.states[i] = [State::Registers; 2];
        self.registers.push(s);
        Ok(())
    }

    /// The registers stored, as before a loop and at a function's end.
    fn store_registers(&mut self) {
        for s in std::mem::take(&mut self.registers) {
            self.set(s, State::StoredHere);
            self.stored_here.push(s);
        }
    }

    /// A loop item (outside nests) of the current function.
    fn loop_item(&mut self, item: &Item) -> Check {
        let Some(node) = self.compile(item, 0, None) else {
            return Ok(());
        };
        let copies = CopiesRunAlike::around(self.plan.copies.as_ref(), item).map(|a| {
            let first = a.copy(0);
            (first.end - first.start) as i64
        });
        match (&node, copies) {
            (Node::Nest(n), Some(period)) => self.copies(n, period),
            _ => self.walk::<true>(&node, &mut Vec::new(), Keep::ALL),
        }
    }

    /// `item`'s backward as the emitter lowers it, inside `depth` nests, directly in the body
    /// of one whose backward runs in lanes (`lanes`: its level and whether vertically).
    fn compile(&self, item: &Item, depth: usize, lanes: Option<(usize, bool)>) -> Option<Node> {
        let grads = &self.plan.grads;
        let add = |at: Affine, addition: Addition| {
            let modes = self.modes(at, addition, lanes);
            Add {
                at,
                modes,
                blocks_below: 0,
                block: modes[0],
            }
        };
        let args = |m: &MapLoop| -> Vec<Add> {
            // (The emitter's vertical order: the operand every lane shares, in whole blocks.)
            let vertical = lanes
                .filter(|&(_, vertical)| vertical)
                .and_then(|(level, _)| vertical_map(item, level))
                .map(|(_, k)| k);
            (0..m.args.len())
                .filter(|&i| m.grad_args[i])
                .map(|i| match vertical == Some(i) {
                    true => Add {
                        blocks_below: m.len - m.len % VERTICAL_BLOCK,
                        block: Mode::Block(grads.sums_whole(m.args[i].base)),
                        ..add(m.args[i], Addition::map_arg(m, i))
                    },
                    false => add(m.args[i], Addition::map_arg(m, i)),
                })
                .collect()
        };
        match item {
            Item::Map(m) if m.needs_grad => Some(Node::Map {
                out: m.out,
                len: m.len,
                local: grads.local.place(m.out).is_some(),
                args: args(m),
            }),
            Item::Sum(s) if s.needs_grad => Some(Node::Sum {
                slot: s.slot,
                first: s.grad_first.then(|| add(s.first, Addition::sum_first(s))),
                tail: s.grad_tail.then(|| add(s.tail, Addition::sum_tail(s))),
                terms: s.tail_len,
                products: None,
            }),
            Item::Dot(d) if d.sum.needs_grad => {
                let s = &d.sum;
                Some(Node::Sum {
                    slot: s.slot,
                    first: s.grad_first.then(|| add(s.first, Addition::sum_first(s))),
                    tail: s.grad_tail.then(|| add(s.tail, Addition::sum_tail(s))),
                    terms: d.head(),
                    products: Some((d.products.len, args(&d.products))),
                })
            }
            Item::Nest(n) => {
                // A nest in lanes adds no shared gradients ([`super::verify`]); one without
                // adds them after its repetitions, not in them.
                let plan = self.plan.nest(n);
                let body: Cow<[Item]> = match plan.lanes.backward() {
                    Some(_) => Cow::Borrowed(&n.body),
                    None => plan.repetition_body(n),
                };
                let lanes = (plan.lanes.backward()).map(|_| (depth, plan.lanes.vertical()));
                let locals = (body.iter())
                    .filter_map(|b| match b {
                        Item::Map(m) if grads.local.place(m.out).is_some() => Some(m.out),
                        _ => None,
                    })
                    .collect();
                let shared = (plan.shared_grads.iter())
                    .filter_map(|&shared| {
                        let (inner, dot) = shared.dot_in(n)?;
                        let map = &dot.products;
                        Some((map.args[shared.operand], map.len, inner.count))
                    })
                    .collect();
                // From the last item, consecutive maps of one as one list of accesses.
                let mut walked: Vec<Node> = Vec::new();
                for node in body
                    .iter()
                    .rev()
                    .filter_map(|b| self.compile(b, depth + 1, lanes))
                {
                    let ops = match node {
                        Node::Map {
                            out,
                            len: 1,
                            local,
                            args,
                        } => std::iter::once(Op {
                            at: out,
                            read: Some(local),
                            modes: [Mode::Add; 2],
                        })
                        .chain(args.iter().map(|a| Op {
                            at: a.at,
                            read: None,
                            modes: a.modes,
                        }))
                        .collect(),
                        node => {
                            walked.push(node);
                            continue;
                        }
                    };
                    match walked.last_mut() {
                        Some(Node::Ops(before)) => before.extend(ops),
                        _ => walked.push(Node::Ops(ops)),
                    }
                }
                Some(Node::Nest(NestNode {
                    count: n.count,
                    body: walked,
                    locals,
                    group: plan.lanes.backward().unwrap_or(1).max(1),
                    shared,
                }))
            }
            _ => None,
        }
    }

    /// How the emitter adds into `at` for `addition` (in a lane nest's body at `lanes`'
    /// level), in each pass: in the scratch for a local; in `step`, a fused update where the
    /// lanes' slots lie side by side and the first is a fused param; a store of the first
    /// addition where the plan says so (but where every lane shares the slot); else an
    /// addition in memory.
    fn modes(&self, at: Affine, addition: Addition, lanes: Option<(usize, bool)>) -> [Mode; 2] {
        if self.plan.grads.local.place(at).is_some() {
            return [Mode::Scratch; 2];
        }
        let across = lanes.map(|(level, _)| self.plan.buffers.affine(at).outer[level]);
        let unfused = match across != Some(0) && self.plan.grads.stores_whole(addition) {
            true => Mode::Store,
            false => Mode::Add,
        };
        let fuses = self.step.is_some_and(|p| p.fuses(at.at(0).index()));
        match across == Some(1) && fuses {
            true => [unfused, Mode::Fused],
            false => [unfused; 2],
        }
    }

    /// The copies' nest (of copies `period` slots apart): the last copy for what every
    /// copy reaches alike, then copy 1, then copy 0; the copies between for what moves
    /// otherwise, if anything does.
    fn copies(&mut self, n: &NestNode, period: i64) -> Check {
        let keep = |moving, shared, others| Keep {
            period,
            moving,
            shared,
            others,
        };
        let last = n.count - 1;
        let mut reps = vec![(last, keep(last < 2, true, true))];
        if reaches_others(&n.body, period) {
            reps.extend((2..last).rev().map(|j| (j, keep(false, false, true))));
        }
        reps.extend([(1, Keep::ALL), (0, keep(true, false, true))]);
        self.repetitions(n, &mut Vec::new(), reps.into_iter())
    }

    /// Walks `node` in repetition `js` of the nests around it, the accesses `keep` keeps
    /// (`ALL`: every one, `keep` unread).
    fn walk<const ALL: bool>(&mut self, node: &Node, js: &mut Vec<u32>, keep: Keep) -> Check {
        let keeps = |at: &Affine| ALL || keep.keeps(at);
        if !ALL && keep.others_only() && !reaches_others(std::slice::from_ref(node), keep.period) {
            return Ok(());
        }
        match node {
            Node::Ops(ops) => {
                for op in ops.iter().filter(|op| keeps(&op.at)) {
                    let s = Slot(first_slot(&op.at, js) as u32);
                    match op.read {
                        Some(local) => self.read(s, local)?,
                        None => self.add(s, op.modes)?,
                    }
                }
                Ok(())
            }
            Node::Map {
                out,
                len,
                local,
                args,
            } => {
                let out = keeps(out).then(|| (first_slot(out, js), out.stride));
                let runs = self.runs_of(args, js, keep);
                for t in (0..*len).rev() {
                    if let Some((base, stride)) = out {
                        self.read(Slot((base + stride * t as i64) as u32), *local)?;
                    }
                    for run in &runs {
                        self.add(run.slot(t), args[run.k].modes(t))?;
                    }
                }
                self.runs = runs;
                Ok(())
            }
            Node::Sum {
                slot,
                first,
                tail,
                terms,
                products,
            } => {
                if keeps(slot) {
                    self.read(Slot(first_slot(slot, js) as u32), false)?;
                }
                if let Some(a) = first.as_ref().filter(|a| keeps(&a.at)) {
                    self.add(Slot(first_slot(&a.at, js) as u32), a.modes)?;
                }
                if let Some(a) = tail.as_ref().filter(|a| keeps(&a.at)) {
                    let run = Run::of(0, a, js);
                    for t in 0..*terms {
                        self.add(run.slot(t), a.modes)?;
                    }
                }
                if let Some((len, args)) = products {
                    let runs = self.runs_of(args, js, keep);
                    for t in (0..*len).rev() {
                        for run in &runs {
                            self.add(run.slot(t), args[run.k].modes(t))?;
                        }
                    }
                    self.runs = runs;
                }
                Ok(())
            }
            Node::Nest(n) => self.repetitions(n, js, (0..n.count).rev().map(|j| (j, keep))),
        }
    }

    /// The runs of the operands `keep` keeps in repetition `js` (in the vector kept for them,
    /// to be given back).
    fn runs_of(&mut self, args: &[Add], js: &[u32], keep: Keep) -> Vec<Run> {
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        let kept = (args.iter().enumerate()).filter(|(_, a)| keep.keeps(&a.at));
        runs.extend(kept.map(|(k, a)| Run::of(k, a, js)));
        runs
    }

    /// A nest's repetitions `reps` (each with the accesses it walks), in order: each with its
    /// locals zeroed as it starts and gone as it ends, each lane group's vertical sums done as
    /// the group ends; then the shared gradients.
    fn repetitions(
        &mut self,
        n: &NestNode,
        js: &mut Vec<u32>,
        reps: impl Iterator<Item = (u32, Keep)> + Clone,
    ) -> Check {
        let full = n.count / n.group;
        let group_of = |j: u32| match j >= full * n.group {
            true => full,
            false => j / n.group,
        };
        let mut group = None;
        for (j, keep) in reps.clone() {
            if group.is_some_and(|g| g != group_of(j)) {
                self.end_group();
            }
            group = Some(group_of(j));
            js.push(j);
            for local in &n.locals {
                self.start_local(Slot(first_slot(local, js) as u32))?;
            }
            for b in &n.body {
                match keep.all() {
                    true => self.walk::<true>(b, js, keep)?,
                    false => self.walk::<false>(b, js, keep)?,
                }
            }
            for local in &n.locals {
                self.set(Slot(first_slot(local, js) as u32), State::Gone);
            }
            js.pop();
        }
        self.end_group();
        for &(at, len, inner) in &n.shared {
            for (j, _) in reps.clone().filter(|(_, keep)| keep.keeps(&at)) {
                js.push(j);
                for i in (0..inner).rev() {
                    js.push(i);
                    let base = first_slot(&at, js);
                    for t in (0..len).rev() {
                        self.add(Slot((base + at.stride * t as i64) as u32), [Mode::Add; 2])?;
                    }
                    js.pop();
                }
                js.pop();
            }
        }
        Ok(())
    }

    /// A local's scratch zeroed as its repetition starts: nothing may have added into it.
    fn start_local(&mut self, s: Slot) -> Check {
        let Some(i) = self.index(s) else {
            return Ok(());
        };
        for p in 0..self.passes {
            let state = self.states[i][p];
            if !state.unadded() {
                return Err(self.finding(p, s, Finding::Local(state)));
            }
        }
        self.states[i] = [State::Scratch; 2];
        Ok(())
    }

    /// The vertical blocks of a lane group have stored their sums.
    fn end_group(&mut self) {
        for s in std::mem::take(&mut self.summing) {
            if let Some(i) = self.index(s) {
                for state in &mut self.states[i] {
                    if *state == State::Summing {
                        *state = State::Memory;
                    }
                }
            }
        }
    }

    /// A loop reads `s`'s gradient: in memory, or in the scratch for a local.
    #[inline(always)]
    fn read(&mut self, s: Slot, local: bool) -> Check {
        let Some(i) = self.index(s) else {
            return Ok(());
        };
        // (Both passes: with one, the second mirrors the first.)
        let states = self.states[i];
        let right = |state: State| match local {
            true => state == State::Scratch,
            false => state.in_memory(),
        };
        match (right(states[0]), right(states[1])) {
            (true, true) => Ok(()),
            (false, _) => Err(self.finding(0, s, Finding::Reads(states[0]))),
            (true, false) => Err(self.finding(1, s, Finding::Reads(states[1]))),
        }
    }

    /// A loop adds into `s`'s gradient as `modes` say, per pass.
    #[inline(always)]
    fn add(&mut self, s: Slot, modes: [Mode; 2]) -> Check {
        let Some(i) = self.index(s) else {
            return Ok(());
        };
        let states = &mut self.states[i];
        // (The common cases first, alike in both passes: in memory, a first addition stored,
        // a local's scratch.)
        match modes {
            [Mode::Add, Mode::Add] if states[0].in_memory() && states[1].in_memory() => {
                for state in states {
                    if *state == State::Zeroed {
                        *state = State::Memory;
                    }
                }
                return Ok(());
            }
            [Mode::Store, Mode::Store]
                if states[0].unadded() && states[1].unadded() && s.0 != self.loss =>
            {
                *states = [State::Memory; 2];
                return Ok(());
            }
            [Mode::Scratch, Mode::Scratch] if *states == [State::Scratch; 2] => return Ok(()),
            _ => {}
        }
        for (p, mode) in modes.into_iter().enumerate() {
            let state = self.states[i][p];
            // Its first addition: what it adds to is where the interpreter starts it, 0.
            let first = state.unadded() && s.0 != self.loss;
            let (right, after) = match mode {
                Mode::Scratch => (state == State::Scratch, state),
                Mode::Add | Mode::Block(false) => (
                    state.in_memory(),
                    match state {
                        State::Zeroed => State::Memory,
                        _ => state,
                    },
                ),
                Mode::Store => (first, State::Memory),
                Mode::Fused => (
                    first && self.step.is_some_and(|step| step.fuses(s.index())),
                    State::Applied,
                ),
                Mode::Block(true) => {
                    if first {
                        self.summing.push(s);
                    }
                    (first || state == State::Summing, State::Summing)
                }
            };
            if !right {
                return Err(self.finding(p, s, Finding::Adds(mode, state)));
            }
            self.states[i][p] = after;
        }
        Ok(())
    }
}

/// The slot of `at`'s first step in repetition `js` of the nests around it (outermost first).
#[inline]
fn first_slot(at: &Affine, js: &[u32]) -> i64 {
    // (Unrolled: a few levels at most, walked for every access of every repetition.)
    let o = &at.outer;
    at.base
        + match *js {
            [] => 0,
            [a] => o[0] * a as i64,
            [a, b] => o[0] * a as i64 + o[1] * b as i64,
            [a, b, c] => o[0] * a as i64 + o[1] * b as i64 + o[2] * c as i64,
            _ => (o.iter().zip(js)).map(|(&o, &j)| o * j as i64).sum(),
        }
}

/// Whether any gradient `body` (of the copies' nest, `period` slots apart) reads or adds
/// into moves neither with the copies nor not at all: every copy reaches slots of its own
/// outside the copies then, walked in every repetition.
fn reaches_others(body: &[Node], period: i64) -> bool {
    let other = |at: &Affine| at.outer[0] != period && at.outer[0] != 0;
    body.iter().any(|node| match node {
        Node::Ops(ops) => ops.iter().any(|op| other(&op.at)),
        Node::Map { out, args, .. } => other(out) || args.iter().any(|a| other(&a.at)),
        Node::Sum {
            slot,
            first,
            tail,
            products,
            ..
        } => {
            other(slot)
                || first.iter().chain(tail).any(|a| other(&a.at))
                || (products.iter()).any(|(_, args)| args.iter().any(|a| other(&a.at)))
        }
        Node::Nest(n) => {
            reaches_others(&n.body, period) || n.shared.iter().any(|(at, _, _)| other(at))
        }
    })
}
