//! A map's backward in lanes in the vertical order ([`crate::passes::loops::Lanes`]): the
//! gradients of the operand every lane shares (a layer's inputs, a recurrent cell's state),
//! 8 steps at a time, one vector over the steps per lane, the lanes' rows turned into
//! columns by shuffles. Each step's slot gets the additions it got lane by lane, in the
//! same order.

use inkwell::types::VectorType;
use inkwell::values::{FloatValue, IntValue, VectorValue};

use super::lanes::{LaneIo, Reps, Vector};
use super::{Emit, Emitter, Frame};
use crate::passes::lanes::VERTICAL_BLOCK;
use crate::passes::loops::{Affine, MapLoop};

impl<'ctx> Emitter<'ctx, '_> {
    /// A map's backward in lanes (`locals` gives its local gradients at a step, per vector),
    /// in the vertical order the plan checked ([`crate::passes::loops::Lanes`]): the steps
    /// in blocks of [`VERTICAL_BLOCK`] from the last, each block's steps from the last adding
    /// into every operand but `shared` as usual, then `shared`'s gradients of the whole
    /// block, one vector over the block's steps added per lane, lanes from the last (each
    /// step's slot gets the additions it got lane by lane, in the same order).
    pub(super) fn vertical_backward(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        reps: &Reps<'ctx>,
        shared: usize,
        locals: impl Fn(&Self, IntValue<'ctx>) -> Emit<Vec<Vec<VectorValue<'ctx>>>>,
    ) -> Emit<()> {
        let i64t = self.context.i64_type();
        let block = i64t.const_int(VERTICAL_BLOCK as u64, false);
        self.emit_loop::<FloatValue>(map.len / VERTICAL_BLOCK, true, &[], |this, b, _| {
            let first = this.builder.build_int_mul(b, block, "block")?;
            // Per vector, `shared`'s local gradients at steps first + 0, 1, ...
            let mut rows: Vec<Vec<VectorValue>> = vec![Vec::new(); reps.vectors.len()];
            for u in (0..VERTICAL_BLOCK).rev() {
                let step = i64t.const_int(u as u64, false);
                let t = this.builder.build_int_add(first, step, "t")?;
                let locals = locals(this, t)?;
                this.accumulate_args_but(frame, map, t, reps, &locals, Some(shared))?;
                for (row, local) in rows.iter_mut().zip(&locals) {
                    row.insert(0, local[shared]);
                }
            }
            this.accumulate_block(frame, map.args[shared], first, reps, &rows)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// Adds `rows[vector][u]`, the gradients of the block of steps `first + u` for each
    /// vector of lanes, into `a`'s slots at those steps (shared by the lanes): one vector
    /// over the steps, vectors and lanes from the last.
    fn accumulate_block(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        first: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        rows: &[Vec<VectorValue<'ctx>>],
    ) -> Emit<()> {
        // The block's slots as if the steps were lanes: `a` moves by its stride per lane.
        let level = reps.lane_level();
        let mut across_steps = a;
        across_steps.outer[level] = a.stride;
        let mut at_first = reps.clone();
        at_first.js[level] = self.context.i64_type().const_zero();
        let steps = Vector {
            offset: 0,
            width: VERTICAL_BLOCK,
        };
        // Where these lanes make the slots' every addition, the sums start from 0.
        let mut acc = if self.plan.grads.sums_whole(a.base) {
            self.f64_type.vec_type(VERTICAL_BLOCK).const_zero()
        } else {
            VectorValue::load(self, frame.grads, across_steps, first, &at_first, steps)?
        };
        for (row, lanes) in rows.iter().zip(&reps.vectors).rev() {
            let columns = self.columns(row, lanes.width)?;
            for column in columns.into_iter().rev() {
                acc = self.builder.build_float_add(acc, column, "")?;
            }
        }
        VectorValue::store(
            self,
            frame.grads,
            across_steps,
            first,
            &at_first,
            steps,
            acc,
        )
    }

    /// Lanes `0..width` of each vector of `row`, each as one vector: the columns of the
    /// matrix whose rows are `row`. A square matrix of a power-of-two side is transposed in
    /// place, one bit of the lane index at a time (each stage swaps that bit of the row and
    /// column index, one two-source shuffle per row: log2(side) shuffles per row in all);
    /// any other is read column by column.
    fn columns(&self, row: &[VectorValue<'ctx>], width: u32) -> Emit<Vec<VectorValue<'ctx>>> {
        let side = row.len();
        let square = side == width as usize && side.is_power_of_two() && side > 1;
        if !square || row[0].get_type().get_size() != width {
            return (0..width).map(|lane| self.column(row, lane)).collect();
        }
        let i32t = self.context.i32_type();
        let mut rows = row.to_vec();
        let mut bit = 1;
        while bit < side {
            // Rows r (bit clear) and r | bit; element (r, c) moves to (r with c's bit, c with
            // r's bit). Indices 0..side pick from row r, side.. from row r | bit.
            let pick = |upper: bool| {
                let indices: Vec<_> = (0..side)
                    .map(|c| match (upper, c & bit != 0) {
                        (false, false) => c,
                        (false, true) => side + (c ^ bit),
                        (true, false) => c | bit,
                        (true, true) => side + c,
                    })
                    .map(|i| i32t.const_int(i as u64, false))
                    .collect();
                VectorType::const_vector(&indices)
            };
            let mut next = rows.clone();
            for r in (0..side).filter(|r| r & bit == 0) {
                let (lower, upper) = (rows[r], rows[r | bit]);
                next[r] = self
                    .builder
                    .build_shuffle_vector(lower, upper, pick(false), "")?;
                next[r | bit] = self
                    .builder
                    .build_shuffle_vector(lower, upper, pick(true), "")?;
            }
            rows = next;
            bit <<= 1;
        }
        Ok(rows)
    }

    /// Lane `lane` of each vector of `row`, as one vector (a column of the matrix whose rows
    /// are `row`): pairs picked by shuffles, then joined.
    fn column(&self, row: &[VectorValue<'ctx>], lane: u32) -> Emit<VectorValue<'ctx>> {
        let i32t = self.context.i32_type();
        let mask = |indices: &mut dyn Iterator<Item = u32>| {
            let values: Vec<_> = indices.map(|i| i32t.const_int(i as u64, false)).collect();
            VectorType::const_vector(&values)
        };
        let width = row[0].get_type().get_size();
        let mut parts: Vec<VectorValue<'ctx>> = row
            .chunks(2)
            .map(|pair| {
                let pick = mask(&mut [lane, width + lane].into_iter());
                self.builder
                    .build_shuffle_vector(pair[0], pair[1], pick, "")
            })
            .collect::<Result<_, _>>()?;
        while parts.len() > 1 {
            parts = parts
                .chunks(2)
                .map(|pair| {
                    let n = pair[0].get_type().get_size();
                    let join = mask(&mut (0..2 * n));
                    self.builder
                        .build_shuffle_vector(pair[0], pair[1], join, "")
                })
                .collect::<Result<_, _>>()?;
        }
        Ok(parts[0])
    }
}
