//! Where each slot lives in the native buffers.
//!
//! The tape gives every node a slot, but the native code keeps a fused dot's products in
//! registers: their slots are never read or written. Left in place, they space out what is:
//! a layer's sums sit a whole row of products apart, and each copy of a batch spreads its
//! activations over a page per neuron. So the buffers hold the kept slots only, in slot
//! order (a slot's address is the number of kept slots before it): a layer's sums side by
//! side, a copy's activations in a few lines. Params and inputs come first on the tape and
//! are all kept, so they keep their order: params at `0..params_len`, the inputs side by
//! side right after ([`crate::program`] finds them through `Backend::leaf_address` and
//! `params_len`).
//!
//! A layer's weights, once the layout pass made them input-major, are rows of one weight per
//! neuron, which the code loads and stores a vector of eight at a time. Where a row is not
//! a whole number of cache lines, most of those vectors straddle two lines, and each such
//! access costs two. So each row of such a matrix starts on a line, the rest of its last
//! line a gap of zeros no code reads ([`Buffers::with_lined_rows`]; the buffers themselves
//! start on a line, `crate::aligned`).
//!
//! And a nest's values lie item by item: the tape has a repetition's nodes together (a
//! neuron's input terms, its sum, its activation, then the next neuron's), so lanes across
//! the repetitions would gather and scatter each item's values, and a readout over a layer's
//! activations would read them a neuron apart. The buffers put each item's value in every
//! repetition side by side instead (within the addresses the nest's values had), so lanes
//! load and store one vector, and loops over a nest's outputs read adjacent numbers. A
//! chain's end elements (a spring tied to a wall, the last mass), which differ from the
//! inner ones the nest holds, join its run as one more repetition where their slots continue
//! it: the next step reads the whole chain as one vector. Only addresses move: slots, the
//! order of operations and so every result stay as they are.
//!
//! Loops address memory by affine sequences of slots; the emitter maps each to addresses
//! ([`Buffers::affine`]) and asks the addresses, not the slots, whether lanes are adjacent.
//! That is exact only where the sequence stays affine once mapped (as it does wherever a
//! loop's repetitions are alike: each holds as many kept slots); a run whose layout breaks
//! one falls back (its end elements to where they were, then the run itself), and where
//! even slot order breaks one, every slot keeps its own address.

use std::num::NonZeroU32;
use std::ops::Range;

use super::lanes::may_run_in_lanes;
use super::{CopiesRunAlike, PerSlot};
use crate::aligned::AlignedBuf;
use crate::passes::schedule::{every_repetition, AccessKind, Affine, Item};
use crate::tape::{Slot, Tape};

/// Per slot: whether the buffers hold it. Every slot is but the products of fused dots, which
/// the code keeps in registers.
pub fn kept(tape: &Tape, items: &[Item], copies: Option<&CopiesRunAlike>) -> PerSlot<bool> {
    let mut kept = PerSlot::new(tape.len(), copies, true);
    for item in CopiesRunAlike::first_two(copies, items) {
        let _ = item.try_for_each_flat(&mut |flat, js| {
            if let Item::Dot(d) = flat {
                for s in d.products.out.slots_in(js, d.products.len) {
                    kept.set(s.index(), false);
                }
                // A chained sum's links but the last (its slot) live in registers too.
                if let Some(links) = d.sum.links {
                    for s in links.slots_in(js, d.sum.tail_len - 1) {
                        kept.set(s.index(), false);
                    }
                }
            }
            Ok::<(), ()>(())
        });
    }
    kept
}

/// The address of each slot in the values and gradients buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffers {
    /// Per slot: its address (a slot the buffers do not hold: the next held one's).
    address: PerSlot<u32>,
    /// Per slot: whether the buffers hold it.
    held: PerSlot<bool>,
    /// How many slots they hold.
    len: u32,
    /// Whether every slot is at its own address (known when laid out, asked on every
    /// `Program::values`).
    in_place: bool,
    /// The addresses of a chain's end elements laid out as one more repetition of a run
    /// (`RunLayout::WithBoundaries`), sorted: where a run's lanes do not start or end.
    ends: Vec<u32>,
}

impl Buffers {
    /// Kept slots side by side, each nest's values item by item, if every loop's addresses
    /// stay affine; else kept slots in slot order, if that keeps them affine; else every
    /// slot at its own.
    pub fn new(
        tape: &Tape,
        kept: &PerSlot<bool>,
        items: &[Item],
        copies: Option<&CopiesRunAlike>,
    ) -> Buffers {
        let slot_by_slot = || Buffers::slot_by_slot(tape.len(), copies);
        let Some(compact) = Buffers::compact(kept, copies) else {
            return slot_by_slot();
        };
        let leaves = tape.num_params() + tape.num_inputs();
        let leaves_in_place = (0..leaves).all(|s| compact.address.get(s) as usize == s);
        if !leaves_in_place {
            return slot_by_slot();
        }
        (compact.with_lined_rows(tape, items))
            .and_then(|lined| lined.laid_out(kept, items, leaves, copies))
            .or_else(|| compact.laid_out(kept, items, leaves, copies))
            .unwrap_or_else(slot_by_slot)
    }

    /// The kept slots side by side in slot order (a slot's address: how many kept slots come
    /// before it); `None` if copies 0 and 1 keep differently many.
    fn compact(kept: &PerSlot<bool>, copies: Option<&CopiesRunAlike>) -> Option<Buffers> {
        let mut address = PerSlot::new(kept.len(), copies, 0u32);
        let ruled = kept.ruled_slots();
        // Where copies 1 and 2 start, in the buffers.
        let (mut copy1, mut copy2) = (0, 0);
        let mut n = 0u32;
        for s in kept.stored_slots() {
            if s == ruled.end && !ruled.is_empty() {
                n += (copy2 - copy1) * (copies?.count() - 2);
            }
            address.set(s, n);
            n += kept.get(s) as u32;
            if let Some(c) = copies {
                if s + 1 == c.copy(1).start as usize {
                    copy1 = n;
                } else if s + 1 == c.copy(2).start as usize {
                    copy2 = n;
                    if copy2 - copy1 != copy1 - address.get(c.copy(0).start as usize) {
                        return None;
                    }
                }
            }
        }
        if !ruled.is_empty() && ruled.end == kept.len() {
            n += (copy2 - copy1) * (copies?.count() - 2);
        }
        Some(Buffers {
            in_place: n as usize == kept.len(),
            address,
            held: kept.clone(),
            len: n,
            ends: Vec::new(),
        })
    }

    /// These buffers with each nest's values item by item, each with its boundary elements
    /// where it has them, as far as that keeps every loop affine: a run whose layout breaks
    /// a loop falls back (its boundary elements stay where they were, then so does the run),
    /// until none does. `None` if not even slot order keeps every loop affine.
    fn laid_out(
        mut self,
        kept: &PerSlot<bool>,
        items: &[Item],
        leaves: usize,
        copies: Option<&CopiesRunAlike>,
    ) -> Option<Buffers> {
        let runs = NestRun::all(items, copies);
        let in_runs = self.in_runs(&runs, copies);
        let mut layouts = vec![RunLayout::WithBoundaries; runs.len()];
        // Slots whose addresses the last fallback changed: only loops reaching them can
        // have changed (all, the first time).
        let mut changed = 0..self.address.len();
        loop {
            let (mut moves, ends) = self.item_by_item(&runs, &in_runs, &layouts, leaves, copies);
            // (Moved in place, each move keeping the address it replaced, and back if a loop
            // breaks: an address per slot is millions of them for a batch of copies.)
            let mut in_place = self.in_place;
            for m in &mut moves.moves {
                let new = m.address;
                m.address = self.address.get(m.slot as usize);
                self.address.set(m.slot as usize, new);
                in_place &= m.address == new;
            }
            let broken = self.unaffine_accesses(kept, items, changed, copies);
            if broken.is_empty() {
                self.in_place = in_place;
                self.ends = ends;
                return Some(self);
            }
            for m in moves.moves.iter().rev() {
                self.address.set(m.slot as usize, m.address);
            }
            // Per slot, the run that moved it (its index + 1).
            let mut mover: PerSlot<Option<NonZeroU32>> =
                PerSlot::new(self.address.len(), copies, None);
            for (r, run) in moves.by_run().enumerate() {
                let r = NonZeroU32::new(r as u32 + 1);
                run.iter().for_each(|m| mover.set(m.slot as usize, r));
            }
            let mut movers = Vec::new();
            for slots in broken {
                let before = movers.len();
                movers.extend(
                    (slots.into_iter())
                        .filter(|&s| s < mover.len())
                        .filter_map(|s| mover.get(s))
                        .map(|r| r.get() - 1),
                );
                if movers.len() == before {
                    // No run moved the slots of this loop: slot order breaks it too.
                    return None;
                }
            }
            movers.sort_unstable();
            movers.dedup();
            for &r in &movers {
                layouts[r as usize] = layouts[r as usize].fallback();
            }
            let fell_back = (moves.by_run().enumerate())
                .filter(|&(r, _)| movers.binary_search(&(r as u32)).is_ok())
                .flat_map(|(_, run)| run.iter().map(|m| m.slot as usize));
            let (first, last) =
                fell_back.fold((usize::MAX, 0), |(lo, hi), s| (lo.min(s), hi.max(s)));
            changed = first.min(last)..last + 1;
        }
    }

    /// Where params end: they (and the gaps [`Buffers::with_lined_rows`] leaves among them)
    /// are at addresses `0..params_len`, the inputs right after.
    pub fn params_len(&self, tape: &Tape) -> usize {
        match tape.num_params() < self.address.len() {
            true => self.address.get(tape.num_params()) as usize,
            false => self.buffer_len(),
        }
    }

    /// These buffers with the rows of the param matrices that nests read across their repetitions
    /// (a layer's weights, input-major: one row per input, a weight per neuron) each starting on a
    /// cache line: a row of `n` weights, `n` not a whole number of vectors, takes the next whole
    /// number of lines (where that adds at most a quarter), the rest a gap of zeros no code reads;
    /// a matrix whose rows are whole lines starts on one. A vector of a row then never straddles
    /// two lines. Measured on `train()` (MNIST 784-50-10: rows of 400 bytes, three in four
    /// straddling), in one process, 9 rounds taking turns, three times: rows of 56 took 2.63-2.68
    /// us per sample, rows of 50 2.79-2.89. Everything after the params moves up by the gaps;
    /// `None` if no address changes.
    fn with_lined_rows(&self, tape: &Tape, items: &[Item]) -> Option<Buffers> {
        let p = tape.num_params();
        let matrices = lane_matrices(p, items);
        if matrices.is_empty() {
            return None;
        }
        let mut address = self.address.clone();
        let mut next = 0u32;
        let mut s = 0;
        let mut matrices = matrices.iter().peekable();
        while s < p {
            match matrices.next_if(|m| m.base == s) {
                Some(m) => {
                    let row = m.lined_row();
                    next = next.next_multiple_of(LINE);
                    for r in 0..m.rows {
                        for c in 0..m.row {
                            address.set(s + r * m.row + c, next + (r * row + c) as u32);
                        }
                    }
                    next += (m.rows * row) as u32;
                    s += m.rows * m.row;
                }
                None => {
                    address.set(s, next);
                    next += 1;
                    s += 1;
                }
            }
        }
        let params_len = next.next_multiple_of(LINE);
        if params_len as usize == p {
            return None;
        }
        let shift = params_len - p as u32;
        address.update_from(p, |a| *a += shift);
        Some(Buffers {
            address,
            held: self.held.clone(),
            len: self.len + shift,
            in_place: false,
            ends: Vec::new(),
        })
    }

    /// Every slot at its own address.
    pub fn slot_by_slot(slots: usize, copies: Option<&CopiesRunAlike>) -> Buffers {
        Buffers {
            address: PerSlot::from_fn(slots, copies, |s| s as u32),
            held: PerSlot::new(slots, copies, true),
            len: slots as u32,
            in_place: true,
            ends: Vec::new(),
        }
    }

    /// The moves that lay out each nest's values item by item as `layouts` says (a
    /// nest's repetitions tile a run of slots, one repetition every `stride` slots: its
    /// values, and any leaf the graph made among them, such as a constant written inline;
    /// the run's kept slots take the run's addresses transposed, each offset's slot in
    /// every repetition side by side, then the next offset's), each with the run that made
    /// it, and the addresses of the boundary elements laid out beside runs (below), sorted.
    /// So what lanes read and write across repetitions is one vector, and a loop
    /// over a nest's outputs (a readout over a layer's activations, a sum over a batch's
    /// losses) reads adjacent numbers, where one repetition after the other puts them
    /// `stride` apart.
    ///
    /// A chain's elements at its ends differ from the inner ones (a spring anchored to a
    /// wall, a last mass with one neighbour), so the nest holds the inner ones only, and
    /// the next step's nest reads the whole chain. Where the slots just before or after the
    /// run are such an element (a repetition's worth that no other run holds, kept where a
    /// repetition's are, no leaf of the tape's), `RunLayout::WithBoundaries` lays it out
    /// as one more repetition, so those reads stay one vector too.
    fn item_by_item(
        &self,
        runs: &[NestRun],
        in_runs: &PerSlot<bool>,
        layouts: &[RunLayout],
        leaves: usize,
        copies: Option<&CopiesRunAlike>,
    ) -> (Moves, Vec<u32>) {
        let slots = self.address.len();
        // (At most every held slot moves; pages reserved and not reached cost nothing.)
        let mut moves = Moves {
            moves: Vec::with_capacity(self.len as usize),
            run_ends: Vec::with_capacity(runs.len()),
        };
        // Boundary elements moved so far (the slots of runs are `in_runs`): zeros but where
        // a chain has them.
        let mut boundaries = PerSlot::new(slots, copies, false);
        let mut ends = Vec::new();
        for (r, NestRun { run, count, outer }) in runs.iter().enumerate() {
            if layouts[r] == RunLayout::InPlace {
                moves.run_ends.push(moves.moves.len());
                continue;
            }
            let (stride, count) = (run.stride as i64, *count as i64);
            let joins = |rep: i64| {
                layouts[r] == RunLayout::WithBoundaries
                    && every_repetition(outer, |js| {
                        let Some(first) = run.first(js) else {
                            return false;
                        };
                        let start = first as i64 + rep * stride;
                        start >= leaves as i64
                            && start + stride <= slots as i64
                            && (0..stride as usize).all(|o| {
                                let s = start as usize + o;
                                !in_runs.get(s)
                                    && !boundaries.get(s)
                                    && self.held.get(s) == self.held.get(first + o)
                            })
                    })
            };
            let reps = -(joins(-1) as i64)..count + joins(count) as i64;
            every_repetition(outer, |js| {
                let Some(first) = run.first(js) else {
                    return true;
                };
                let moved: Vec<usize> = (0..stride)
                    .flat_map(|offset| {
                        reps.clone()
                            .map(move |rep| (first as i64 + rep * stride + offset) as usize)
                    })
                    .filter(|&s| s < slots && self.held.get(s))
                    .collect();
                // The run's addresses, in order: in slot order they are already (the held
                // slots after the params take increasing addresses).
                let lo = (first as i64 + reps.start * stride) as usize;
                let hi = (first as i64 + reps.end * stride) as usize;
                let mut addresses: Vec<u32> = (lo..hi.min(slots))
                    .filter(|&s| self.held.get(s))
                    .map(|s| self.address.get(s))
                    .collect();
                if addresses.windows(2).any(|w| w[0] > w[1]) {
                    addresses.sort_unstable();
                }
                // (The repetitions past either end hold the boundary elements.)
                let inner = first as i64..first as i64 + count * stride;
                for (&s, a) in moved.iter().zip(addresses) {
                    if !inner.contains(&(s as i64)) {
                        boundaries.set(s, true);
                        ends.push(a);
                    }
                    moves.moves.push(Move {
                        slot: s as u32,
                        address: a,
                    });
                }
                true
            });
            moves.run_ends.push(moves.moves.len());
        }
        ends.sort_unstable();
        (moves, ends)
    }

    /// The buffers' length: how many slots they hold.
    pub fn buffer_len(&self) -> usize {
        self.len as usize
    }

    /// The address of slot `s` (of a kept slot; an unkept one gets the next kept one's).
    pub fn address(&self, s: Slot) -> usize {
        self.address.get(s.index()) as usize
    }

    /// Whether `address` holds a chain's end element laid out beside a run's repetitions:
    /// the run's vectors of lanes start after it, or end before it.
    pub fn is_end(&self, address: i64) -> bool {
        u32::try_from(address).is_ok_and(|a| self.ends.binary_search(&a).is_ok())
    }

    /// Whether every slot is at its own address.
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// Fresh laid-out values ([`Tape::for_each_initial_value`], 0 elsewhere), with
    /// only those numbers written: a batch of copies has millions of slots, and a page the
    /// compile does not touch costs nothing until the program runs.
    pub fn initial_values(&self, tape: &Tape) -> AlignedBuf {
        let mut out = AlignedBuf::zeros(self.buffer_len());
        tape.for_each_initial_value(|s, x| {
            if self.holds(s.index()) {
                out[self.address(s)] = x;
            }
        });
        out
    }

    /// A laid-out buffer in slot order, into `out` (0 for the slots it does not hold).
    pub fn in_slot_order(&self, laid_out: &[f64], out: &mut Vec<f64>) {
        out.clear();
        let slots = self.address.len();
        out.extend((0..slots).map(|s| match self.holds(s) {
            true => laid_out[self.address.get(s) as usize],
            false => 0.0,
        }));
    }

    /// Whether the buffers hold slot `s`.
    fn holds(&self, s: usize) -> bool {
        self.held.get(s)
    }

    /// Per address, whether `which` holds of its slot, among the first `slots`: asked of the
    /// held slots whose data are stored only (no per-slot array in between; a batch's copies
    /// `2..` answer as copy 1 does, [`PerSlot`]).
    fn per_address(&self, slots: usize, which: impl Fn(usize) -> bool) -> Vec<bool> {
        let mut out = vec![false; self.buffer_len()];
        for s in (self.held.stored_slots().take_while(|&s| s < slots))
            .filter(|&s| self.holds(s) && which(s))
        {
            let later = self.held.in_later_copies(s).take_while(|&s| s < slots);
            for s in std::iter::once(s).chain(later) {
                out[self.address.get(s) as usize] = true;
            }
        }
        out
    }

    /// Per address, whether `which` holds of its slot (among the first `slots`), with every
    /// gap among the params set where the addresses on both sides of it are: a gap holds a
    /// 0 that no code reads, so zeroing or updating it with its neighbours changes nothing
    /// and keeps their run whole (one loop or `memset` over a lined matrix, not one per row).
    pub fn compact_bridged(
        &self,
        tape: &Tape,
        slots: usize,
        which: impl Fn(usize) -> bool,
    ) -> Vec<bool> {
        let mut out = self.per_address(slots, which);
        let end = self.params_len(tape).min(out.len());
        let mut held = vec![false; end];
        for s in 0..tape.num_params() {
            held[self.address.get(s) as usize] = true;
        }
        let mut a = 0;
        while a < end {
            if held[a] {
                a += 1;
                continue;
            }
            let start = a;
            while a < end && !held[a] {
                a += 1;
            }
            let bridged = start > 0 && a < out.len() && out[start - 1] && out[a];
            out[start..a].fill(bridged);
        }
        out
    }

    /// The addresses of the slots of `a` (`a` at iteration `t`, repetitions `js`, is at
    /// `affine(a)` there). Exact for the sequences of kept slots that loops read and write
    /// ([`Buffers::new`] checked them all) and, since they lie side by side, any run of
    /// inputs. (Not a run of params across a lined matrix's rows: code that walks params
    /// as such walks addresses, [`Buffers::params_len`].)
    pub fn affine(&self, a: Affine) -> Affine {
        let at = |s: i64| -> i64 {
            usize::try_from(s)
                .ok()
                .filter(|&s| s < self.address.len())
                .map_or(s, |s| self.address.get(s) as i64)
        };
        let base = at(a.base);
        let mut out = a;
        out.base = base;
        if a.stride != 0 {
            out.stride = at(a.base + a.stride) - base;
        }
        for (o, &step) in out.outer.iter_mut().zip(&a.outer) {
            if step != 0 {
                *o = at(a.base + step) - base;
            }
        }
        out
    }

    /// Per slot, whether one of `runs` holds it (`in_runs` of [`Buffers::item_by_item`]).
    fn in_runs(&self, runs: &[NestRun], copies: Option<&CopiesRunAlike>) -> PerSlot<bool> {
        let slots = self.address.len();
        let mut in_runs = PerSlot::new(slots, copies, false);
        for NestRun { run, count, outer } in runs {
            every_repetition(outer, |js| {
                if let Some(first) = run.first(js) {
                    let end = (first + *count as usize * run.stride).min(slots);
                    in_runs.fill(first..end, true);
                }
                true
            });
        }
        in_runs
    }

    /// Per sequence of kept slots a loop reads or writes that is not affine in addresses,
    /// its slots (in the first repetition where it is not, with those its strides are
    /// measured from); empty if every one is. Only sequences with a slot within `changed`.
    fn unaffine_accesses(
        &self,
        kept: &PerSlot<bool>,
        items: &[Item],
        changed: Range<usize>,
        copies: Option<&CopiesRunAlike>,
    ) -> Vec<Vec<usize>> {
        let mut found = Vec::new();
        for item in items {
            let around = CopiesRunAlike::around(copies, item);
            for (access, counts) in item.nested_accesses() {
                let (lo, hi) = access.at.bounds(access.len, &counts);
                if hi < changed.start as i64 || lo >= changed.end as i64 {
                    continue;
                }
                let (a, mapped) = (access.at, self.affine(access.at));
                // Slots and addresses computed per repetition, then moved by their strides;
                // (a level the slots do not move along has the same ones in every repetition.)
                every_repetition(&CopiesRunAlike::counts(around, a, &counts), |js| {
                    let (s0, m0) = (
                        a.at_levels(0, js).0 as i64,
                        mapped.at_levels(0, js).0 as i64,
                    );
                    let affine = (0..access.len as i64).all(|t| {
                        let s = (s0 + a.stride * t) as usize;
                        kept.get(s) && self.address.get(s) as i64 == m0 + mapped.stride * t
                    });
                    if affine {
                        return true;
                    }
                    let slots = (0..access.len as i64).map(|t| (s0 + a.stride * t) as usize);
                    let measured = [a.base, a.base + a.stride]
                        .into_iter()
                        .chain(a.outer.iter().map(|o| a.base + o));
                    found.push(slots.chain(measured.map(|s| s as usize)).collect());
                    false
                });
            }
        }
        found
    }
}

/// Calls `f` on every nest of `item` whose body holds no nest, with the repetition counts of
/// the nests around it (outermost first).
fn for_each_flat_nest(
    item: &Item,
    outer: &[u32],
    f: &mut impl FnMut(&crate::passes::schedule::Nest, &[u32]),
) {
    let Item::Nest(nest) = item else { return };
    if nest.body.iter().any(|b| matches!(b, Item::Nest(_))) {
        let outer: Vec<u32> = outer.iter().copied().chain([nest.count]).collect();
        for b in &nest.body {
            for_each_flat_nest(b, &outer, f);
        }
    } else {
        f(nest, outer);
    }
}

/// A flat nest's run, with its repetition count and the repetition counts of the nests
/// around it (outermost first).
struct NestRun {
    run: Run,
    count: u32,
    outer: Vec<u32>,
}

impl NestRun {
    /// The runs of the flat nests of `items` whose repetitions may run in lanes. A nest whose
    /// repetitions depend on each other (a rollout's steps) runs one after the other: its
    /// values stay together. (In a batch's copies, the nests around a run count the first two
    /// copies only: the others are laid out as they are.)
    fn all(items: &[Item], copies: Option<&CopiesRunAlike>) -> Vec<NestRun> {
        let mut runs = Vec::new();
        for item in items {
            let around = CopiesRunAlike::around(copies, item);
            for_each_flat_nest(item, &[], &mut |nest, outer| {
                if let Some(run) =
                    Run::of(nest, outer.len()).filter(|_| may_run_in_lanes(nest, outer))
                {
                    runs.push(NestRun {
                        run,
                        count: nest.count,
                        outer: CopiesRunAlike::outer_counts(around, outer),
                    });
                }
            });
        }
        runs
    }
}

/// The slots [`Buffers::item_by_item`] moves, run by run.
struct Moves {
    moves: Vec<Move>,
    /// Per run: where its moves end.
    run_ends: Vec<usize>,
}

/// A slot moved to `address` (once moved, the address it had).
struct Move {
    slot: u32,
    address: u32,
}

impl Moves {
    /// Each run's moves, in run order.
    fn by_run(&self) -> impl Iterator<Item = &[Move]> {
        let starts = std::iter::once(0).chain(self.run_ends.iter().copied());
        starts.zip(&self.run_ends).map(|(a, &b)| &self.moves[a..b])
    }
}

/// How [`Buffers::item_by_item`] lays out a run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RunLayout {
    /// Item by item, with the boundary elements next to it.
    WithBoundaries,
    /// Item by item.
    Alone,
    /// Where it was.
    InPlace,
}

impl RunLayout {
    /// The layout to try where this one breaks a loop.
    fn fallback(self) -> RunLayout {
        match self {
            RunLayout::WithBoundaries => RunLayout::Alone,
            _ => RunLayout::InPlace,
        }
    }
}

/// The run of slots a flat nest's repetitions tile: what it writes, each repetition
/// `stride` slots after the one before, and any leaf the graph made among them (a constant
/// created inline, read by its own repetition, can come before that repetition's values).
struct Run {
    writes: Vec<crate::passes::schedule::Access>,
    /// Reads that move with the repetitions, as the run's own leaves do.
    moving_reads: Vec<crate::passes::schedule::Access>,
    level: usize,
    stride: usize,
}

impl Run {
    /// The run of `nest`, whose repetitions are at `level`; `None` if its values do not all
    /// move by one stride per repetition.
    fn of(nest: &crate::passes::schedule::Nest, level: usize) -> Option<Run> {
        let (writes, reads): (Vec<_>, Vec<_>) = nest
            .body
            .iter()
            .flat_map(Item::accesses)
            .partition(|a| matches!(a.kind, AccessKind::Writes { .. }));
        let stride = writes.first()?.at.outer[level];
        let alike = writes.iter().all(|a| a.at.outer[level] == stride);
        let moving_reads = reads
            .into_iter()
            .filter(|a| a.at.outer[level] == stride)
            .collect();
        (alike && stride > 0 && nest.count > 1).then_some(Run {
            writes,
            moving_reads,
            level,
            stride: stride as usize,
        })
    }

    /// The first slot of the run in repetition `outer` of the nests around, if the first
    /// repetition's values lie within `stride` slots of it: the first value's, or that of
    /// a slot the repetition reads before it, if that slot lies within `stride` of the last
    /// value (a leaf of the repetition's own).
    fn first(&self, outer: &[u32]) -> Option<usize> {
        let mut js = outer.to_vec();
        js.resize(self.level + 1, 0);
        let lo = slots_at(&self.writes, &js).min()?;
        let hi = slots_at(&self.writes, &js).max()?;
        let leaf = slots_at(&self.moving_reads, &js)
            .filter(|&s| s < lo && s + self.stride > hi)
            .min();
        (hi < lo + self.stride).then_some(leaf.unwrap_or(lo))
    }
}

/// The slots of `accesses` in repetition `js`.
fn slots_at<'a>(
    accesses: &'a [crate::passes::schedule::Access],
    js: &'a [u32],
) -> impl Iterator<Item = usize> + 'a {
    accesses
        .iter()
        .flat_map(move |a| (0..a.len).map(move |t| a.at.at_levels(t, js).index()))
}

/// Numbers per cache line.
const LINE: u32 = 8;

/// A param matrix a nest reads across its repetitions: `rows` rows of `row` params from
/// slot `base`, one repetition's param after the other's.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LaneMatrix {
    base: usize,
    rows: usize,
    row: usize,
}

impl LaneMatrix {
    /// The row's length once lined: whole lines where that wastes at most a quarter of it.
    fn lined_row(&self) -> usize {
        let whole = self.row.next_multiple_of(LINE as usize);
        if self.row >= LINE as usize && whole * 4 <= self.row * 5 {
            whole
        } else {
            self.row
        }
    }
}

/// The param matrices (of the first `params` slots) that `items`' top-level nests (a
/// layer's neurons) read across their repetitions, rows of at least a line, by base, none
/// overlapping another. Not inside other nests: in a layer applied to copies, lanes may run
/// across the copies, where a weight is one number for all of them, and longer rows only
/// spread the matrix (minibatch MNIST as 8 and 32 copies ran 3% slower lined).
fn lane_matrices(params: usize, items: &[Item]) -> Vec<LaneMatrix> {
    let mut found: Vec<LaneMatrix> = Vec::new();
    for item in items {
        for (access, counts) in item.nested_accesses() {
            let &[row] = &counts[..] else {
                continue;
            };
            let (a, row, rows) = (access.at, row as usize, access.len as usize);
            let end = a.base + (rows * row) as i64;
            let across = a.outer[0] == 1 && a.stride == row as i64;
            if across && rows > 1 && a.base >= 0 && end <= params as i64 {
                found.push(LaneMatrix {
                    base: a.base as usize,
                    rows,
                    row,
                });
            }
        }
    }
    found.sort_by_key(|m| m.base);
    found.dedup();
    let mut out: Vec<LaneMatrix> = Vec::new();
    for m in found {
        let free = out
            .last()
            .map_or(true, |l| l.base + l.rows * l.row <= m.base);
        if free && m.row >= LINE as usize {
            out.push(m);
        }
    }
    out
}
