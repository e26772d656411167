//! A minibatch's sample in stages, `train`'s dot cut by its rows ([`crate::plan::split`]),
//! for [`crate::minibatch`] to run the rows on different threads:
//!
//! - `acc_head(vals, grads, sample, guard, first, end, from_biases, ahead)`: the dot's sums
//!   continued over its steps `first..end` of `sample`, from the biases if `from_biases` is
//!   not 0, else from the sums in `vals` (another stage's); the same inputs of `ahead`, the
//!   sample the next call reads, asked into the cache meanwhile (they come from memory);
//! - `acc_rest(vals, grads, sample, loss)`: the sample's inputs but the dot's copied
//!   in and run forward and backward from the dot's sums in `vals` (its loss into `loss`),
//!   everything of the dot left out but its sums' gradients, which are added into the
//!   biases' and left in `grads`;
//! - `acc_tail(vals, grads, sample, first, end)`: the weights' gradients of steps
//!   `first..end` of `sample` added from the sums' gradients in `grads`.
//!
//! Each skips zero inputs as `accumulate` does (`emit/sparse.rs`), within its rows; head and
//! tail read the inputs from the sample, as `train` does, not from the buffer.

use inkwell::values::{BasicValueEnum, VectorValue};
use inkwell::IntPredicate;

use super::lanes::Reps;
use super::sparse::Rows;
use super::{Emit, Emitter, Frame, Part, Pass, ACC_HEAD, ACC_REST, ACC_TAIL};
use crate::passes::loops::{DotLoop, Nest};
use crate::plan::split::split_nest;
use crate::plan::ZeroSkip;

impl<'ctx> Emitter<'ctx, '_> {
    /// The three stages, where the plan splits `train`'s dot; `forward` and `backward` are
    /// `accumulate`'s parts.
    pub(super) fn split_entries(
        &self,
        forward: &[Part<'ctx>],
        backward: &[Part<'ctx>],
    ) -> Emit<()> {
        let (Some(_), Some(step), Some(skip)) =
            (&self.plan.split, &self.plan.step, self.zero_skip())
        else {
            return Ok(());
        };
        let (nest, dot) = split_nest(&self.plan.functions, step).expect("the plan found it");
        self.acc_head(nest, dot, skip)?;
        self.acc_rest(forward, backward)?;
        self.acc_tail(nest, dot, skip)
    }

    fn acc_head(&self, nest: &Nest, dot: &DotLoop, skip: &ZeroSkip) -> Emit<()> {
        let (ptr, i64t) = (
            self.context.ptr_type(Default::default()),
            self.context.i64_type(),
        );
        let types = [
            ptr.into(),
            ptr.into(),
            i64t.into(),
            i64t.into(),
            i64t.into(),
            ptr.into(),
        ];
        let f = self.begin_function(ACC_HEAD, &types, true);
        let (vals, grads) = self.buffers(f);
        let param = |i| f.get_nth_param(i).unwrap();
        let guard = param(3).into_pointer_value();
        let sample = param(2).into_pointer_value();
        let rows = self.rows(dot, param(4), param(5))?;
        let from_biases = self.builder.build_int_compare(
            IntPredicate::NE,
            param(6).into_int_value(),
            i64t.const_zero(),
            "from_biases",
        )?;
        let frame = Frame {
            vals,
            grads,
            scratch: self.value_scratch(0)?,
            pass: Pass::Stage {
                sample,
                ahead: Some(param(7).into_pointer_value()),
            },
        };
        let group = nest.lanes.forward().expect("a split nest runs in lanes");
        self.in_groups(nest, group, false, |this, reps| {
            let biases = this.load_first::<VectorValue>(vals, dot.sum.first, reps)?;
            let sums = this.load_first::<VectorValue>(vals, dot.sum.slot, reps)?;
            let starts = biases
                .iter()
                .zip(&sums)
                .map(|(&b, &s)| {
                    let start = this.builder.build_select(from_biases, b, s, "start")?;
                    Ok(start.into_vector_value())
                })
                .collect::<Emit<Vec<_>>>()?;
            let sums = this.dot_rows_forward(frame, dot, reps, (skip, guard), rows, &starts)?;
            this.store_first(vals, dot.sum.slot, reps, &sums)
        })?;
        self.builder.build_return(None)?;
        Ok(())
    }

    fn acc_rest(&self, forward: &[Part<'ctx>], backward: &[Part<'ctx>]) -> Emit<()> {
        let ptr = self.context.ptr_type(Default::default());
        let zero = self.context.i64_type().const_zero();
        let rest = |backward| self.accumulate_function(ACC_REST, backward, true);
        let (forward0, backward0) = (rest(false)?, rest(true)?);
        let f = self.begin_function(ACC_REST, &[ptr.into(), ptr.into()], true);
        let (vals, grads) = self.buffers(f);
        let param = |i| f.get_nth_param(i).unwrap().into_pointer_value();
        let (sample, loss) = (param(2), param(3));
        // (No guard word: the only skipping in function 0 is the dot's, left out.)
        let guard = ptr.const_null();
        let train = self.plan.step.as_ref().and_then(|s| s.train.as_ref());
        self.copy_other_inputs(train.expect("a split dot is train's"), vals, sample)?;
        self.run_parts(forward, 0, Some(forward0), vals, grads, guard)?;
        self.store_loss(vals, loss, zero)?;
        self.run_parts(
            backward,
            backward.len() - 2,
            Some(backward0),
            vals,
            grads,
            guard,
        )?;
        self.builder.build_return(None)?;
        Ok(())
    }

    fn acc_tail(&self, nest: &Nest, dot: &DotLoop, skip: &ZeroSkip) -> Emit<()> {
        let (ptr, i64t) = (
            self.context.ptr_type(Default::default()),
            self.context.i64_type(),
        );
        let types = [ptr.into(), i64t.into(), i64t.into()];
        let f = self.begin_function(ACC_TAIL, &types, true);
        let (vals, grads) = self.buffers(f);
        let param = |i| f.get_nth_param(i).unwrap();
        let sample = param(2).into_pointer_value();
        let rows = self.rows(dot, param(3), param(4))?;
        let frame = Frame {
            vals,
            grads,
            scratch: super::local::Scratch::Backward(None),
            pass: Pass::Stage {
                sample,
                ahead: None,
            },
        };
        let group = nest.lanes.backward().expect("a split nest runs in lanes");
        self.in_groups(nest, group, true, |this, reps| {
            let gs = this.load_first::<VectorValue>(grads, dot.sum.slot, reps)?;
            this.dot_rows_backward(frame, dot, reps, skip, rows, &gs)
        })?;
        self.builder.build_return(None)?;
        Ok(())
    }

    /// `nest`'s lane groups of `group` repetitions, each running `body`, as loop code.
    fn in_groups(
        &self,
        nest: &Nest,
        group: u32,
        descending: bool,
        mut body: impl FnMut(&Self, &Reps<'ctx>) -> Emit<()>,
    ) -> Emit<()> {
        self.loop_code(|| {
            self.for_each_group(nest.count, group, descending, &Reps::top(), &mut body)
        })
    }

    /// Steps `first..end` of `dot` as [`Rows`] (the caller passes `first <= end <= len`).
    fn rows(
        &self,
        dot: &DotLoop,
        first: BasicValueEnum<'ctx>,
        end: BasicValueEnum<'ctx>,
    ) -> Emit<Rows<'ctx>> {
        let first = first.into_int_value();
        let count = self
            .builder
            .build_int_sub(end.into_int_value(), first, "count")?;
        Ok(Rows {
            first,
            count,
            len: dot.products.len,
        })
    }
}
