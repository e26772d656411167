//! A chain's link in lanes: `x[s] - x[s - 1]` reads, and adds into, two windows of one
//! array one lane apart. Backward adds operand by operand (the later operand first:
//! `NestPlan::operands_from_last`), each window a load, an add and a store per vector; the
//! second window's loads then straddle the first's stores, which a core cannot forward, and
//! wait for them to reach the cache (a third of the spring chain's backward). Forward reads
//! a window right after the nest before stored the other (a mass's `t[i + 1] - t[i]` of
//! its springs' tensions), with the same wait. So both windows' additions are made in
//! registers, each slot receiving exactly the additions it did, in the same order; and the
//! lower window is read as the upper one shifted by a lane, plus the one number before it.
//! Which window is the one in memory (stored, or loaded) is the one that holds no chain end
//! (`Buffers::is_end`): the nest that wrote those slots, or reads them next, has its vectors
//! there, and a store forwards only to a load that lies within it.

use inkwell::types::VectorType;
use inkwell::values::{FloatValue, IntValue, VectorValue};

use super::lane_io::{LaneIo, Reps, Vector};
use super::{Emit, Emitter, Frame};
use crate::passes::lane_order::backward_operands;
use crate::passes::schedule::{Affine, MapLoop};
use crate::plan::memory::Addition;

impl<'ctx> Emitter<'ctx, '_> {
    /// Adds `map`'s local gradients `locals[vector][operand]` into its two operands if they
    /// are neighbours: the operand added into second lies one lane after the first, both in
    /// the buffers as vectors (no local, no fused update; the second's additions not the
    /// first into their slots, as the first operand's come before them). Whether it did.
    ///
    /// With `A` the first operand's first lane and `n` lanes, slot `A` gets `g + d1[0]`, slot
    /// `A + k` (`0 < k < n`) `(g + d1[k]) + d2[k - 1]`, slot `A + n` `g + d2[n - 1]` (`0 + d1`
    /// for `g + d1` where the plan says the first operand's additions are its slots' first,
    /// [`crate::plan::GradMemory`]). The vectors go on the first window, the second's terms
    /// shifted up a lane into them and slot `A + n` alone; or, where the first window holds a
    /// chain's end and the second does not ([`Emitter::window_holds_end`]), on the second
    /// window, the first's terms shifted down a lane into them and slot `A` alone.
    pub(super) fn accumulate_neighbours(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        locals: &[Vec<VectorValue<'ctx>>],
    ) -> Emit<bool> {
        let &[(i, first), (j, second)] = &backward_operands(map, reps.operands_from_last)[..]
        else {
            return Ok(false);
        };
        let in_buffers = |k: usize| {
            let a = map.args[k];
            self.plan.grads.local.place(a).is_none()
                && !self.fuses_update(frame, a)
                && self.across(a, reps) == 1
        };
        let whole = |k: usize| self.plan.grads.stores_whole(Addition::map_arg(map, k));
        if !self.one_lane_on(first, second) || !in_buffers(i) || !in_buffers(j) || whole(j) {
            return Ok(false);
        }
        let down = self.window_holds_end(first, reps) && !self.window_holds_end(second, reps);
        let (stored, whole_first) = (if down { second } else { first }, whole(i));
        // Up: the second's last lane of the vector before; down: the first's lane 0 of the
        // vector after. None at the group's edge, whose lane takes no such term.
        let mut carried = None;
        for (k, (&lanes, local)) in reps.vectors.iter().zip(locals).enumerate() {
            let (d1, d2, edge) = if down {
                let next = match locals.get(k + 1) {
                    Some(next) => Some(self.lane_of(next[i], 0)?),
                    None => None,
                };
                (
                    self.shifted(local[i], next, true)?,
                    local[j],
                    next.is_none(),
                )
            } else {
                let before = carried.replace(self.lane_of(local[j], lanes.width - 1)?);
                (
                    local[i],
                    self.shifted(local[j], before, false)?,
                    before.is_none(),
                )
            };
            let g = || VectorValue::load(self, frame.grads, stored, t, reps, lanes);
            let once = match whole_first {
                // Each lane's first addition: what the zeroed buffer would hold after it.
                true => self.fresh(&[d1])?[0],
                false => self.builder.build_float_add(g()?, d1, "")?,
            };
            // Down, the last slot (past the first window) takes no first addition.
            let once = match down && edge {
                true => self.with_lane_of(once, g()?, lanes.width - 1)?,
                false => once,
            };
            let all = self.builder.build_float_add(once, d2, "")?;
            // Up, slot A takes no second addition.
            let all = match !down && edge {
                true => self.with_lane_of(all, once, 0)?,
                false => all,
            };
            VectorValue::store(self, frame.grads, stored, t, reps, lanes, all)?;
        }
        // The slot outside the vectors, alone: `A` down, `A + n` up.
        let (Some(head), Some(last), Some(local)) =
            (reps.vectors.first(), reps.vectors.last(), locals.first())
        else {
            return Ok(true);
        };
        match (down, carried) {
            (true, _) => {
                let d = self.lane_of(local[i], 0)?;
                self.add_alone(frame, first, t, reps, head.offset, d, whole_first)?;
            }
            (false, Some(d)) => {
                let after = last.offset + last.width - 1;
                self.add_alone(frame, second, t, reps, after, d, false)?;
            }
            (false, None) => {}
        }
        Ok(true)
    }

    /// Whether the lanes of `a` (in the first repetition of every nest) hold a chain's end
    /// element laid out beside a run's repetitions ([`crate::plan::Buffers::is_end`]), first
    /// or last: that run's vectors, which its own code loads and stores next, start or end
    /// one lane on. A core forwards a store to a load only when the load lies within it, so
    /// vectors stored or loaded from such a window straddle every vector the run loads or
    /// stored, and each load waits for the stores to reach the cache.
    fn window_holds_end(&self, a: Affine, reps: &Reps<'ctx>) -> bool {
        let lanes = reps.vectors.last().map_or(0, |v| v.offset + v.width) as i64;
        let first = self.plan.buffers.affine(a).base;
        let buffers = &self.plan.buffers;
        lanes > 0 && (buffers.is_end(first) || buffers.is_end(first + lanes - 1))
    }

    /// The two operands of `map` for `lanes`, if they lie one lane apart in the buffers (no
    /// local value): the upper window loaded, the lower one that shifted up a lane, its first
    /// lane the upper's lane before (in the group's vector before; before the group, loaded
    /// alone); or, where the upper window holds a chain's end and the lower does not
    /// ([`Emitter::window_holds_end`]), the lower loaded and the upper shifted down a lane.
    pub(super) fn load_neighbours(
        &self,
        frame: Frame<'ctx>,
        map: &MapLoop,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        lanes: Vector,
    ) -> Emit<Option<Vec<VectorValue<'ctx>>>> {
        let &[a, b] = &map.args[..] else {
            return Ok(None);
        };
        let in_buffers = |x| self.plan.local_values.place(x).is_none() && self.across(x, reps) == 1;
        if !in_buffers(a) || !in_buffers(b) {
            return Ok(None);
        }
        let (lower, upper, upper_first) = match (self.one_lane_on(a, b), self.one_lane_on(b, a)) {
            (true, _) => (a, b, false),
            (_, true) => (b, a, true),
            _ => return Ok(None),
        };
        // The window loaded is the upper one, the lower that shifted up a lane; or, where
        // the upper holds a chain's end and the lower does not, the other way round.
        let down = self.window_holds_end(upper, reps) && !self.window_holds_end(lower, reps);
        let (loaded, other) = if down { (lower, upper) } else { (upper, lower) };
        let v = VectorValue::load(self, frame.vals, loaded, t, reps, lanes)?;
        // The lane the shift brings in: the loaded window's lane beside these (in the
        // group's vector before or after), or, past the group's end, the other's, alone.
        let end = lanes.offset + lanes.width;
        let beside = reps.vectors.iter().find(|w| match down {
            true => w.offset == end,
            false => w.offset + w.width == lanes.offset,
        });
        let (window, from, k) = match beside {
            Some(&w) => (loaded, w, if down { 0 } else { w.width - 1 }),
            None => {
                let offset = if down { end - 1 } else { lanes.offset };
                (other, Vector { offset, width: 1 }, 0)
            }
        };
        let x = VectorValue::load(self, frame.vals, window, t, reps, from)?;
        let x = self.lane_of(x, k)?;
        let shifted = self.shifted(v, Some(x), down)?;
        let (low, high) = if down { (v, shifted) } else { (shifted, v) };
        Ok(Some(match upper_first {
            true => vec![high, low],
            false => vec![low, high],
        }))
    }

    /// Whether `upper`'s addresses are `lower`'s one lane on.
    fn one_lane_on(&self, lower: Affine, upper: Affine) -> bool {
        let lower = self.plan.buffers.affine(lower);
        self.plan.buffers.affine(upper)
            == Affine {
                base: lower.base + 1,
                ..lower
            }
    }

    /// `v`'s lanes moved one lane up (its last one dropped, `x` in lane 0), or down (its
    /// first one dropped, `x` in the last lane); without `x`, that lane undefined.
    fn shifted(
        &self,
        v: VectorValue<'ctx>,
        x: Option<FloatValue<'ctx>>,
        down: bool,
    ) -> Emit<VectorValue<'ctx>> {
        let i32t = self.context.i32_type();
        let width = v.get_type().get_size();
        let into = if down { width - 1 } else { 0 };
        let mask: Vec<_> = (0..width)
            .map(|k| match (k == into, down) {
                (true, _) => i32t.get_undef(),
                (false, true) => i32t.const_int(k as u64 + 1, false),
                (false, false) => i32t.const_int(k as u64 - 1, false),
            })
            .collect();
        let undef = v.get_type().get_undef();
        let shifted =
            self.builder
                .build_shuffle_vector(v, undef, VectorType::const_vector(&mask), "")?;
        match x {
            Some(x) => self.builder.build_insert_element(
                shifted,
                x,
                i32t.const_int(into as u64, false),
                "",
            ),
            None => Ok(shifted),
        }
    }

    /// Lane `k` of `v`.
    fn lane_of(&self, v: VectorValue<'ctx>, k: u32) -> Emit<FloatValue<'ctx>> {
        let k = self.context.i32_type().const_int(k as u64, false);
        Ok(self
            .builder
            .build_extract_element(v, k, "")?
            .into_float_value())
    }

    /// `v` with lane `k` taken from `other`.
    fn with_lane_of(
        &self,
        v: VectorValue<'ctx>,
        other: VectorValue<'ctx>,
        k: u32,
    ) -> Emit<VectorValue<'ctx>> {
        let i32t = self.context.i32_type();
        let width = v.get_type().get_size();
        let keep: Vec<_> = (0..width)
            .map(|j| i32t.const_int(if j == k { width + j } else { j } as u64, false))
            .collect();
        self.builder
            .build_shuffle_vector(v, other, VectorType::const_vector(&keep), "")
    }

    /// Adds `d` into the gradient of `a`'s lane `offset` of the group, alone (`fresh`: as its
    /// first addition, `0 + d`).
    #[allow(clippy::too_many_arguments)]
    fn add_alone(
        &self,
        frame: Frame<'ctx>,
        a: Affine,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        offset: u32,
        d: FloatValue<'ctx>,
        fresh: bool,
    ) -> Emit<()> {
        let alone = Vector { offset, width: 1 };
        let g = VectorValue::load(self, frame.grads, a, t, reps, alone)?;
        let zero = self.context.i32_type().const_zero();
        let d = self
            .builder
            .build_insert_element(g.get_type().get_undef(), d, zero, "")?;
        let sum = match fresh {
            true => self.fresh(&[d])?[0],
            false => self.builder.build_float_add(g, d, "")?,
        };
        VectorValue::store(self, frame.grads, a, t, reps, alone, sum)
    }
}
