//! A prototype of the first tier of issue #40 ("graphs built anew"): a **kernel tier** that
//! is ready at once. Preparation reorders a [`Tape`]'s operations (any topological order)
//! into *runs* of one kind, renumbers the buffers so that each operation writes the entry
//! after the previous one's, and lays out per-operation operand tables (one `u32` array per
//! operand position; a sum's operands in a side table). A step runs each run as one tight
//! loop of its kind's formula (`v[first + j] = op(v[a0[j]], v[a1[j]])`): one dispatch per
//! run instead of per node, so the branch that picks the kind is predicted.
//!
//! Three orders ([`Schedule`]): the tape's own; levels (1 + the operands' highest level,
//! kinds grouped within a level: the batches of the design brief, no run reads its own
//! outputs); and greedy runs (of the ready operations, the kind with most ready, every one
//! of that kind including those it makes ready: long runs, a run may read its own outputs,
//! which a sequential loop allows).
//!
//! **Bit for bit** what [`tapejit::Interpreter`] computes (checked by `tests/tier1.rs`).
//! Forward: an operation's value does not depend on when it is computed. Backward must add
//! each gradient's contributions in the interpreter's order (consumers by descending tape
//! slot, a consumer's operands in operand order). A reordered schedule keeps that order for
//! most targets: where a target's consumers run in the tape's relative order, backward adds
//! into its gradient directly ("push", as the interpreter does). For the others ("pulled"
//! targets), each contribution goes to a slot of its own in a contributions area behind the
//! gradients, laid out per target in the interpreter's order; the target's gradient is then
//! `((init + c1) + c2) + ...` over that range, summed just before the target's own local
//! gradients are computed (its consumers all ran before it in backward), or at the end for
//! leaves. A contribution slot holds `0 + c` rather than `c` (the area is zeroed, then added
//! into): the two differ only for `c = -0`, and `acc + (+0)` equals `acc + (-0)` unless
//! `acc` is `-0`, which a sum that starts at `+0`, at the loss's 1 or at a param's gradient
//! (itself such a sum) never is under round-to-nearest. Operands without a gradient (inputs
//! made without one) receive into a sink entry, zeroed with the rest.
//!
//! The formulas are the yardstick's (`benches/common/tape_interp.rs`), which copies
//! `src/op.rs`'s `forward` and `local_grads` over `F64` bit for bit; `tanh` and `exp` are
//! `tapejit::op::tanh` and `exp`, the library's own.
//!
//! Included with `#[path]` by the example and the tests.

// Each includer uses part of this file.
#![allow(dead_code)]

use tapejit::{Op, Slot, Tape};

/// What an operation computes: an [`Op`] other than a leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Add,
    Sub,
    Mul,
    Div,
    Neg,
    /// Its exponent is `exponents[a1[j]]`.
    Powf,
    Exp,
    Log,
    Tanh,
    Relu,
    Sigmoid,
    Softplus,
    Log1p,
    Abs,
    Sin,
    Cos,
    Sqrt,
    Max,
    Min,
    /// Its operands are `sum_args[a0[j]..a0[j] + a1[j]]`.
    Sum,
}

/// Kinds in all.
const KINDS: usize = 20;

impl Kind {
    /// The kind of `op`, `None` for a leaf (exhaustive: a new op needs a kind and kernels).
    fn of(op: Op) -> Option<Kind> {
        Some(match op {
            Op::Input(_) | Op::Param(_) | Op::Const(_) => return None,
            Op::Add => Kind::Add,
            Op::Sub => Kind::Sub,
            Op::Mul => Kind::Mul,
            Op::Div => Kind::Div,
            Op::Neg => Kind::Neg,
            Op::Powf(_) => Kind::Powf,
            Op::Exp => Kind::Exp,
            Op::Log => Kind::Log,
            Op::Tanh => Kind::Tanh,
            Op::Relu => Kind::Relu,
            Op::Sigmoid => Kind::Sigmoid,
            Op::Softplus => Kind::Softplus,
            Op::Log1p => Kind::Log1p,
            Op::Abs => Kind::Abs,
            Op::Sin => Kind::Sin,
            Op::Cos => Kind::Cos,
            Op::Sqrt => Kind::Sqrt,
            Op::Max => Kind::Max,
            Op::Min => Kind::Min,
            Op::Sum => Kind::Sum,
        })
    }
}

/// The order preparation puts the operations in (each topological; the operations the loss
/// reads first, then the others, as the yardstick does).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// The tape's order: runs only where the tape has neighbours of one kind.
    Tape,
    /// Level by level, kinds grouped within a level (stable: tape order within a group).
    Levels,
    /// Greedy runs: the kind with most ready operations, all of them and those they make
    /// ready, FIFO.
    Runs,
    /// Greedy runs within windows of this many consecutive operations of the tape (the
    /// windows in order): shorter reorderings, the tape's locality kept.
    Windows(usize),
}

impl Schedule {
    pub const ALL: [Schedule; 5] = [
        Schedule::Tape,
        Schedule::Levels,
        Schedule::Runs,
        Schedule::Windows(64),
        Schedule::Windows(512),
    ];

    pub fn name(self) -> String {
        match self {
            Schedule::Tape => "tape order".into(),
            Schedule::Levels => "levels".into(),
            Schedule::Runs => "greedy runs".into(),
            Schedule::Windows(w) => format!("greedy in windows of {w}"),
        }
    }
}

/// Operations `start..end` (of the renumbered order), all of `kind`.
#[derive(Clone, Copy, Debug)]
struct Run {
    kind: Kind,
    start: u32,
    end: u32,
}

/// What preparation found: the shape of the schedule.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Non-leaf operations, and those backward walks.
    pub ops: usize,
    pub backward_ops: usize,
    /// Runs of one kind in the chosen schedule (backward's among them).
    pub runs: usize,
    pub backward_runs: usize,
    /// Levels of the graph (the longest operation chain), and its (level, kind) batches.
    pub levels: usize,
    pub level_batches: usize,
    /// Gradient contributions (edges backward adds along), and those to pulled targets.
    pub edges: usize,
    pub pulled_edges: usize,
    /// Targets whose contributions are pulled.
    pub pulled_targets: usize,
}

impl Stats {
    pub fn mean_run(&self) -> f64 {
        self.ops as f64 / self.runs.max(1) as f64
    }
    pub fn mean_level_batch(&self) -> f64 {
        self.ops as f64 / self.level_batches.max(1) as f64
    }
}

/// A tape as kernel runs, with its value and gradient buffers.
pub struct Tier1 {
    runs: Vec<Run>,
    /// The runs backward walks: the first ones.
    backward_runs: usize,
    /// Where operation 0 writes: params, inputs and constants come before.
    first_op: usize,
    /// Per operation: operand 0 and 1's buffer index; a sum's start in `sum_args` and its
    /// count; `powf`'s exponent index in `a1`.
    a0: Vec<u32>,
    a1: Vec<u32>,
    /// Per backward operation: where operand 0's and 1's contributions go in `grads`.
    d0: Vec<u32>,
    d1: Vec<u32>,
    sum_args: Vec<u32>,
    /// Where each sum operand's contribution goes, parallel to `sum_args`.
    sum_dsts: Vec<u32>,
    exponents: Vec<f64>,
    /// Per backward operation `j` (and one past): its pulled contributions are
    /// `grads[pull[j]..pull[j + 1]]`.
    pull: Vec<u32>,
    /// Pulled leaves: (buffer index, range in `grads`).
    leaf_pulls: Vec<(u32, u32, u32)>,
    values: Vec<f64>,
    /// One entry per buffer entry, then the contributions area, then the sink.
    grads: Vec<f64>,
    num_params: usize,
    input_base: usize,
    num_inputs: usize,
    loss: Option<usize>,
    param_index: Vec<u32>,
    index_of_slot: Vec<u32>,
    stats: Stats,
}

impl Tier1 {
    /// Prepares `tape` in `schedule`'s order; values start as a fresh program's.
    pub fn from_tape(tape: &Tape, schedule: Schedule) -> Tier1 {
        let n = tape.len();
        let (p, n_in) = (tape.num_params(), tape.num_inputs());
        // The tape's nodes: op, needs_grad, operands (CSR).
        let mut ops = Vec::with_capacity(n);
        let mut needs = Vec::with_capacity(n);
        let mut arg_start = Vec::with_capacity(n + 1);
        let mut args: Vec<u32> = Vec::with_capacity(2 * n);
        arg_start.push(0u32);
        for s in tape.slots() {
            let view = tape.node(s).expect("a slot of the tape");
            args.extend(view.args.iter().map(|a| a.0));
            arg_start.push(args.len() as u32);
            ops.push(view.op);
            needs.push(view.needs_grad);
        }
        let args_of = |s: usize| &args[arg_start[s] as usize..arg_start[s + 1] as usize];
        let kind: Vec<Option<Kind>> = ops.iter().map(|&op| Kind::of(op)).collect();

        // Levels (leaves 0), for the statistics and the level schedule.
        let mut level = vec![0u32; n];
        for s in 0..n {
            if kind[s].is_some() {
                level[s] = 1 + args_of(s).iter().map(|&a| level[a as usize]).max().unwrap();
            }
        }
        let levels = level.iter().copied().max().unwrap_or(0) as usize;
        let mut level_batches = 0;
        {
            // Distinct (level, kind) pairs, counted over a bitmap per level.
            let mut seen = vec![0u32; levels + 1];
            for s in 0..n {
                if let Some(k) = kind[s] {
                    let bit = 1u32 << k as u32;
                    if seen[level[s] as usize] & bit == 0 {
                        seen[level[s] as usize] |= bit;
                        level_batches += 1;
                    }
                }
            }
        }

        // The order: backward's operations (needs_grad), then the others.
        let mut order: Vec<u32> = Vec::with_capacity(n);
        let mut backward_ops = 0;
        for phase_needs in [true, false] {
            let in_phase = |s: usize| kind[s].is_some() && needs[s] == phase_needs;
            match schedule {
                Schedule::Tape => order.extend((0..n).filter(|&s| in_phase(s)).map(|s| s as u32)),
                Schedule::Levels => {
                    // Stable counting sort on (level, kind); a phase-2 operation's operands
                    // of phase 1 are ready from the start, so levels are recounted.
                    let mut lv = vec![0u32; n];
                    let mut max_lv = 0;
                    for s in (0..n).filter(|&s| in_phase(s)) {
                        lv[s] = 1 + args_of(s)
                            .iter()
                            .map(|&a| {
                                if in_phase(a as usize) {
                                    lv[a as usize]
                                } else {
                                    0
                                }
                            })
                            .max()
                            .unwrap();
                        max_lv = max_lv.max(lv[s]);
                    }
                    let key = |s: usize| lv[s] as usize * KINDS + kind[s].unwrap() as usize;
                    let mut count = vec![0u32; (max_lv as usize + 1) * KINDS + 1];
                    for s in (0..n).filter(|&s| in_phase(s)) {
                        count[key(s) + 1] += 1;
                    }
                    for i in 1..count.len() {
                        count[i] += count[i - 1];
                    }
                    let base = order.len();
                    let total = count[count.len() - 1] as usize;
                    order.resize(base + total, 0);
                    for s in (0..n).filter(|&s| in_phase(s)) {
                        let k = key(s);
                        order[base + count[k] as usize] = s as u32;
                        count[k] += 1;
                    }
                }
                Schedule::Runs | Schedule::Windows(_) => {
                    // The phase's operations in tape order, cut into windows (one for
                    // `Runs`); within a window, users (CSR), pending operand counts and
                    // ready queues count only the window's operations: earlier windows
                    // are done.
                    let window = match schedule {
                        Schedule::Windows(w) => w.max(1),
                        _ => usize::MAX,
                    };
                    let phase: Vec<u32> =
                        (0..n).filter(|&s| in_phase(s)).map(|s| s as u32).collect();
                    let mut win = vec![u32::MAX; n];
                    for (i, &s) in phase.iter().enumerate() {
                        win[s as usize] = (i / window) as u32;
                    }
                    let same = |s: usize, a: usize| win[a] == win[s];
                    let mut pending = vec![0u32; n];
                    let mut user_count = vec![0u32; n + 1];
                    for &s in &phase {
                        for &a in args_of(s as usize) {
                            if same(s as usize, a as usize) {
                                pending[s as usize] += 1;
                                user_count[a as usize + 1] += 1;
                            }
                        }
                    }
                    for i in 1..=n {
                        user_count[i] += user_count[i - 1];
                    }
                    let mut fill = user_count.clone();
                    let mut users = vec![0u32; user_count[n] as usize];
                    for &s in &phase {
                        for &a in args_of(s as usize) {
                            if same(s as usize, a as usize) {
                                users[fill[a as usize] as usize] = s;
                                fill[a as usize] += 1;
                            }
                        }
                    }
                    let mut ready: Vec<Vec<u32>> = vec![Vec::new(); KINDS];
                    for chunk in phase.chunks(window.min(phase.len().max(1))) {
                        let mut head = [0usize; KINDS];
                        for r in &mut ready {
                            r.clear();
                        }
                        for &s in chunk {
                            if pending[s as usize] == 0 {
                                ready[kind[s as usize].unwrap() as usize].push(s);
                            }
                        }
                        let mut left = chunk.len();
                        while left > 0 {
                            let k = (0..KINDS)
                                .max_by_key(|&k| (ready[k].len() - head[k], usize::MAX - k))
                                .unwrap();
                            while head[k] < ready[k].len() {
                                let s = ready[k][head[k]] as usize;
                                head[k] += 1;
                                order.push(s as u32);
                                left -= 1;
                                let us = &users[user_count[s] as usize..user_count[s + 1] as usize];
                                for &u in us {
                                    pending[u as usize] -= 1;
                                    if pending[u as usize] == 0 {
                                        ready[kind[u as usize].unwrap() as usize].push(u);
                                    }
                                }
                            }
                        }
                    }
                }
            }
            if phase_needs {
                backward_ops = order.len();
            }
        }

        // Buffer indices: params and inputs where the tape has them, constants, operations.
        let mut index_of_slot = vec![u32::MAX; n];
        let mut values = vec![0.0; n];
        let mut next = (p + n_in) as u32;
        for (s, op) in ops.iter().enumerate() {
            match *op {
                Op::Param(_) | Op::Input(_) => index_of_slot[s] = s as u32,
                Op::Const(c) => {
                    index_of_slot[s] = next;
                    values[next as usize] = c;
                    next += 1;
                }
                _ => {}
            }
        }
        for (&s, &init) in tape.param_slots().iter().zip(tape.param_init()) {
            values[s.index()] = init;
        }
        let first_op = next as usize;
        for (j, &s) in order.iter().enumerate() {
            index_of_slot[s as usize] = (first_op + j) as u32;
        }

        // Operand tables and runs.
        let num_ops = order.len();
        let (mut a0, mut a1) = (vec![0u32; num_ops], vec![0u32; num_ops]);
        let (mut sum_args, mut exponents) = (Vec::new(), Vec::new());
        let mut runs: Vec<Run> = Vec::new();
        let mut backward_runs = 0;
        for (j, &s) in order.iter().enumerate() {
            let s = s as usize;
            let k = kind[s].unwrap();
            let operands = args_of(s);
            match ops[s] {
                Op::Sum => {
                    a0[j] = sum_args.len() as u32;
                    a1[j] = operands.len() as u32;
                    sum_args.extend(operands.iter().map(|&a| index_of_slot[a as usize]));
                }
                Op::Powf(c) => {
                    a0[j] = index_of_slot[operands[0] as usize];
                    a1[j] = exponents.len() as u32;
                    exponents.push(c);
                }
                _ => {
                    a0[j] = index_of_slot[operands[0] as usize];
                    if let Some(&b) = operands.get(1) {
                        a1[j] = index_of_slot[b as usize];
                    }
                }
            }
            if j == backward_ops {
                backward_runs = runs.len();
            }
            match runs.last_mut() {
                Some(r) if r.kind == k && j != backward_ops => r.end += 1,
                _ => runs.push(Run {
                    kind: k,
                    start: j as u32,
                    end: j as u32 + 1,
                }),
            }
        }
        if backward_ops == num_ops {
            backward_runs = runs.len();
        }

        // Backward's contributions: per target, its edges from backward's operations in the
        // tape's order (consumer ascending, operand ascending), as (position j, edge id).
        let edge_id = |j: usize, k: usize| -> usize {
            if let Op::Sum = ops[order[j] as usize] {
                a0[j] as usize + k
            } else {
                // Fixed-arity operands' edges are numbered after the sums'.
                sum_args.len() + 2 * j + k
            }
        };
        let mut edge_count = vec![0u32; n + 1];
        for &s in &order[..backward_ops] {
            for &a in args_of(s as usize) {
                if needs[a as usize] {
                    edge_count[a as usize + 1] += 1;
                }
            }
        }
        for i in 1..=n {
            edge_count[i] += edge_count[i - 1];
        }
        let edges = edge_count[n] as usize;
        let mut fill = edge_count.clone();
        // (consumer's position, edge id), per target, consumers in ascending tape order.
        let mut target_edges = vec![(0u32, 0u32); edges];
        let pos_of = |s: usize| index_of_slot[s] as usize - first_op;
        for s in (0..n).filter(|&s| kind[s].is_some() && needs[s]) {
            let j = pos_of(s);
            for (k, &a) in args_of(s).iter().enumerate() {
                if needs[a as usize] {
                    target_edges[fill[a as usize] as usize] = (j as u32, edge_id(j, k) as u32);
                    fill[a as usize] += 1;
                }
            }
        }
        let grad_len = n;
        let sink = {
            // Contributions area size: counted below; the sink goes after it.
            let mut pulled_edges = 0;
            for x in 0..n {
                let list = &target_edges[edge_count[x] as usize..edge_count[x + 1] as usize];
                if !list.windows(2).all(|w| w[0].0 <= w[1].0) {
                    pulled_edges += list.len();
                }
            }
            grad_len + pulled_edges
        };
        let mut dst = vec![sink as u32; sum_args.len() + 2 * num_ops];
        let mut pull = vec![0u32; backward_ops + 1];
        let mut leaf_pulls = Vec::new();
        let mut next_contrib = grad_len as u32;
        let (mut pulled_targets, mut pulled_edges) = (0, 0);
        // Targets in buffer order, so that operations' ranges come in position order.
        let mut slot_of_index = vec![u32::MAX; n];
        for (s, &i) in index_of_slot.iter().enumerate() {
            if i != u32::MAX {
                slot_of_index[i as usize] = s as u32;
            }
        }
        for (i, &x) in slot_of_index.iter().enumerate() {
            if x == u32::MAX {
                continue;
            }
            let x = x as usize;
            let list = &target_edges[edge_count[x] as usize..edge_count[x + 1] as usize];
            let lo = next_contrib;
            if list.windows(2).all(|w| w[0].0 <= w[1].0) {
                for &(_, e) in list {
                    dst[e as usize] = i as u32;
                }
            } else {
                pulled_targets += 1;
                pulled_edges += list.len();
                // The interpreter's order: consumers descending, each one's operands
                // ascending (a consumer's edges are adjacent in `list`).
                let mut end = list.len();
                while end > 0 {
                    let mut start = end - 1;
                    while start > 0 && list[start - 1].0 == list[end - 1].0 {
                        start -= 1;
                    }
                    for &(_, e) in &list[start..end] {
                        dst[e as usize] = next_contrib;
                        next_contrib += 1;
                    }
                    end = start;
                }
            }
            if i >= first_op {
                let j = i - first_op;
                if j < backward_ops {
                    pull[j] = lo;
                    pull[j + 1] = next_contrib;
                }
            } else if next_contrib > lo {
                leaf_pulls.push((i as u32, lo, next_contrib));
            }
        }
        assert_eq!(next_contrib as usize, sink);
        // Ranges of operations that pull nothing start where the last one ended.
        for j in 0..backward_ops {
            if pull[j + 1] < pull[j] {
                pull[j + 1] = pull[j];
            }
        }
        let sum_dsts = dst[..sum_args.len()].to_vec();
        let mut d0 = vec![sink as u32; backward_ops];
        let mut d1 = vec![sink as u32; backward_ops];
        for j in 0..backward_ops {
            d0[j] = dst[sum_args.len() + 2 * j];
            d1[j] = dst[sum_args.len() + 2 * j + 1];
        }

        let stats = Stats {
            ops: num_ops,
            backward_ops,
            runs: runs.len(),
            backward_runs,
            levels,
            level_batches,
            edges,
            pulled_edges,
            pulled_targets,
        };
        let t = Tier1 {
            runs,
            backward_runs,
            first_op,
            a0,
            a1,
            d0,
            d1,
            sum_args,
            sum_dsts,
            exponents,
            pull,
            leaf_pulls,
            values,
            grads: vec![0.0; sink + 1],
            num_params: p,
            input_base: tape.input_base(),
            num_inputs: n_in,
            loss: tape.loss().map(|l| index_of_slot[l.index()] as usize),
            param_index: tape.param_slots().iter().map(|s| s.0).collect(),
            index_of_slot,
            stats,
        };
        t.check();
        t
    }

    /// What makes the kernels' unchecked accesses sound: every operand is an entry before
    /// the one its operation writes, every destination and pull range lies in `grads`, and
    /// the runs tile the operations.
    fn check(&self) {
        let mut next = 0;
        for (r, run) in self.runs.iter().enumerate() {
            assert_eq!(run.start, next);
            assert!(run.end > run.start);
            next = run.end;
            if r + 1 == self.backward_runs {
                assert_eq!(run.end as usize, self.d0.len());
            }
            for j in run.start as usize..run.end as usize {
                let out = self.first_op + j;
                match run.kind {
                    Kind::Sum => {
                        let (s, len) = (self.a0[j] as usize, self.a1[j] as usize);
                        assert!(len >= 1);
                        assert!(self.sum_args[s..s + len]
                            .iter()
                            .all(|&a| (a as usize) < out));
                        assert!(self.sum_dsts[s..s + len]
                            .iter()
                            .all(|&d| (d as usize) < self.grads.len()));
                    }
                    Kind::Powf => {
                        assert!((self.a0[j] as usize) < out);
                        assert!((self.a1[j] as usize) < self.exponents.len());
                    }
                    _ => {
                        assert!((self.a0[j] as usize) < out && (self.a1[j] as usize) < out);
                    }
                }
            }
        }
        assert_eq!(next as usize, self.a0.len());
        assert_eq!(self.first_op + self.a0.len(), self.values.len());
        assert_eq!(self.pull.len(), self.d0.len() + 1);
        let g = self.grads.len();
        assert!(self.d0.iter().chain(&self.d1).all(|&d| (d as usize) < g));
        assert!(self.pull.windows(2).all(|w| w[0] <= w[1]));
        assert!(self.pull.iter().all(|&x| (x as usize) < g));
        assert!(self.loss.map_or(true, |l| l < self.values.len()));
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    pub fn num_inputs(&self) -> usize {
        self.num_inputs
    }

    /// Buffer entries: one per tape slot.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub fn set_inputs(&mut self, inputs: &[f64]) {
        let base = self.input_base;
        self.values[base..base + self.num_inputs].copy_from_slice(inputs);
    }

    /// `Program::step` with plain SGD, as the yardstick's: inputs, `zero_grad`, forward,
    /// backward, `p -= lr * grad`. Returns the loss.
    pub fn step(&mut self, inputs: &[f64], lr: f64) -> f64 {
        self.set_inputs(inputs);
        let loss = self.loss.expect("a tape with a loss");
        let before = self.values[loss];
        self.grads[..self.num_params].fill(0.0);
        self.forward();
        self.backward();
        let n = self.num_params;
        for (p, g) in self.values[..n].iter_mut().zip(&self.grads[..n]) {
            *p -= lr * g;
        }
        if loss < self.first_op {
            before
        } else {
            self.values[loss]
        }
    }

    /// Every operation's value, run by run.
    pub fn forward(&mut self) {
        let first = self.first_op;
        let v = self.values.as_mut_ptr();
        let (a0, a1) = (self.a0.as_ptr(), self.a1.as_ptr());
        let (sa, ex) = (self.sum_args.as_ptr(), self.exponents.as_ptr());
        for run in &self.runs {
            let (s, e) = (run.start as usize, run.end as usize);
            // SAFETY: `check` proved every index these read and write in bounds (operands
            // before the entry written, which is below `values.len()`).
            unsafe {
                macro_rules! x0 {
                    ($j:ident) => {
                        *v.add(*a0.add($j) as usize)
                    };
                }
                macro_rules! x1 {
                    ($j:ident) => {
                        *v.add(*a1.add($j) as usize)
                    };
                }
                macro_rules! un {
                    (|$x:ident| $f:expr) => {
                        for j in s..e {
                            let $x = x0!(j);
                            *v.add(first + j) = $f;
                        }
                    };
                }
                macro_rules! bin {
                    (|$x:ident, $y:ident| $f:expr) => {
                        for j in s..e {
                            let ($x, $y) = (x0!(j), x1!(j));
                            *v.add(first + j) = $f;
                        }
                    };
                }
                match run.kind {
                    Kind::Add => bin!(|x, y| x + y),
                    Kind::Sub => bin!(|x, y| x - y),
                    Kind::Mul => bin!(|x, y| x * y),
                    Kind::Div => bin!(|x, y| x / y),
                    Kind::Max => bin!(|x, y| if y > x { y } else { x }),
                    Kind::Min => bin!(|x, y| if x > y { y } else { x }),
                    Kind::Neg => un!(|x| -x),
                    Kind::Powf => {
                        for j in s..e {
                            let c = *ex.add(*a1.add(j) as usize);
                            *v.add(first + j) = power(x0!(j), c);
                        }
                    }
                    Kind::Exp => un!(|x| tapejit::op::exp(x)),
                    Kind::Log => un!(|x| tapejit::op::log(x)),
                    Kind::Tanh => un!(|x| tapejit::op::tanh(x)),
                    Kind::Relu => un!(|x| if 0.0 > x { 0.0 } else { x }),
                    Kind::Sigmoid => un!(|x| sigmoid(x)),
                    Kind::Softplus => un!(|x| {
                        let positive_part = if x > 0.0 { x } else { 0.0 };
                        positive_part + tapejit::op::log1p(tapejit::op::exp(-abs(x)))
                    }),
                    Kind::Log1p => un!(|x| tapejit::op::log1p(x)),
                    Kind::Abs => un!(|x| abs(x)),
                    Kind::Sin => un!(|x| tapejit::op::sin(x)),
                    Kind::Cos => un!(|x| tapejit::op::cos(x)),
                    Kind::Sqrt => un!(|x| sqrt(x)),
                    Kind::Sum => {
                        for j in s..e {
                            let (st, len) = (*a0.add(j) as usize, *a1.add(j) as usize);
                            let mut acc = *v.add(*sa.add(st) as usize);
                            for k in 1..len {
                                acc += *v.add(*sa.add(st + k) as usize);
                            }
                            *v.add(first + j) = acc;
                        }
                    }
                }
            }
        }
    }

    /// Gradients from the loss's, runs in reverse: zeroes every gradient but the params'
    /// (and the contributions area), sets the loss's to 1, then per operation, last first:
    /// its gradient finished (its pulled contributions added, in order), its local
    /// gradients added into their destinations operand by operand. Pulled leaves last.
    pub fn backward(&mut self) {
        let Some(loss) = self.loss else {
            return;
        };
        self.grads[self.num_params..].fill(0.0);
        self.grads[loss] = 1.0;
        let first = self.first_op;
        let (v, gb) = (self.values.as_ptr(), self.grads.as_mut_ptr());
        let (a0, a1) = (self.a0.as_ptr(), self.a1.as_ptr());
        let (d0, d1) = (self.d0.as_ptr(), self.d1.as_ptr());
        let (sd, ex) = (self.sum_dsts.as_ptr(), self.exponents.as_ptr());
        let pull = self.pull.as_ptr();
        for run in self.runs[..self.backward_runs].iter().rev() {
            let (s, e) = (run.start as usize, run.end as usize);
            // SAFETY: as in `forward`; destinations and pull ranges lie in `grads`, and
            // `pull` has an entry past each backward operation.
            unsafe {
                macro_rules! x0 {
                    ($j:ident) => {
                        *v.add(*a0.add($j) as usize)
                    };
                }
                macro_rules! x1 {
                    ($j:ident) => {
                        *v.add(*a1.add($j) as usize)
                    };
                }
                // Operation j's gradient: what was pushed, then its pulled contributions.
                macro_rules! grad {
                    ($j:ident) => {{
                        let o = first + $j;
                        let mut g = *gb.add(o);
                        let (lo, hi) = (*pull.add($j) as usize, *pull.add($j + 1) as usize);
                        for c in lo..hi {
                            g += *gb.add(c);
                        }
                        *gb.add(o) = g;
                        g
                    }};
                }
                macro_rules! push0 {
                    ($j:ident, $d:expr) => {
                        *gb.add(*d0.add($j) as usize) += $d
                    };
                }
                macro_rules! push1 {
                    ($j:ident, $d:expr) => {
                        *gb.add(*d1.add($j) as usize) += $d
                    };
                }
                macro_rules! un {
                    (|$x:ident, $out:ident, $g:ident| $d:expr) => {
                        for j in (s..e).rev() {
                            let $g = grad!(j);
                            let $out = *v.add(first + j);
                            let $x = x0!(j);
                            push0!(j, $d);
                        }
                    };
                }
                macro_rules! bin {
                    (|$x:ident, $y:ident, $out:ident, $g:ident| $d:expr) => {
                        for j in (s..e).rev() {
                            let $g = grad!(j);
                            let $out = *v.add(first + j);
                            let ($x, $y) = (x0!(j), x1!(j));
                            let (da, db) = $d;
                            push0!(j, da);
                            push1!(j, db);
                        }
                    };
                }
                match run.kind {
                    Kind::Add => bin!(|_x, _y, _out, g| (g, g)),
                    Kind::Sub => bin!(|_x, _y, _out, g| (g, -g)),
                    Kind::Mul => bin!(|x, y, _out, g| (y * g, x * g)),
                    Kind::Div => bin!(|_x, y, out, g| (g / y, -(out / y) * g)),
                    // The gradient goes to the operand picked (a on a tie).
                    Kind::Max => bin!(|x, y, _out, g| picked(y > x, g)),
                    Kind::Min => bin!(|x, y, _out, g| picked(x > y, g)),
                    Kind::Neg => un!(|_x, _out, g| -g),
                    Kind::Powf => {
                        for j in (s..e).rev() {
                            let g = grad!(j);
                            let out = *v.add(first + j);
                            let c = *ex.add(*a1.add(j) as usize);
                            let x = x0!(j);
                            push0!(j, power_derivative(x, c, out) * g);
                        }
                    }
                    Kind::Exp => un!(|_x, out, g| out * g),
                    Kind::Log => un!(|x, _out, g| g / x),
                    Kind::Tanh => un!(|_x, out, g| (1.0 - out * out) * g),
                    Kind::Relu => un!(|_x, out, g| (if out > 0.0 { 1.0 } else { 0.0 }) * g),
                    Kind::Sigmoid => un!(|_x, out, g| (out * (1.0 - out)) * g),
                    Kind::Softplus => un!(|x, _out, g| sigmoid(x) * g),
                    Kind::Log1p => un!(|x, _out, g| g / (1.0 + x)),
                    // sign(x), 0 at the zeros and NaN
                    Kind::Abs => un!(|x, _out, g| {
                        let below = if 0.0 > x { -1.0 } else { 0.0 };
                        (if x > 0.0 { 1.0 } else { below }) * g
                    }),
                    Kind::Sin => un!(|x, _out, g| tapejit::op::cos(x) * g),
                    Kind::Cos => un!(|x, _out, g| -tapejit::op::sin(x) * g),
                    Kind::Sqrt => un!(|_x, out, g| (0.5 / out) * g),
                    Kind::Sum => {
                        for j in (s..e).rev() {
                            let g = grad!(j);
                            let (st, len) = (*a0.add(j) as usize, *a1.add(j) as usize);
                            for k in st..st + len {
                                *gb.add(*sd.add(k) as usize) += g;
                            }
                        }
                    }
                }
            }
        }
        for &(x, lo, hi) in &self.leaf_pulls {
            let mut g = self.grads[x as usize];
            for c in lo..hi {
                g += self.grads[c as usize];
            }
            self.grads[x as usize] = g;
        }
    }

    /// The params in creation order.
    pub fn params(&self) -> Vec<f64> {
        self.param_index
            .iter()
            .map(|&k| self.values[k as usize])
            .collect()
    }

    /// Every value in tape slot order.
    pub fn values_by_slot(&self) -> Vec<f64> {
        self.by_slot(&self.values)
    }

    /// Every gradient in tape slot order.
    pub fn grads_by_slot(&self) -> Vec<f64> {
        self.by_slot(&self.grads)
    }

    fn by_slot(&self, buf: &[f64]) -> Vec<f64> {
        self.index_of_slot
            .iter()
            .map(|&k| buf[k as usize])
            .collect()
    }

    /// The buffer index of tape slot `s`.
    pub fn index(&self, s: Slot) -> usize {
        self.index_of_slot[s.index()] as usize
    }
}

// The scalar formulas, shared with the other bench interpreter (an includer of both loads
// them twice, which costs nothing).
#[allow(clippy::duplicate_mod)]
#[path = "scalar_formulas.rs"]
mod scalar_formulas;
use scalar_formulas::{abs, picked, power, power_derivative, sigmoid, sqrt};
