//! The schedule cut into native functions of bounded size: every LLVM pass then sees
//! functions of bounded size, which keeps compile time linear in the tape, operands
//! included.

use std::ops::Range;

use crate::op::Op;
use crate::passes::schedule::Item;
use crate::tape::{Slot, Tape};

/// What a loop weighs against the chunk size: its body is a few nodes.
pub const LOOP_WEIGHT: usize = 16;

/// At most this many functions go into one LLVM module: code generation then works on a
/// module of bounded size (its memory stays in cache, and is freed before the next module
/// is built), so compile time stays linear however many functions there are.
pub const MODULE_FUNCTIONS: usize = 64;

/// Programs are split into a multiple of this many modules (or one per function, if they
/// have fewer), so that 2 or 4 threads get equal shares of work. Splitting costs nothing
/// measurable: a module of its own costs a context, a pass pipeline, an object and a link,
/// well under a millisecond (micrograd's moons demo compiles in the same time on one
/// thread as one module or four).
pub const MODULE_MULTIPLE: usize = 4;

/// `functions` functions grouped into modules, each a run of consecutive functions, about
/// equally many in each (at most [`MODULE_FUNCTIONS`]). Module 0 also holds the entry points.
/// A pure function of the count: the grouping, and so the code, is the same whatever the
/// number of threads that compile it.
pub fn modules(functions: usize) -> Vec<Range<usize>> {
    let count = functions
        .div_ceil(MODULE_FUNCTIONS)
        .next_multiple_of(MODULE_MULTIPLE)
        .min(functions)
        .max(1);
    (0..count)
        .map(|m| functions * m / count..functions * (m + 1) / count)
        .collect()
}

/// The functions whose forward variant module `m` of `modules` defines: those of the module
/// before it (the last module's, for module 0). Module `m` defines its own functions'
/// backward variants (plain and `step`'s), so a function's forward and backward compile on
/// different threads: a program whose work sits in one function (a batch written as copies
/// is one nest of copies) still keeps two threads busy. With one module, its own.
pub fn forward_functions(modules: &[Range<usize>], m: usize) -> Range<usize> {
    let count = modules.len();
    modules[(m + count - 1) % count].clone()
}

/// Straight-line nodes a module of loop code may hold ([`loop_code`]): a loss, a softmax.
pub const LOOP_CODE_STRAIGHT: usize = 64;

/// Whether `functions` are loop code: at most [`LOOP_CODE_STRAIGHT`] straight-line nodes
/// among them, the rest loops and nests. Such a module is compiled with lanes that touch
/// slots one at a time and without the SLP vectorizer
/// ([`crate::OptLevel::pipeline_without_slp`]); straight-line code needs SLP where it is
/// regular ([`slp_pays`]).
pub fn loop_code<'a>(functions: impl IntoIterator<Item = &'a Vec<Item>>) -> bool {
    let straight: usize = functions
        .into_iter()
        .flatten()
        .map(|item| match item {
            Item::Straight(r) => r.len(),
            Item::SumPart { args, .. } => args.len(),
            _ => 0,
        })
        .sum();
    straight <= LOOP_CODE_STRAIGHT
}

/// SLP pays where at least this share (per mille) of a module's straight-line nodes are
/// [`alike`] the next one ([`slp_pays`]).
pub const MIN_ALIKE_PER_MILLE: usize = 20;

/// Whether the straight-line code among `functions` gives the SLP vectorizer work: not
/// where almost none of its nodes is [`alike`] the next (fewer than [`MIN_ALIKE_PER_MILLE`]),
/// as in a random graph, whose operands are anywhere: there SLP's alias checks took most of
/// the optimization time for nothing (a random DAG of 5,000 nodes, 2-4 alike per mille:
/// 1.3-1.6 s to compile with SLP, 0.83-0.93 without, the same 23-28 us per step). Code
/// written out from loops has far more (MNIST's layers 98%; micrograd's moons, a recurrent
/// cell and a spring chain with loop recovery off 5%, 14% and 9%), and there SLP merges
/// neighbouring slots' loads and stores in backward too (their steps 1.5-2x faster with it).
pub fn slp_pays<'a>(tape: &Tape, functions: impl IntoIterator<Item = &'a Vec<Item>>) -> bool {
    let (mut nodes, mut alike_pairs) = (0, 0);
    for item in functions.into_iter().flatten() {
        if let Item::Straight(range) = item {
            nodes += range.len();
            alike_pairs += (range.start..range.end.saturating_sub(1))
                .filter(|&s| alike(tape, Slot(s), Slot(s + 1)))
                .count();
        }
    }
    alike_pairs * 1000 >= nodes * MIN_ALIKE_PER_MILLE
}

/// Whether node `b` does what node `a` does one slot further: the same op, and each operand
/// the same slot or the next one (what lets SLP compute both in one vector).
fn alike(tape: &Tape, a: Slot, b: Slot) -> bool {
    let (xs, ys) = (tape.args(a), tape.args(b));
    tape.op(a) == tape.op(b)
        && xs.len() == ys.len()
        && xs
            .iter()
            .zip(ys)
            .all(|(x, y)| matches!(y.0.wrapping_sub(x.0), 0 | 1))
}

/// `items` cut into functions of about `chunk_size` weight: straight-line nodes count with
/// their operands, loops count [`LOOP_WEIGHT`] (see [`weight`]). A `sum` heavier than a
/// whole function is cut into [`Item::SumPart`]s that continue one another across
/// functions, its additions kept in order. (Its forward is one chain of dependent
/// additions, which code generation handles in time superlinear in its length; its backward
/// adds one gradient into each operand, which the last part does whole: see
/// `plan::memory`.) A first nest gets a function of its own (`train` swaps it).
pub fn cut(tape: &Tape, items: &[Item], chunk_size: usize) -> Vec<Vec<Item>> {
    let limit = chunk_size.max(1);
    let mut cutter = Cutter {
        limit,
        functions: Vec::new(),
        current: Vec::new(),
        weight: 0,
    };
    for item in items {
        let Item::Straight(range) = item else {
            cutter.push(item.clone(), weight(item));
            let first_nest = cutter.functions.is_empty()
                && cutter.current.len() == 1
                && matches!(item, Item::Nest(_));
            if first_nest {
                cutter.flush();
            }
            continue;
        };
        let mut start = range.start;
        for s in range.clone() {
            let args = tape.args(Slot(s)).len();
            if tape.op(Slot(s)) == Op::Sum && 1 + args > limit {
                if start < s {
                    cutter.current.push(Item::Straight(start..s));
                }
                cutter.push_wide_sum(Slot(s), args as u32);
                start = s + 1;
                continue;
            }
            cutter.weight += 1 + args;
            if cutter.weight >= limit {
                cutter.current.push(Item::Straight(start..s + 1));
                cutter.flush();
                start = s + 1;
            }
        }
        if start < range.end {
            cutter.current.push(Item::Straight(start..range.end));
        }
    }
    cutter.flush();
    cutter.functions
}

/// What a loop item weighs: [`LOOP_WEIGHT`] per loop, a single node (in a nest's body) its
/// operands and itself, as in straight-line code; a nest weighs its body once (at least
/// [`LOOP_WEIGHT`] per loop).
fn weight(item: &Item) -> usize {
    match item {
        Item::Map(m) if m.len == 1 => 1 + m.args.len(),
        Item::Nest(n) => (LOOP_WEIGHT * item.loops()).max(n.body.iter().map(weight).sum()),
        Item::Straight(_) | Item::SumPart { .. } => 0,
        Item::Map(_) | Item::Sum(_) | Item::Dot(_) => LOOP_WEIGHT,
    }
}

struct Cutter {
    limit: usize,
    functions: Vec<Vec<Item>>,
    current: Vec<Item>,
    weight: usize,
}

impl Cutter {
    fn push(&mut self, item: Item, weight: usize) {
        self.current.push(item);
        self.weight += weight;
        if self.weight >= self.limit {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.current.is_empty() {
            self.functions.push(std::mem::take(&mut self.current));
        }
        self.weight = 0;
    }

    /// The `sum` at `slot` with `args` operands, as parts that fill functions up.
    fn push_wide_sum(&mut self, slot: Slot, args: u32) {
        let mut done = 0;
        while done < args {
            let room = self.limit.saturating_sub(self.weight).max(1) as u32;
            let end = args.min(done + room);
            self.push(
                Item::SumPart {
                    slot,
                    args: done..end,
                },
                (end - done) as usize + 1,
            );
            done = end;
        }
    }
}
