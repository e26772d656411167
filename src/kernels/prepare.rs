//! Preparation: the run order, the operand tables and where each gradient contribution goes.

use super::schedule::{self, Order};
use super::{fused, Body, KernelStats, Kernels, Run};
use crate::tape::{Slot, Tape};

/// `tape` (which stores every node) as kernel runs.
pub(super) fn prepare(tape: &Tape) -> Kernels {
    let n = tape.len();
    let is_op = |s: usize| !tape.stored(Slot(s as u32)).op().is_leaf();
    let needs = |s: usize| tape.stored(Slot(s as u32)).needs_grad();
    let args_of = |s: usize| tape.stored(Slot(s as u32)).args();

    // The run order, and the runs' bodies (a fused instance's nodes in its pattern's order).
    let fusions = fused::find(tape);
    let Order {
        nodes: order,
        bodies,
        backward_ops,
    } = schedule::run_order(tape, &fusions);

    // Buffer indices: leaves where the tape has them (params and inputs first, as the
    // tape's slots), then operation j at `first_op + j`: a run writes consecutive entries,
    // and reads the runs just before it.
    let mut index = vec![u32::MAX; n];
    let mut next = 0u32;
    for s in (0..n).filter(|&s| !is_op(s)) {
        index[s] = next;
        next += 1;
    }
    let first_op = next as usize;
    for (j, &s) in order.iter().enumerate() {
        index[s as usize] = (first_op + j) as u32;
    }
    debug_assert!(tape.param_slots().iter().all(|s| index[s.index()] == s.0));

    // Operand tables, and runs (a run breaks where its body or the phase changes).
    let num_ops = order.len();
    let mut arg_start = Vec::with_capacity(num_ops + 1);
    let mut args: Vec<u32> = Vec::with_capacity(2 * num_ops);
    arg_start.push(0);
    for &s in &order {
        args.extend(args_of(s as usize).iter().map(|a| index[a.index()]));
        arg_start.push(args.len() as u32);
    }
    let key = |b: Body| match b {
        Body::Op(op) => (op.key(), None),
        Body::Fused(p) => ([0; 2], Some(p)),
    };
    let mut runs: Vec<Run> = Vec::new();
    let mut backward_runs = 0;
    let mut j = 0;
    for (body, len) in bodies {
        if j as usize == backward_ops {
            backward_runs = runs.len();
        }
        match runs.last_mut() {
            Some(r) if key(r.body) == key(body) && j as usize != backward_ops => r.end += len,
            _ => runs.push(Run {
                body,
                start: j,
                end: j + len,
            }),
        }
        j += len;
    }
    if backward_ops == num_ops {
        backward_runs = runs.len();
    }

    // Backward's contributions: per target, its edges in the tape's order (consumer slot
    // ascending, then operand), as (consumer's position in the run order, edge).
    let backward_args = arg_start[backward_ops] as usize;
    let mut position = vec![u32::MAX; n];
    for (j, &s) in order[..backward_ops].iter().enumerate() {
        position[s as usize] = j as u32;
    }
    // (Operands by buffer index from here on: `slot_of` turns them back.)
    let mut slot_of = vec![0u32; n];
    for (s, &i) in index.iter().enumerate() {
        slot_of[i as usize] = s as u32;
    }
    let needs_at = |i: u32| needs(slot_of[i as usize] as usize);
    let mut edge_start = vec![0u32; n + 1];
    for &a in &args[..backward_args] {
        if needs_at(a) {
            edge_start[a as usize + 1] += 1;
        }
    }
    for i in 1..=n {
        edge_start[i] += edge_start[i - 1];
    }
    let edges = edge_start[n] as usize;
    let mut fill = edge_start.clone();
    let mut target_edges = vec![(0u32, 0u32); edges];
    for s in (0..n).filter(|&s| position[s] != u32::MAX) {
        let j = position[s] as usize;
        for (e, &a) in (arg_start[j]..).zip(&args[arg_start[j] as usize..arg_start[j + 1] as usize])
        {
            if needs_at(a) {
                target_edges[fill[a as usize] as usize] = (j as u32, e);
                fill[a as usize] += 1;
            }
        }
    }
    // Backward runs positions in descending order, so a target whose consumers' positions
    // ascend with their slots gets its contributions in the interpreter's order.
    let in_order = |x: usize| {
        let list = &target_edges[edge_start[x] as usize..edge_start[x + 1] as usize];
        list.windows(2).all(|w| w[0].0 <= w[1].0)
    };
    let pulled_edges: usize = (0..n)
        .filter(|&x| !in_order(x))
        .map(|x| (edge_start[x + 1] - edge_start[x]) as usize)
        .sum();
    let sink = (n + pulled_edges) as u32;
    let mut dst = vec![sink; backward_args];
    let mut pull = vec![0u32; backward_ops + 1];
    let mut leaf_pulls = Vec::new();
    let mut next = n as u32;
    // Targets in buffer order (leaves, then operations in run order): the operations'
    // ranges of pulled contributions follow each other as `pull` lays them out.
    for x in 0..n {
        let list = &target_edges[edge_start[x] as usize..edge_start[x + 1] as usize];
        let lo = next;
        if in_order(x) {
            for &(_, e) in list {
                dst[e as usize] = x as u32;
            }
        } else {
            // The interpreter's order: consumers descending, each one's operands ascending
            // (a consumer's edges are adjacent in `list`).
            let mut end = list.len();
            while end > 0 {
                let mut start = end - 1;
                while start > 0 && list[start - 1].0 == list[end - 1].0 {
                    start -= 1;
                }
                for &(_, e) in &list[start..end] {
                    dst[e as usize] = next;
                    next += 1;
                }
                end = start;
            }
        }
        match x.checked_sub(first_op) {
            Some(j) if j < backward_ops => {
                pull[j] = lo;
                pull[j + 1] = next;
            }
            Some(_) => {}
            None if next > lo => leaf_pulls.push((x as u32, lo, next)),
            None => {}
        }
    }
    debug_assert_eq!(next, sink);

    let mut values = vec![0.0; n];
    tape.for_each_initial_value(|s, v| values[index[s.index()] as usize] = v);
    let loss = tape.loss().map(|l| index[l.index()] as usize);
    let kernels = Kernels {
        stats: KernelStats {
            ops: num_ops,
            runs: runs.len(),
            edges,
            pulled_edges,
            fused: fusions.found.len(),
            fused_ops: fusions.found.iter().map(|f| f.1.len()).sum(),
        },
        runs,
        backward_runs,
        first_op,
        index,
        slot_order: Default::default(),
        arg_start,
        args,
        dst,
        pull,
        leaf_pulls,
        values,
        grads: vec![0.0; sink as usize + 1],
        num_params: tape.num_params(),
        num_inputs: tape.num_inputs(),
        loss,
        workspace: Default::default(),
    };
    kernels.check();
    kernels
}

impl Kernels {
    /// What the runs' indexing relies on (checked once, in every build: a wrong table would
    /// be a wrong number, not a crash, since every access is bounds-checked): each run
    /// computes one op over operands computed before it, and every gradient destination and
    /// pull range lies in the gradients.
    fn check(&self) {
        let mut next = 0;
        for run in &self.runs {
            assert_eq!(run.start, next, "runs tile the operations");
            assert!(run.end > run.start);
            next = run.end;
        }
        let ops = self.arg_start.len() - 1;
        assert_eq!(next as usize, ops);
        assert_eq!(self.first_op + ops, self.values.len());
        assert!(self.args.iter().all(|&a| (a as usize) < self.values.len()));
        let g = self.grads.len();
        assert!(self.dst.iter().all(|&d| (d as usize) < g));
        assert!(self.pull.windows(2).all(|w| w[0] <= w[1]));
        assert!(self.pull.iter().all(|&x| (x as usize) < g));
        for (i, run) in self.runs.iter().enumerate() {
            if let Body::Fused(pattern) = run.body {
                let backward = i < self.backward_runs;
                fused::check(
                    self,
                    pattern,
                    run.start as usize..run.end as usize,
                    backward,
                );
            }
        }
    }
}
