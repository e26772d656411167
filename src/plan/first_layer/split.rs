//! Where a minibatch's first layer can be cut by its rows across threads
//! ([`crate::minibatch`]): `train`'s dot (a layer's sums over the inputs, skipping zero
//! inputs) as stages that each own a range of its steps, with those rows of weights, their
//! gradients and their update.
//!
//! A stage continues the sums from where the previous stage left them, over its own steps in
//! order (`acc_head`); the rest of the sample runs from the finished sums (`acc_rest`), which
//! leaves the sums' gradients; each stage then adds its rows' weight gradients from them
//! (`acc_tail`). Every addition happens as in `accumulate`, in the same order, so the split
//! changes no bit; what it needs of the layout is checked here: the rows of weights are one
//! block of whole rows (no other param among them), the sums side by side, the inputs in
//! step order.

use crate::minibatch::SplitRows;
use crate::passes::schedule::{DotLoop, Item, Nest};
use crate::plan::buffers::Buffers;
use crate::plan::nests::{Lanes, Nests};
use crate::plan::step::StepPlan;
use crate::tape::{Slot, Tape};

/// The nest that `train`'s dot opens and the dot, if it is the first item of function 0
/// (where `train_plan` found it first on the tape).
pub fn split_nest<'p>(
    functions: &'p [Vec<Item>],
    step: &StepPlan,
) -> Option<(&'p Nest, &'p DotLoop)> {
    let train = step.train.as_ref()?;
    let Some(Item::Nest(nest)) = functions.first()?.first() else {
        return None;
    };
    match nest.body.first() {
        Some(Item::Dot(dot)) if dot.sum.slot == train.dot => Some((nest, dot)),
        _ => None,
    }
}

/// The split of `train`'s dot, where `train` skips its zero inputs, its nest runs forward
/// and backward in lanes (not vertically), and the layout is as [`SplitRows`] says.
pub fn find(
    tape: &Tape,
    functions: &[Vec<Item>],
    nests: &Nests,
    buffers: &Buffers,
    step: Option<&StepPlan>,
) -> Option<SplitRows> {
    let step = step?;
    let skip = step.train.as_ref()?.skip_zeros.as_ref()?;
    let (nest, dot) = split_nest(functions, step)?;
    if !matches!(
        nests.of(nest).lanes,
        Lanes::Both {
            vertical: false,
            ..
        }
    ) {
        return None;
    }
    let (count, rows) = (nest.count as usize, dot.products.len as usize);
    let weights = buffers.affine(dot.products.args[1 - skip.input]);
    let inputs = buffers.affine(dot.products.args[skip.input]);
    let sums = buffers.affine(dot.sum.slot);
    let side_by_side = weights.outer[0] == 1 && sums.outer[0] == 1;
    let row_stride = usize::try_from(weights.stride).ok()?;
    if !side_by_side || row_stride < count || inputs.stride != 1 || inputs.outer[0] != 0 {
        return None;
    }
    let first_weight = usize::try_from(weights.base).ok()?;
    let block = first_weight..first_weight + rows * row_stride;
    // No param but the dot's weights in the block: `rows * count` params in it.
    let in_block = (0..tape.num_params())
        .filter(|&p| block.contains(&buffers.address(Slot(p as u32))))
        .count();
    if in_block != rows * count {
        return None;
    }
    let first_sum = usize::try_from(sums.base).ok()?;
    let first_input = usize::try_from(inputs.base)
        .ok()?
        .checked_sub(buffers.params_len(tape))?;
    if first_input + rows > tape.num_inputs() {
        return None;
    }
    Some(SplitRows {
        rows,
        first_weight,
        row_stride,
        sums: first_sum..first_sum + count,
        first_input,
    })
}
