//! A map's backward in lanes in the vertical order ([`crate::plan::Lanes`]): the
//! gradients of the operand every lane shares (a layer's inputs, a recurrent cell's state),
//! 8 steps at a time, one vector over the steps per lane: a dot's products computed as such
//! columns from columns of their operands (a weight matrix the function never writes
//! transposed once, at its entry), any other map's rows turned into columns by shuffles.
//! Each step's slot gets the additions it got lane by lane, in the same order.

use inkwell::types::VectorType;
use inkwell::values::{FloatValue, IntValue, VectorValue};

use super::lane_io::{LaneIo, Reps, Vector};
use super::{Emit, Emitter, Frame, Pass};
use crate::passes::lane_order::VERTICAL_BLOCK;
use crate::passes::schedule::{Affine, MapLoop};

/// A block's steps as one vector of lanes.
const STEPS: Vector = Vector {
    offset: 0,
    width: VERTICAL_BLOCK,
};

impl<'ctx> Emitter<'ctx, '_> {
    /// A map's backward in lanes (`locals` gives its local gradients at a step, per vector),
    /// in the vertical order the plan checked ([`crate::plan::Lanes`]): the steps
    /// after the last whole block lane by lane, from the last (as
    /// [`crate::passes::lane_order::vertical_block`] says), then the steps
    /// in blocks of [`VERTICAL_BLOCK`] from the last, each block's steps from the last adding
    /// into every operand but `shared` as usual, then `shared`'s gradients of the whole
    /// block, one vector over the block's steps added per lane, lanes from the last (each
    /// step's slot gets the additions it got lane by lane, in the same order).
    ///
    /// With `g_products` (a dot's products, whose gradient per vector of lanes is the same at
    /// every step), `shared`'s local gradients are computed as columns directly where the
    /// other operands allow ([`Emitter::products_columns`]): no shuffles per block.
    pub(super) fn vertical_backward(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        reps: &Reps<'ctx>,
        shared: usize,
        g_products: Option<&[VectorValue<'ctx>]>,
        locals: impl Fn(&Self, IntValue<'ctx>) -> Emit<Vec<Vec<VectorValue<'ctx>>>>,
    ) -> Emit<()> {
        let i64t = self.context.i64_type();
        // The steps after the last whole block first, lane by lane (`vertical_block`).
        let whole = map.len - map.len % VERTICAL_BLOCK;
        for t in (whole..map.len).rev() {
            let t = i64t.const_int(t as u64, false);
            let locals = locals(self, t)?;
            self.accumulate_args(frame, map, t, reps, &locals)?;
        }
        let block = i64t.const_int(VERTICAL_BLOCK as u64, false);
        self.emit_loop::<FloatValue>(map.len / VERTICAL_BLOCK, true, &[], |this, b, _| {
            let first = this.builder.build_int_mul(b, block, "block")?;
            let direct = match g_products {
                Some(gs) => this.products_columns(frame, map, reps, shared, first, gs)?,
                None => None,
            };
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
            let columns = match direct {
                Some(columns) => columns,
                None => rows
                    .iter()
                    .zip(&reps.vectors)
                    .map(|(row, lanes)| this.columns(row, lanes.width))
                    .collect::<Emit<_>>()?,
            };
            this.accumulate_block(frame, map.args[shared], first, reps, &columns)?;
            Ok(Vec::new())
        })?;
        Ok(())
    }

    /// `shared`'s local gradients of a dot's products over the block of steps from `first`,
    /// as columns (per vector of lanes, per lane, one vector over the steps), computed on
    /// columns of the operands: each other operand either the same at every step (a splat of
    /// its lane) or unchanged by this function (a layer's weights: its block transposed once,
    /// where the function begins, not once per repetition of the nests around), `shared`
    /// loaded across the steps, the products' gradient `g_products` the same at every step.
    /// The same operations on the same numbers as the rows'. `None` where an operand is
    /// neither.
    fn products_columns(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        reps: &Reps<'ctx>,
        shared: usize,
        first: IntValue<'ctx>,
        g_products: &[VectorValue<'ctx>],
    ) -> Emit<Option<Vec<Vec<VectorValue<'ctx>>>>> {
        let mut out = Vec::with_capacity(reps.vectors.len());
        for (&lanes, &g) in reps.vectors.iter().zip(g_products) {
            // Per operand, per lane: its values over the steps.
            let mut operands: Vec<Vec<VectorValue<'ctx>>> = Vec::with_capacity(map.args.len());
            for (i, &a) in map.args.iter().enumerate() {
                let columns = if i == shared {
                    let (across_steps, at_first) = self.steps_as_lanes(a, reps);
                    let x =
                        VectorValue::load(self, frame.vals, across_steps, first, &at_first, STEPS)?;
                    vec![x; lanes.width as usize]
                } else if a.stride == 0 {
                    let row = VectorValue::load(self, frame.vals, a, first, reps, lanes)?;
                    (0..lanes.width)
                        .map(|lane| self.lane_splat(row, lane))
                        .collect::<Emit<_>>()?
                } else {
                    match self.invariant_columns(frame, a, first, reps, lanes)? {
                        Some(columns) => columns,
                        None => return Ok(None),
                    }
                };
                operands.push(columns);
            }
            let mut columns = Vec::with_capacity(lanes.width as usize);
            for lane in 0..lanes.width {
                let x: Vec<VectorValue> = operands.iter().map(|o| o[lane as usize]).collect();
                let g_lane = self.lane_splat(g, lane)?;
                columns.push(self.product_grads(map, STEPS, &x, g_lane)?[shared]);
            }
            out.push(columns);
        }
        Ok(Some(out))
    }

    /// `a`'s slots over a block of steps as if the steps were the lanes of [`STEPS`] (`a`
    /// moves by its stride per lane), and the repetitions of `reps` with the lanes' at 0.
    fn steps_as_lanes(&self, a: Affine, reps: &Reps<'ctx>) -> (Affine, Reps<'ctx>) {
        let level = reps.lane_level();
        let mut across_steps = a;
        across_steps.outer[level] = a.stride;
        let mut at_first = reps.clone();
        at_first.js[level] = self.context.i64_type().const_zero();
        (across_steps, at_first)
    }

    /// Lane `lane` of `v` in every lane of a vector of [`VERTICAL_BLOCK`].
    fn lane_splat(&self, v: VectorValue<'ctx>, lane: u32) -> Emit<VectorValue<'ctx>> {
        let i32t = self.context.i32_type();
        let indices = vec![i32t.const_int(lane as u64, false); VERTICAL_BLOCK as usize];
        self.builder
            .build_shuffle_vector(v, v, VectorType::const_vector(&indices), "")
    }

    /// Operand `a`'s values over the block of steps from `first`, per lane of `lanes` one
    /// vector over the steps, if the function never writes them (params that are not
    /// updated in it: a plain backward, or `step`'s where no fused update reaches them) and
    /// the slots are known here (the block and the lanes' repetitions are constants, the
    /// nests around move nothing): loaded and transposed at the function's entry, so a loop
    /// around (a rollout's steps) reuses them. `None` otherwise.
    fn invariant_columns(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        first: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
    ) -> Emit<Option<Vec<VectorValue<'ctx>>>> {
        if !matches!(frame.pass, Pass::Backward { .. }) {
            return Ok(None);
        }
        let i64t = self.context.i64_type();
        let level = reps.lane_level();
        let constant = |v: IntValue<'ctx>| v.get_zero_extended_constant();
        let Some(first_step) = constant(first) else {
            return Ok(None);
        };
        // The repetitions, as constants (0 where `a` does not move with them).
        let mut js = Vec::with_capacity(reps.js.len());
        for (l, &j) in reps.js.iter().enumerate() {
            match (a.outer[l], constant(j)) {
                (_, Some(j)) => js.push(j as i64),
                (0, None) if l != level => js.push(0),
                _ => return Ok(None),
            }
        }
        let params = self.tape.num_params() as i64;
        let unwritten = (0..VERTICAL_BLOCK as i64).all(|u| {
            (0..lanes.width as i64).all(|lane| {
                let mut at = js.clone();
                at[level] += lanes.offset as i64 + lane;
                let s = a.base
                    + a.stride * (first_step as i64 + u)
                    + at.iter().zip(&a.outer).map(|(j, o)| j * o).sum::<i64>();
                (0..params).contains(&s)
                    && !(frame.steps()
                        && self.plan.step.as_ref().is_some_and(|p| p.fuses(s as usize)))
            })
        });
        if !unwritten {
            return Ok(None);
        }
        let here = self.block();
        let entry = here
            .get_parent()
            .and_then(|f| f.get_first_basic_block())
            .expect("the block is in a function");
        match entry.get_terminator() {
            Some(branch) => self.builder.position_before(&branch),
            None => self.builder.position_at_end(entry),
        }
        let constant_reps = Reps {
            js: js
                .iter()
                .map(|&j| i64t.const_int(j as u64, false))
                .collect(),
            ..reps.clone()
        };
        let rows = (0..VERTICAL_BLOCK)
            .map(|u| {
                let t = i64t.const_int(first_step + u as u64, false);
                VectorValue::load(self, frame.vals, a, t, &constant_reps, lanes)
            })
            .collect::<Emit<Vec<_>>>()?;
        let columns = self.columns(&rows, lanes.width)?;
        self.builder.position_at_end(here);
        Ok(Some(columns))
    }

    /// Adds `columns[vector][lane]`, the gradients of the block of steps from `first` for
    /// each lane (one vector over the steps), into `a`'s slots at those steps (shared by the
    /// lanes), vectors and lanes from the last.
    fn accumulate_block(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        first: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        columns: &[Vec<VectorValue<'ctx>>],
    ) -> Emit<()> {
        let (across_steps, at_first) = self.steps_as_lanes(a, reps);
        // Where these lanes make the slots' every addition, the sums start from 0.
        let mut acc = if self.plan.grads.sums_whole(a.base) {
            self.f64_type().vec_type(VERTICAL_BLOCK).const_zero()
        } else {
            VectorValue::load(self, frame.grads, across_steps, first, &at_first, STEPS)?
        };
        for &column in columns.iter().flat_map(|c| c.iter()).rev() {
            acc = self.builder.build_float_add(acc, column, "")?;
        }
        VectorValue::store(
            self,
            frame.grads,
            across_steps,
            first,
            &at_first,
            STEPS,
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
