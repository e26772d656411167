//! [`Plan::verify`]: the invariants the emitter relies on.

use crate::error::{Error, Result};
use crate::op::Op;
use crate::passes::schedule::{
    AccessKind, Affine, Item, MapLoop, Schedule, SumLoop, MAX_NEST_DEPTH,
};
use crate::plan::{CopiesRunAlike, Lanes, Nests, Plan};
use crate::tape::{Slot, Tape};

pub(super) fn verify(plan: &Plan, tape: &Tape) -> Result<()> {
    let bad = |slot: u32, what: String| Error::InvalidPlan { slot, what };
    if plan.kept.len() != tape.len() {
        return Err(bad(
            0,
            format!("{} kept flags for {} slots", plan.kept.len(), tape.len()),
        ));
    }
    let items = || plan.functions.iter().flatten();
    check_ids(items(), plan.nests.len()).map_err(|what| bad(0, what))?;
    verify_items(items(), tape, &plan.nests)?;
    for item in plan.functions.iter().flatten() {
        check_memory(plan, tape, item).map_err(|(slot, what)| bad(slot, what))?;
    }
    // The emitter defines each function in the one module whose range holds it, and the
    // entry points (which call function 0's variants defined beside them) in module 0.
    let mut next = 0;
    for (m, range) in plan.modules.iter().enumerate() {
        if range.start != next || (range.is_empty() && !plan.functions.is_empty()) {
            return Err(bad(
                0,
                format!("module {m} holds functions {range:?}, not from {next}"),
            ));
        }
        next = range.end;
    }
    if next != plan.functions.len() || plan.modules.is_empty() {
        return Err(bad(
            0,
            format!(
                "the modules hold {next} of {} functions",
                plan.functions.len()
            ),
        ));
    }
    if let Some(step) = &plan.step {
        for d in &step.deferred {
            let lanes = plan
                .nests
                .holds(d.nest.id)
                .then(|| plan.nest(&d.nest).lanes);
            if !lanes.is_some_and(|l| l.backward().is_some()) {
                return Err(bad(0, "a deferred gradient outside a lane nest".into()));
            }
        }
    }
    super::verify_grads::verify(plan, tape)
}

/// The items are in shapes the emitter lowers and form addresses inside the buffers: what
/// [`Plan::new`] checks of a schedule before its analyses index the tape with them. (That
/// they compute the tape, [`verify_items`], is checked once, of the finished plan: it walks
/// every node.)
pub(super) fn verify_shapes(schedule: &Schedule, tape: &Tape) -> Result<()> {
    let bad = |what| Error::InvalidPlan { slot: 0, what };
    check_ids(&schedule.items, schedule.nests as usize).map_err(bad)?;
    schedule.items.iter().try_for_each(|item| {
        check_shape(item, 0).map_err(bad)?;
        check_bounds(item, tape).map_err(|(slot, what)| Error::InvalidPlan { slot, what })
    })
}

/// Every nest of `items` (at any depth) has its own number below `count`: the plan keeps
/// its decisions under it ([`Nests`]).
fn check_ids<'a>(
    items: impl IntoIterator<Item = &'a Item>,
    count: usize,
) -> std::result::Result<(), String> {
    fn visit(item: &Item, seen: &mut [bool]) -> std::result::Result<(), String> {
        let Item::Nest(n) = item else { return Ok(()) };
        match seen.get_mut(n.id.0 as usize) {
            Some(seen) if !*seen => *seen = true,
            Some(_) => return Err(format!("two nests numbered {}", n.id.0)),
            None => return Err(format!("nest {} of {}", n.id.0, seen.len())),
        }
        n.body.iter().try_for_each(|b| visit(b, seen))
    }
    let mut seen = vec![false; count];
    items
        .into_iter()
        .try_for_each(|item| visit(item, &mut seen))
}

/// The items, in order, compute every non-leaf slot of `tape` once, as the tape says, in
/// shapes the emitter lowers, at addresses inside the buffers, their nests run as the
/// emitter can ([`check_nest_plans`]), in lanes only where the order proofs hold
/// ([`super::lanes::check`]).
fn verify_items<'a>(
    items: impl IntoIterator<Item = &'a Item>,
    tape: &Tape,
    nests: &Nests,
) -> Result<()> {
    let bad = |slot: u32, what: String| Error::InvalidPlan { slot, what };
    // Coverage: every non-leaf slot once, in slot order, as the tape says.
    let mut next = Coverage {
        tape,
        expected: (tape.num_params() + tape.num_inputs()) as u32,
        sum_args: 0,
    };
    for item in items {
        check_shape(item, 0).map_err(|what| bad(next.expected, what))?;
        check_bounds(item, tape).map_err(|(slot, what)| bad(slot, what))?;
        check_nest_plans(item, nests).map_err(|what| bad(next.expected, what))?;
        super::lanes::check(item, &[], nests).map_err(|what| bad(next.expected, what))?;
        let (item, skipped) = match over_copies(item, tape) {
            Some(first_two) => (std::borrow::Cow::Owned(first_two.0), first_two.1),
            None => (std::borrow::Cow::Borrowed(item), 0),
        };
        item.try_for_each_flat(&mut |flat, js| {
            next.cover(flat, js)
                .map_err(|what| bad(next.expected, what))
        })?;
        next.expected += skipped;
    }
    next.advance_to(tape.len() as u32)
        .map_err(|what| bad(next.expected, what))
}

/// A nest whose repetitions are copies of the tape's ([`Tape::copies`],
/// [`CopiesRunAlike::nests_copies`]) as its first two repetitions, and the slots the others
/// cover. Every repetition's slots are the first's moved by the nest's strides, and every
/// copy's nodes and operands the first copy's moved by the copies' strides: both affine in
/// the repetition, so two that match the tape, each writing in the copies, make every one
/// match (the writes move by a copy per repetition and stay in the copies).
fn over_copies(item: &Item, tape: &Tape) -> Option<(Item, u32)> {
    let copies = CopiesRunAlike::of_tape(tape)?;
    let first_two = copies.first_two_of(item)?;
    Some((first_two, copies.past_second().len() as u32))
}

/// The nests of `item` run as the emitter can run them ([`super::NestPlan`]): lanes only in
/// nests whose body holds no nest, in groups of at most the repetitions; shared gradients
/// only of dots of nests of lanes in the body of a nest that runs one repetition after the
/// other; forward's order the body's or a permutation of it; operand orders only for the
/// body's items.
fn check_nest_plans(item: &Item, nests: &Nests) -> std::result::Result<(), String> {
    let Item::Nest(n) = item else { return Ok(()) };
    let plan = nests.of(n);
    let flat = n.body.iter().all(|b| !matches!(b, Item::Nest(_)));
    if plan.lanes != Lanes::None && !flat {
        return Err("lanes in a nest of nests".into());
    }
    if let Some(group) = plan.lanes.forward() {
        if group == 0 || group > n.count {
            return Err(format!("lane group {group} of {} repetitions", n.count));
        }
    }
    for &shared in &plan.shared_grads {
        let inner = shared.dot_in(n).map(|(inner, _)| nests.of(inner).lanes);
        if plan.lanes != Lanes::None || !inner.is_some_and(|l| l.backward().is_some()) {
            return Err(format!(
                "a shared gradient at {shared:?} that is no such dot"
            ));
        }
    }
    let mut order = plan.forward_order.clone();
    order.sort_unstable();
    if !order.is_empty() && !order.iter().copied().eq(0..n.body.len() as u32) {
        return Err(format!(
            "forward order {:?} of {} body items",
            plan.forward_order,
            n.body.len()
        ));
    }
    if plan.operands_from_last.len() > n.body.len() {
        return Err(format!(
            "operand orders for {} of {} body items",
            plan.operands_from_last.len(),
            n.body.len()
        ));
    }
    n.body.iter().try_for_each(|b| check_nest_plans(b, nests))
}

/// Loop bodies hold only what the emitter lowers: nests of at most [`MAX_NEST_DEPTH`]
/// levels whose bodies hold loops and nests.
fn check_shape(item: &Item, depth: usize) -> std::result::Result<(), String> {
    match item {
        Item::Straight(_) | Item::SumPart { .. } if depth > 0 => {
            Err("straight-line code in a nest's body".into())
        }
        Item::Nest(n) => {
            if depth + 1 > MAX_NEST_DEPTH {
                return Err(format!("nests deeper than {MAX_NEST_DEPTH}"));
            }
            if n.count == 0 || n.body.is_empty() {
                return Err("an empty nest".into());
            }
            n.body.iter().try_for_each(|b| check_shape(b, depth + 1))
        }
        Item::Map(m) if m.len == 0 || m.op.is_leaf() || !takes(m.op, m.args.len()) => Err(format!(
            "a map of {} that the emitter cannot lower",
            m.op.name()
        )),
        Item::Sum(s) if s.tail_len == 0 => Err("a sum loop of no operands".into()),
        Item::Dot(d) if d.products.op != Op::Mul || !d.sums_its_products() => {
            Err("a dot that is not a sum of its products".into())
        }
        _ => Ok(()),
    }
}

/// What the emitter reads and writes lies where it looks, one walk over the item's accesses:
/// - every buffer address a loop forms lies inside the buffers: each access, at its
///   addresses ([`Buffers::affine`](super::Buffers::affine)), stays within `0..buffer_len`
///   over all its iterations and repetitions (an access whose slots all live in a function's
///   scratch, in values and gradients alike, forms none; straight-line code addresses kept
///   slots one by one, each inside by construction);
/// - every read or write of a local value or gradient ([`super::local`]) finds it in the
///   function's scratch: a loop access that reaches one is one whose place the locals know
///   (`Locals::place`), and straight-line code touches none. Else the emitter would read a
///   slot the buffers do not keep.
fn check_memory(plan: &Plan, tape: &Tape, item: &Item) -> std::result::Result<(), (u32, String)> {
    let (values, grads) = (&plan.local_values, &plan.grads.local);
    if let Item::Straight(range) = item {
        if values.count() + grads.count() == 0 {
            return Ok(());
        }
        let mut slots = (range.clone().map(Slot)).flat_map(|s| tape.args(s).into_iter().chain([s]));
        return match slots.find(|&s| values.is_local(s) || grads.is_local(s)) {
            Some(s) => Err((s.0, "straight-line code touches a local slot".into())),
            None => Ok(()),
        };
    }
    let len = plan.buffers.buffer_len() as i64;
    for (access, counts) in item.nested_accesses() {
        let (value_place, grad_place) = (values.place(access.at), grads.place(access.at));
        let first = access.at.at(0);
        let grad = matches!(
            access.kind,
            AccessKind::Reads { grad: true } | AccessKind::Writes { grad: true }
        );
        let lost_value = values.is_local(first) && value_place.is_none();
        let lost_grad = grad && grads.is_local(first) && grad_place.is_none();
        if lost_value || lost_grad {
            return Err((
                first.0,
                "a loop reaches a local slot outside its scratch".into(),
            ));
        }
        if value_place.is_some() && grad_place.is_some() {
            continue;
        }
        let (lo, hi) = plan.buffers.affine(access.at).bounds(access.len, &counts);
        if lo < 0 || hi >= len {
            return Err((
                access.at.base.max(0) as u32,
                format!("addresses {lo}..={hi} outside buffers of {len}"),
            ));
        }
    }
    Ok(())
}

/// Whether `op` takes `n` operands.
fn takes(op: Op, n: usize) -> bool {
    op.arity().map_or(n > 0, |arity| arity == n)
}

/// Every slot a loop forms lies inside the buffers.
fn check_bounds(item: &Item, tape: &Tape) -> std::result::Result<(), (u32, String)> {
    for (access, counts) in item.nested_accesses() {
        let (lo, hi) = access.at.bounds(access.len, &counts);
        if lo < 0 || hi >= tape.len() as i64 {
            return Err((
                access.at.base.max(0) as u32,
                format!("a loop forms slots {lo}..={hi} outside the buffers"),
            ));
        }
    }
    Ok(())
}

/// The walk over the plan's flattened items, in slot order.
struct Coverage<'t> {
    tape: &'t Tape,
    /// One past the last slot covered.
    expected: u32,
    /// Operands of the `sum` at `expected` covered by its parts so far.
    sum_args: u32,
}

impl Coverage<'_> {
    /// Moves on to `slot`: everything skipped must be a leaf.
    fn advance_to(&mut self, slot: u32) -> std::result::Result<(), String> {
        if self.sum_args != 0 && slot != self.expected {
            return Err("a sum cut into parts, not all of them covered".into());
        }
        if slot < self.expected || slot as usize > self.tape.len() {
            return Err(format!("slot {slot} covered twice or out of order"));
        }
        if let Some(s) = (self.expected..slot).find(|&s| !self.tape.op(Slot(s)).is_leaf()) {
            return Err(format!("slot {s} not covered"));
        }
        self.expected = slot;
        Ok(())
    }

    /// Covers `slot`, computed as `op` from `args`: the tape's next node must be just that.
    fn node(
        &mut self,
        slot: Slot,
        op: Op,
        args: impl ExactSizeIterator<Item = Slot>,
    ) -> std::result::Result<(), String> {
        self.advance_to(slot.0)?;
        let tape_args = self.tape.args(slot);
        let same = self.sum_args == 0
            && self.tape.op(slot) == op
            && tape_args.len() == args.len()
            && args.zip(tape_args).all(|(a, s)| a == s);
        if !same {
            return Err(format!(
                "slot {} is not the {} the plan says",
                slot.0,
                op.name()
            ));
        }
        self.expected += 1;
        Ok(())
    }

    fn map(&mut self, m: &MapLoop, js: &[u32]) -> std::result::Result<(), String> {
        let out = m.out.in_repetition(js);
        let args: Vec<Affine> = m.args.iter().map(|a| a.in_repetition(js)).collect();
        (0..m.len).try_for_each(|t| self.node(out.at(t), m.op, args.iter().map(|a| a.at(t))))
    }

    fn sum(&mut self, s: &SumLoop, js: &[u32]) -> std::result::Result<(), String> {
        let first = s.first.at_levels(0, js);
        let tail = s.tail.in_repetition(js);
        if s.links.is_some() {
            return (0..s.tail_len).try_for_each(|t| self.link(s, js, t));
        }
        let args = (0..s.tail_len + 1).map(|t| match t {
            0 => first,
            t => tail.at(t - 1),
        });
        self.node(s.slot.at_levels(0, js), Op::Sum, args)
    }

    /// Covers link `t` of the chained sum `s`: the partial sum before it (the first term
    /// for link 0) plus tail term `t`; the last link is the sum's slot.
    fn link(&mut self, s: &SumLoop, js: &[u32], t: u32) -> std::result::Result<(), String> {
        let links = s.links.expect("a chained sum").in_repetition(js);
        let before = match t {
            0 => s.first.at_levels(0, js),
            t => links.at(t - 1),
        };
        let last = t + 1 == s.tail_len;
        if last && links.at(t) != s.slot.at_levels(0, js) {
            return Err(format!(
                "a chained sum's last link is not its slot {}",
                links.at(t).0
            ));
        }
        let term = s.tail.in_repetition(js).at(t);
        self.node(links.at(t), Op::Add, [before, term].into_iter())
    }

    /// Covers `item` in repetition `js` of the nests around it.
    fn cover(&mut self, item: &Item, js: &[u32]) -> std::result::Result<(), String> {
        match item {
            Item::Straight(range) => {
                self.advance_to(range.start)?;
                if range.end < range.start || range.end as usize > self.tape.len() {
                    return Err(format!("straight-line code {range:?} outside the tape"));
                }
                self.expected = range.end;
                Ok(())
            }
            Item::SumPart { slot, args } => {
                if args.start == 0 {
                    self.advance_to(slot.0)?;
                }
                let total = self.tape.args(*slot).len() as u32;
                let fits = slot.0 == self.expected
                    && self.tape.op(*slot) == Op::Sum
                    && args.start == self.sum_args
                    && args.start < args.end
                    && args.end <= total;
                if !fits {
                    return Err(format!(
                        "part {args:?} of the sum at {} out of order",
                        slot.0
                    ));
                }
                self.sum_args = args.end;
                if args.end == total {
                    self.sum_args = 0;
                    self.expected += 1;
                }
                Ok(())
            }
            Item::Map(m) => self.map(m, js),
            Item::Sum(s) => self.sum(s, js),
            // A chained dot's nodes interleave: each product, then the link adding it.
            Item::Dot(d) if d.sum.links.is_some() => {
                let m = &d.products;
                let (out, args) = (
                    m.out.in_repetition(js),
                    m.args.iter().map(|a| a.in_repetition(js)),
                );
                let args: Vec<Affine> = args.collect();
                (0..m.len).try_for_each(|t| {
                    self.node(out.at(t), m.op, args.iter().map(|a| a.at(t)))?;
                    self.link(&d.sum, js, t)
                })
            }
            Item::Dot(d) => {
                self.map(&d.products, js)?;
                self.sum(&d.sum, js)
            }
            Item::Nest(_) => unreachable!("flattened"),
        }
    }
}
