//! A chain's link in lanes: `x[s] - x[s - 1]` reads, and adds into, two windows of one
//! array one lane apart. Backward adds operand by operand (the later operand first:
//! `MapLoop::operands_from_last`), each window a load, an add and a store per vector; the
//! second window's loads then straddle the first's stores, which a core cannot forward, and
//! wait for them to reach the cache (a third of the spring chain's backward). Forward reads
//! a window right after the nest before stored the other (a mass's `t[i + 1] - t[i]` of
//! its springs' tensions), with the same wait. So both windows' additions are made in
//! registers, each slot receiving exactly the additions it did, in the same order; and the
//! lower window is read as the upper one shifted by a lane, plus the one number before it.

use inkwell::types::VectorType;
use inkwell::values::{FloatValue, IntValue, VectorValue};

use super::lanes::{LaneIo, Reps, Vector};
use super::{Emit, Emitter, Frame};
use crate::passes::lanes::backward_operands;
use crate::passes::loops::{Affine, MapLoop};
use crate::plan::memory::Addition;

impl<'ctx> Emitter<'ctx, '_> {
    /// Adds `map`'s local gradients `locals[vector][operand]` into its two operands if they
    /// are neighbours: the operand added into second lies one lane after the first, both in
    /// the buffers as vectors (no local, no fused update; the second's additions not the
    /// first into their slots, as the first operand's come before them). Whether it did.
    ///
    /// Slot `A + k` (`A` the first operand's first lane, `k < n` for `n` lanes) holds
    /// `(g + d1[k]) + d2[k - 1]` afterwards, `A + n` holds `g + d2[n - 1]`, `A` holds `g +
    /// d1[0]`: the first window loaded and added into (or `0 + d1` where the plan says the
    /// first operand's additions are its slots' first, [`crate::plan::GradMemory`]), the
    /// second's terms shifted by one lane and added (but into lane 0), stored; the one slot
    /// past the window alone.
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
                && !self.fuses_update(frame, a)
                && self.across(a, reps) == 1
        };
        let whole = |k: usize| self.plan.grads.stores_whole(Addition::map_arg(map, k));
        if !self.one_lane_on(first, second) || !in_buffers(i) || !in_buffers(j) || whole(j) {
            return Ok(false);
        }
        if self.window_holds_end(first, reps) && !self.window_holds_end(second, reps) {
            self.accumulate_into_upper(frame, (i, first), (j, second), whole(i), t, reps, locals)?;
            return Ok(true);
        }
        let i32t = self.context.i32_type();
        let lane = |k: u32| i32t.const_int(k as u64, false);
        let mut carried = None;
        for (&lanes, local) in reps.vectors.iter().zip(locals) {
            let (d1, d2) = (local[i], local[j]);
            let once = match whole(i) {
                // Each lane's first addition: what the zeroed buffer would hold after it.
                true => self.fresh(&[d1])?[0],
                false => {
                    let g = VectorValue::load(self, frame.grads, first, t, reps, lanes)?;
                    self.builder.build_float_add(g, d1, "")?
                }
            };
            // d2 one lane on: lane 0 from the vector before (none before the first).
            let shifted = self.shifted_up(d2, carried)?;
            let all = self.builder.build_float_add(once, shifted, "")?;
            let twice = match carried {
                Some(_) => all,
                None => {
                    // Lane 0 (slot A) takes no second addition.
                    let keep: Vec<_> = (0..lanes.width)
                        .map(|k| lane(if k == 0 { 0 } else { lanes.width + k }))
                        .collect();
                    self.builder.build_shuffle_vector(
                        once,
                        all,
                        VectorType::const_vector(&keep),
                        "",
                    )?
                }
            };
            VectorValue::store(self, frame.grads, first, t, reps, lanes, twice)?;
            carried = Some(
                self.builder
                    .build_extract_element(d2, lane(lanes.width - 1), "")?
                    .into_float_value(),
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

    /// [`Emitter::accumulate_neighbours`] with its vectors on the second operand's lanes
    /// (where the first's hold an end element, [`Emitter::window_holds_end`]): slot `A + 1 + k` holds `(g +
    /// d1[k + 1]) + d2[k]` (no `d1` term in the last lane, past the first window), slot `A`
    /// `g + d1[0]`, alone. The first operand's terms come first, as before; `whole_first`
    /// starts them from 0 where the plan says they are their slots' first.
    #[allow(clippy::too_many_arguments)]
    fn accumulate_into_upper(
        &self,
        frame: Frame<'ctx>,
        (i, first): (usize, Affine),
        (j, second): (usize, Affine),
        whole_first: bool,
        t: IntValue<'ctx>,
        reps: &Reps<'ctx>,
        locals: &[Vec<VectorValue<'ctx>>],
    ) -> Emit<()> {
        let i32t = self.context.i32_type();
        let lane = |k: u32| i32t.const_int(k as u64, false);
        let lane_0 = |v: VectorValue<'ctx>| -> Emit<FloatValue<'ctx>> {
            Ok(self
                .builder
                .build_extract_element(v, lane(0), "")?
                .into_float_value())
        };
        for (k, (&lanes, local)) in reps.vectors.iter().zip(locals).enumerate() {
            let next = match locals.get(k + 1) {
                Some(next) => Some(lane_0(next[i])?),
                None => None,
            };
            // d1 one lane down: the last lane from the next vector (none after the last).
            let down = self.shifted_down(local[i], next)?;
            let g = VectorValue::load(self, frame.grads, second, t, reps, lanes)?;
            let once = match whole_first {
                true => self.fresh(&[down])?[0],
                false => self.builder.build_float_add(g, down, "")?,
            };
            let once = match next {
                Some(_) => once,
                None => {
                    // The last slot, past the first window, takes no first addition.
                    let keep: Vec<_> = (0..lanes.width)
                        .map(|k| {
                            lane(if k + 1 == lanes.width {
                                lanes.width + k
                            } else {
                                k
                            })
                        })
                        .collect();
                    let keep = VectorType::const_vector(&keep);
                    self.builder.build_shuffle_vector(once, g, keep, "")?
                }
            };
            let all = self.builder.build_float_add(once, local[j], "")?;
            VectorValue::store(self, frame.grads, second, t, reps, lanes, all)?;
        }
        // Slot A, the end element: the first operand's first lane.
        let (Some(&head), Some(local)) = (reps.vectors.first(), locals.first()) else {
            return Ok(());
        };
        let alone = Vector {
            offset: head.offset,
            width: 1,
        };
        let g = VectorValue::load(self, frame.grads, first, t, reps, alone)?;
        let d = self.builder.build_insert_element(
            g.get_type().get_undef(),
            lane_0(local[i])?,
            lane(0),
            "",
        )?;
        let sum = match whole_first {
            true => self.fresh(&[d])?[0],
            false => self.builder.build_float_add(g, d, "")?,
        };
        VectorValue::store(self, frame.grads, first, t, reps, alone, sum)
    }

    /// The two operands of `map` for `lanes`, if they lie one lane apart in the buffers (no
    /// local value): the upper window loaded, the lower one that shifted by one lane, its
    /// first lane the upper's lane before (in the group's vector before; before the group,
    /// loaded alone).
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
        let i32t = self.context.i32_type();
        let lane = |k: u32| i32t.const_int(k as u64, false);
        if self.window_holds_end(upper, reps) && !self.window_holds_end(lower, reps) {
            // The lower window loaded instead, the upper one that shifted down by a lane,
            // its last lane the lower's lane after (in the group's vector after; after the
            // group, loaded alone).
            let low = VectorValue::load(self, frame.vals, lower, t, reps, lanes)?;
            let end = lanes.offset + lanes.width;
            let last = match reps.vectors.iter().find(|v| v.offset == end) {
                Some(&v) => {
                    let next = VectorValue::load(self, frame.vals, lower, t, reps, v)?;
                    self.builder.build_extract_element(next, lane(0), "")?
                }
                None => {
                    let alone = Vector {
                        offset: end - 1,
                        width: 1,
                    };
                    let x = VectorValue::load(self, frame.vals, upper, t, reps, alone)?;
                    self.builder.build_extract_element(x, lane(0), "")?
                }
            };
            let high = self.shifted_down(low, Some(last.into_float_value()))?;
            return Ok(Some(match upper_first {
                true => vec![high, low],
                false => vec![low, high],
            }));
        }
        let high = VectorValue::load(self, frame.vals, upper, t, reps, lanes)?;
        let before = reps
            .vectors
            .iter()
            .find(|v| v.offset + v.width == lanes.offset);
        let first = match before {
            Some(&v) => {
                let previous = VectorValue::load(self, frame.vals, upper, t, reps, v)?;
                self.builder
                    .build_extract_element(previous, lane(v.width - 1), "")?
            }
            None => {
                let alone = Vector {
                    offset: lanes.offset,
                    width: 1,
                };
                let x = VectorValue::load(self, frame.vals, lower, t, reps, alone)?;
                self.builder.build_extract_element(x, lane(0), "")?
            }
        };
        let low = self.shifted_up(high, Some(first.into_float_value()))?;
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

    /// `v`'s lanes one lane down (its first one dropped), `last` (if any; else undefined)
    /// in the last lane.
    fn shifted_down(
        &self,
        v: VectorValue<'ctx>,
        last: Option<FloatValue<'ctx>>,
    ) -> Emit<VectorValue<'ctx>> {
        let i32t = self.context.i32_type();
        let width = v.get_type().get_size();
        let mask: Vec<_> = (0..width)
            .map(|k| match k + 1 == width {
                true => i32t.get_undef(),
                false => i32t.const_int(k as u64 + 1, false),
            })
            .collect();
        let undef = v.get_type().get_undef();
        let shifted =
            self.builder
                .build_shuffle_vector(v, undef, VectorType::const_vector(&mask), "")?;
        match last {
            Some(x) => self.builder.build_insert_element(
                shifted,
                x,
                i32t.const_int(width as u64 - 1, false),
                "",
            ),
            None => Ok(shifted),
        }
    }

    /// `v`'s lanes one lane up (its last one dropped), `first` (if any; else undefined) in
    /// lane 0.
    fn shifted_up(
        &self,
        v: VectorValue<'ctx>,
        first: Option<FloatValue<'ctx>>,
    ) -> Emit<VectorValue<'ctx>> {
        let i32t = self.context.i32_type();
        let mask: Vec<_> = (0..v.get_type().get_size())
            .map(|k| match k {
                0 => i32t.get_undef(),
                k => i32t.const_int(k as u64 - 1, false),
            })
            .collect();
        let undef = v.get_type().get_undef();
        let shifted =
            self.builder
                .build_shuffle_vector(v, undef, VectorType::const_vector(&mask), "")?;
        match first {
            Some(x) => self
                .builder
                .build_insert_element(shifted, x, i32t.const_zero(), ""),
            None => Ok(shifted),
        }
    }
}
