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
//! load and store one vector, and loops over a nest's outputs read adjacent numbers. Only
//! addresses move: slots, the order of operations and so every result stay as they are.
//!
//! Loops address memory by affine sequences of slots; the emitter maps each to addresses
//! ([`Buffers::affine`]) and asks the addresses, not the slots, whether lanes are adjacent.
//! That is exact only where the sequence stays affine once mapped (as it does wherever a
//! loop's repetitions are alike: each holds as many kept slots); where one does not, the
//! kept slots stay in slot order, or failing that every slot keeps its own address.

use super::lanes::may_run_in_lanes;
use crate::aligned::AlignedBuf;
use crate::passes::loops::{every_repetition, AccessKind, Affine, Item};
use crate::tape::{Slot, Tape};

/// The address of each slot in the values and gradients buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct Buffers {
    /// Per slot: its address (a slot the buffers do not hold: the next held one's).
    address: Vec<u32>,
    /// Per slot: whether the buffers hold it.
    held: Vec<bool>,
    /// How many slots they hold.
    len: u32,
    /// Whether every slot is at its own address (known when laid out, asked on every
    /// `Program::values`).
    in_place: bool,
}

impl Buffers {
    /// Kept slots side by side, each nest's values item by item, if every loop's addresses
    /// stay affine; else kept slots in slot order, if that keeps them affine; else every
    /// slot at its own.
    pub fn new(tape: &Tape, kept: &[bool], items: &[Item]) -> Buffers {
        let mut address = Vec::with_capacity(kept.len());
        let mut n = 0u32;
        for &k in kept {
            address.push(n);
            n += k as u32;
        }
        let compact = Buffers {
            in_place: n as usize == kept.len(),
            address,
            held: kept.to_vec(),
            len: n,
        };
        let leaves_in_place =
            (0..tape.num_params() + tape.num_inputs()).all(|s| compact.address[s] as usize == s);
        if !leaves_in_place {
            return Buffers::slot_by_slot(tape.len());
        }
        compact
            .with_lined_rows(tape, items)
            .and_then(|lined| lined.laid_out(kept, items))
            .or_else(|| compact.laid_out(kept, items))
            .unwrap_or_else(|| Buffers::slot_by_slot(tape.len()))
    }

    /// These buffers, or these with each nest's values item by item, whichever first keeps
    /// every loop affine.
    fn laid_out(&self, kept: &[bool], items: &[Item]) -> Option<Buffers> {
        if let Some(by_item) = self.item_by_item(items) {
            if by_item.keeps_loops_affine(kept, items) {
                return Some(by_item);
            }
        }
        self.keeps_loops_affine(kept, items).then(|| self.clone())
    }

    /// Where params end: they (and the gaps [`Buffers::with_lined_rows`] leaves among them)
    /// are at addresses `0..params_len`, the inputs right after.
    pub fn params_len(&self, tape: &Tape) -> usize {
        let after = self.address.get(tape.num_params());
        after.map_or(self.buffer_len(), |&a| a as usize)
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
                            address[s + r * m.row + c] = next + (r * row + c) as u32;
                        }
                    }
                    next += (m.rows * row) as u32;
                    s += m.rows * m.row;
                }
                None => {
                    address[s] = next;
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
        for a in &mut address[p..] {
            *a += shift;
        }
        Some(Buffers {
            address,
            held: self.held.clone(),
            len: self.len + shift,
            in_place: false,
        })
    }

    /// Every slot at its own address.
    pub fn slot_by_slot(slots: usize) -> Buffers {
        Buffers {
            address: (0..slots as u32).collect(),
            held: vec![true; slots],
            len: slots as u32,
            in_place: true,
        }
    }

    /// These buffers with each nest's values laid out item by item where its repetitions
    /// may run in lanes: a nest's repetitions tile a run of slots, one repetition every
    /// `stride` slots (its values, and any leaf the graph made among them, such as a
    /// constant written inline); the run's kept slots take the run's addresses transposed,
    /// each offset's slot in every repetition side by side, then the next offset's. So what
    /// lanes read and write across repetitions is one vector, and a loop over a nest's
    /// outputs (a readout over a layer's activations, a sum over a batch's losses) reads
    /// adjacent numbers, where one repetition after the other puts them `stride` apart.
    /// `None` if no address changes.
    fn item_by_item(&self, items: &[Item]) -> Option<Buffers> {
        let mut address = self.address.clone();
        let mut moved = false;
        for item in items {
            for_each_flat_nest(item, &[], &mut |nest, outer| {
                // A nest whose repetitions depend on each other (a rollout's steps) runs
                // one after the other: its values stay together.
                let Some(run) =
                    Run::of(nest, outer.len()).filter(|_| may_run_in_lanes(nest, outer))
                else {
                    return;
                };
                every_repetition(outer, |js| {
                    let Some(first) = run.first(js) else {
                        return true;
                    };
                    let slots: Vec<usize> = (0..run.stride)
                        .flat_map(|offset| {
                            (0..nest.count as usize).map(move |r| first + r * run.stride + offset)
                        })
                        .filter(|&s| self.held.get(s) == Some(&true))
                        .collect();
                    let mut addresses: Vec<u32> = slots.iter().map(|&s| self.address[s]).collect();
                    addresses.sort_unstable();
                    for (&s, a) in slots.iter().zip(addresses) {
                        moved |= address[s] != a;
                        address[s] = a;
                    }
                    true
                });
            });
        }
        moved.then(|| Buffers {
            address,
            held: self.held.clone(),
            len: self.len,
            in_place: false,
        })
    }

    /// The buffers' length: how many slots they hold.
    pub fn buffer_len(&self) -> usize {
        self.len as usize
    }

    /// The address of slot `s` (of a kept slot; an unkept one gets the next kept one's).
    pub fn address(&self, s: Slot) -> usize {
        self.address[s.index()] as usize
    }

    /// Whether every slot is at its own address.
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// A buffer in slot order (one number per slot), laid out.
    pub fn lay_out(&self, in_slot_order: &[f64]) -> AlignedBuf {
        let mut out = AlignedBuf::zeros(self.buffer_len());
        for (s, &x) in in_slot_order.iter().enumerate() {
            if self.holds(s) {
                out[self.address[s] as usize] = x;
            }
        }
        out
    }

    /// A laid-out buffer in slot order, into `out` (0 for the slots it does not hold).
    pub fn in_slot_order(&self, laid_out: &[f64], out: &mut Vec<f64>) {
        out.clear();
        let slots = self.address.len();
        out.extend((0..slots).map(|s| match self.holds(s) {
            true => laid_out[self.address[s] as usize],
            false => 0.0,
        }));
    }

    /// Whether the buffers hold slot `s`.
    fn holds(&self, s: usize) -> bool {
        self.held[s]
    }

    /// Per address, `which` of its slot.
    pub fn compact(&self, which: &[bool]) -> Vec<bool> {
        let mut out = vec![false; self.buffer_len()];
        for (s, &w) in which.iter().enumerate() {
            if w && self.holds(s) {
                out[self.address[s] as usize] = true;
            }
        }
        out
    }

    /// Per address, `which` of its slot ([`Buffers::compact`]), with every gap among the
    /// params set where the addresses on both sides of it are: a gap holds a 0 that no code
    /// reads, so zeroing or updating it with its neighbours changes nothing and keeps their
    /// run whole (one loop or `memset` over a lined matrix, not one per row).
    pub fn compact_bridged(&self, tape: &Tape, which: &[bool]) -> Vec<bool> {
        let mut out = self.compact(which);
        let end = self.params_len(tape).min(out.len());
        let mut held = vec![false; end];
        for &a in &self.address[..tape.num_params()] {
            held[a as usize] = true;
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
                .and_then(|s| self.address.get(s))
                .map_or(s, |&addr| addr as i64)
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

    /// Whether every sequence of kept slots a loop reads or writes is affine in addresses.
    fn keeps_loops_affine(&self, kept: &[bool], items: &[Item]) -> bool {
        items.iter().all(|item| {
            item.nested_accesses().iter().all(|(access, counts)| {
                let (a, mapped) = (access.at, self.affine(access.at));
                // Slots and addresses computed per repetition, then moved by their strides.
                every_repetition(counts, |js| {
                    let (s0, m0) = (
                        a.at_levels(0, js).0 as i64,
                        mapped.at_levels(0, js).0 as i64,
                    );
                    (0..access.len as i64).all(|t| {
                        let s = (s0 + a.stride * t) as usize;
                        kept[s] && self.address[s] as i64 == m0 + mapped.stride * t
                    })
                })
            })
        })
    }
}

/// Calls `f` on every nest of `item` whose body holds no nest, with the repetition counts of
/// the nests around it (outermost first).
fn for_each_flat_nest(
    item: &Item,
    outer: &[u32],
    f: &mut impl FnMut(&crate::passes::loops::Nest, &[u32]),
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

/// The run of slots a flat nest's repetitions tile: what it writes, each repetition
/// `stride` slots after the one before.
struct Run {
    writes: Vec<crate::passes::loops::Access>,
    level: usize,
    stride: usize,
}

impl Run {
    /// The run of `nest`, whose repetitions are at `level`; `None` if its values do not all
    /// move by one stride per repetition.
    fn of(nest: &crate::passes::loops::Nest, level: usize) -> Option<Run> {
        let writes: Vec<_> = nest
            .body
            .iter()
            .flat_map(Item::accesses)
            .filter(|a| matches!(a.kind, AccessKind::Writes { .. }))
            .collect();
        let stride = writes.first()?.at.outer[level];
        let alike = writes.iter().all(|a| a.at.outer[level] == stride);
        (alike && stride > 0 && nest.count > 1).then_some(Run {
            writes,
            level,
            stride: stride as usize,
        })
    }

    /// The first slot of the run in repetition `outer` of the nests around, if the first
    /// repetition's values lie within `stride` slots of it.
    fn first(&self, outer: &[u32]) -> Option<usize> {
        let mut js = outer.to_vec();
        js.resize(self.level + 1, 0);
        let slots = || {
            self.writes
                .iter()
                .flat_map(|a| (0..a.len).map(|t| a.at.at_levels(t, &js).index()))
        };
        let (lo, hi) = (slots().min()?, slots().max()?);
        (hi < lo + self.stride).then_some(lo)
    }
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
