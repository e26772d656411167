//! Param layout: where each param lives in the buffers.
//!
//! The graph numbers params in creation order, which for a layer is neuron by neuron: the
//! weight a neuron applies to input `t` sits one whole row away from the next neuron's. A
//! [`Nest`] computes its repetitions (neurons) side by side, so it wants the opposite: the
//! weights of all neurons for one input next to each other. This pass moves every param
//! matrix a nest reads into that order (input-major, repetition-minor), which makes the
//! lowering's loads unit-stride across repetitions. Only slots move; no operation changes,
//! so results stay bit-identical. [`crate::Program::params`] and friends keep speaking
//! creation order.

use crate::passes::loops::{Affine, Item, Nest, Schedule};
use crate::tape::Tape;

/// The param layout for `schedule`'s nests as `from` for [`Tape::with_param_layout`] (the
/// param now in slot `from[s]` moves to slot `s`), or `None` if every param stays.
pub fn param_layout(tape: &Tape, schedule: &Schedule) -> Option<Vec<u32>> {
    let p = tape.num_params();
    let mut placed = vec![false; p];
    let mut from = Vec::with_capacity(p);
    for item in &schedule.items {
        let Item::Nest(nest) = item else { continue };
        for (a, len) in operands(nest) {
            if a.outer == 0 {
                continue;
            }
            // Input-major: every repetition's slot for `t`, then for `t + 1`.
            let slots: Vec<u32> = (0..len)
                .flat_map(|t| (0..nest.count).map(move |j| a.at_nested(t, j).0))
                .collect();
            let free = slots
                .iter()
                .all(|&s| (s as usize) < p && !placed[s as usize]);
            let distinct = free && {
                let mut seen = slots.clone();
                seen.sort_unstable();
                seen.windows(2).all(|w| w[0] != w[1])
            };
            if distinct {
                for &s in &slots {
                    placed[s as usize] = true;
                }
                from.extend(slots);
            }
        }
    }
    from.extend((0..p as u32).filter(|&s| !placed[s as usize]));
    let moved = from.iter().enumerate().any(|(s, &f)| s as u32 != f);
    moved.then_some(from)
}

/// The operands a nest reads, each with its length along `t`.
fn operands(nest: &Nest) -> Vec<(Affine, u32)> {
    nest.body
        .iter()
        .flat_map(|item| match item {
            Item::Map(m) => m.args.iter().map(|&a| (a, m.len)).collect(),
            Item::Sum(s) => vec![(s.first, 1), (s.tail, s.tail_len)],
            Item::Dot(d) => vec![
                (d.sum.first, 1),
                (d.products.args[0], d.products.len),
                (d.products.args[1], d.products.len),
            ],
            Item::Straight(_) | Item::Nest(_) => Vec::new(),
        })
        .collect()
}
