//! A chain's link in lanes: `x[s] - x[s - 1]` adds into two windows of one gradient array,
//! one lane apart (operand by operand, the later operand first: `MapLoop::operands_from_last`).
//! Each window is a load, an add and a store per vector; the second window's loads then
//! straddle the first's stores, which a core cannot forward, and wait for them to reach the
//! cache (a third of the spring chain's backward). Both windows' additions are made in
//! registers instead: each slot receives exactly the additions it did, in the same order.

use inkwell::values::{IntValue, VectorValue};

use super::lanes::{LaneIo, Reps, Vector};
use super::{Emit, Emitter, Frame};
use crate::passes::lanes::backward_operands;
use crate::passes::loops::MapLoop;
use crate::plan::memory::Addition;

impl<'ctx> Emitter<'ctx, '_> {
    /// Adds `map`'s local gradients `locals[vector][operand]` into its two operands if they
    /// are neighbours: the operand added into second lies one lane after the first, both in
    /// the buffers as vectors (no local, no first addition stored whole, no fused update).
    /// Whether it did.
    ///
    /// Slot `A + k` (`A` the first operand's first lane, `k < n` for `n` lanes) holds
    /// `(g + d1[k]) + d2[k - 1]` afterwards, `A + n` holds `g + d2[n - 1]`, `A` holds `g +
    /// d1[0]`: the first window loaded and added into, the second's terms shifted by one
    /// lane and added (but into lane 0), stored; the one slot past the window alone.
    pub(super) fn accumulate_neighbours(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        locals: &[Vec<VectorValue<'ctx>>],
    ) -> Emit<bool> {
        let &[(i, first), (j, second)] = &backward_operands(map)[..] else {
            return Ok(false);
        };
        let in_buffers = |k: usize| {
            let a = map.args[k];
            self.plan.grads.local.place(a).is_none()
                && !self.plan.grads.stores_whole(Addition::map_arg(map, k))
                && !self.fuses_update(frame, a)
                && self.across(a, reps) == 1
        };
        let (from, to) = (
            self.plan.buffers.affine(first),
            self.plan.buffers.affine(second),
        );
        let neighbours = to
            == crate::passes::loops::Affine {
                base: from.base + 1,
                ..from
            };
        if !neighbours || !in_buffers(i) || !in_buffers(j) {
            return Ok(false);
        }
        let i32t = self.context.i32_type();
        let lane = |k: u32| i32t.const_int(k as u64, false);
        let mut carried = None;
        for (&lanes, local) in reps.vectors.iter().zip(locals) {
            let (d1, d2) = (local[i], local[j]);
            let g = VectorValue::load(self, frame.grads, first, t, reps, lanes)?;
            let once = self.builder.build_float_add(g, d1, "")?;
            // d2 one lane on: lane 0 from the vector before (none before the first).
            let mask: Vec<_> = (0..lanes.width)
                .map(|k| match k {
                    0 => i32t.get_undef(),
                    k => lane(k - 1),
                })
                .collect();
            let undef = d2.get_type().get_undef();
            let shifted = self.builder.build_shuffle_vector(
                d2,
                undef,
                inkwell::types::VectorType::const_vector(&mask),
                "",
            )?;
            let twice = match carried {
                Some(before) => {
                    let shifted =
                        self.builder
                            .build_insert_element(shifted, before, lane(0), "")?;
                    self.builder.build_float_add(once, shifted, "")?
                }
                None => {
                    // Lane 0 (slot A) takes no second addition.
                    let all = self.builder.build_float_add(once, shifted, "")?;
                    let keep: Vec<_> = (0..lanes.width)
                        .map(|k| lane(if k == 0 { 0 } else { lanes.width + k }))
                        .collect();
                    self.builder.build_shuffle_vector(
                        once,
                        all,
                        inkwell::types::VectorType::const_vector(&keep),
                        "",
                    )?
                }
            };
            VectorValue::store(self, frame.grads, first, t, reps, lanes, twice)?;
            carried = Some(
                self.builder
                    .build_extract_element(d2, lane(lanes.width - 1), "")?,
            );
        }
        // The slot after the window: the second operand's last lane.
        let (Some(last), Some(d)) = (reps.vectors.last(), carried) else {
            return Ok(true);
        };
        let after = Vector {
            offset: last.offset + last.width - 1,
            width: 1,
        };
        let g = VectorValue::load(self, frame.grads, second, t, reps, after)?;
        let d = self
            .builder
            .build_insert_element(g.get_type().get_undef(), d, lane(0), "")?;
        let sum = self.builder.build_float_add(g, d, "")?;
        VectorValue::store(self, frame.grads, second, t, reps, after, sum)?;
        Ok(true)
    }
}
