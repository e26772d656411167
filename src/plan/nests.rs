//! What the plan decides for each nest of the schedule, kept under the nest's [`NestId`]:
//! whether its repetitions run in vector lanes ([`super::lanes`]), which gradients it adds
//! after its repetitions ([`super::shared`]), the order forward runs its body in
//! ([`super::order`]). The schedule stays as recovery left it; the emitter asks
//! [`super::Plan::nest`].

use std::borrow::Cow;

use crate::passes::lane_order::BackwardOrder;
use crate::passes::schedule::{DotLoop, Item, Nest, NestId};

/// The plan's decisions for one nest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NestPlan {
    /// Which repetitions run side by side in vector lanes.
    pub lanes: Lanes,
    /// Per body item: whether its map adds into its operands from the last in backward (in
    /// lanes): a chain's link that reads its own element as one operand and its neighbour's
    /// as a later one (a spring `x[s] - x[s - 1]`) reaches each element first from the
    /// neighbour's side, the repetition the interpreter runs before. Empty: none does.
    pub operands_from_last: Vec<bool>,
    /// Gradients added over the repetitions after the nest's backward, not in each
    /// repetition.
    pub shared_grads: Vec<SharedGrad>,
    /// The order in which forward runs the body's items (indices into the body), empty for
    /// the body's own: each item after those whose values of the same repetition it reads.
    /// Backward runs the body from its last item.
    pub forward_order: Vec<u32>,
}

/// How a nest's repetitions run: one after the other, or `group` at a time in vector lanes
/// (one repetition per lane), each lane doing exactly its repetition's operations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Lanes {
    /// Forward and backward one repetition after the other.
    #[default]
    None,
    /// Forward in lane groups (no repetition reads what another writes); backward one
    /// repetition after the other.
    Forward { group: u32 },
    /// Forward and backward in lane groups (backward: groups from the last, body items from
    /// the last, within an item step and operand in the item's order, every repetition of the
    /// group from the last; the plan checked that this adds every gradient's contributions
    /// in the interpreter's order). `vertical`: the dots of the body with an operand that
    /// every lane shares ([`crate::passes::lane_order::vertical_arg`]) add into it
    /// [`crate::passes::lane_order::VERTICAL_BLOCK`] steps at a time, one vector over the
    /// steps per lane, instead of lane by lane at every step (the order the plan checked then).
    Both { group: u32, vertical: bool },
}

impl Lanes {
    /// Repetitions per lane group in forward, if forward runs in lanes.
    pub fn forward(self) -> Option<u32> {
        match self {
            Lanes::None => None,
            Lanes::Forward { group } | Lanes::Both { group, .. } => Some(group),
        }
    }

    /// Repetitions per lane group in backward, if backward runs in lanes.
    pub fn backward(self) -> Option<u32> {
        match self {
            Lanes::Both { group, .. } => Some(group),
            Lanes::None | Lanes::Forward { .. } => None,
        }
    }

    /// Whether backward adds into the operand its lanes share in blocks.
    pub fn vertical(self) -> bool {
        matches!(self, Lanes::Both { vertical: true, .. })
    }
}

/// Operand `operand` of the products of the dot `body[inner].body[dot]` of a nest (a nest of
/// lanes in its body): the same slots in every repetition of the nest, such as the weights
/// a batch's copies share, whose gradient gets its one addition per repetition from that dot
/// alone. Instead of adding into memory in every repetition, the nest's backward adds each
/// slot's contributions of every repetition, from the last, in a register after the
/// repetitions ran: the same additions in the same order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedGrad {
    pub inner: usize,
    pub dot: usize,
    pub operand: usize,
}

impl NestPlan {
    /// The order backward in lanes adds in.
    pub fn backward_order(&self) -> BackwardOrder<'_> {
        BackwardOrder {
            vertical: self.lanes.vertical(),
            from_last: &self.operands_from_last,
        }
    }

    /// Whether body item `k`'s map adds into its operands from the last.
    pub fn adds_from_last(&self, k: usize) -> bool {
        self.operands_from_last.get(k) == Some(&true)
    }

    /// `nest`'s body items in the order forward runs them ([`NestPlan::forward_order`]).
    pub fn forward_items<'n>(&'n self, nest: &'n Nest) -> impl Iterator<Item = &'n Item> {
        let at = |k: usize| self.forward_order.get(k).map_or(k, |&i| i as usize);
        (0..nest.body.len()).map(move |k| &nest.body[at(k)])
    }

    /// `nest`'s body as each repetition's backward runs it: without the additions
    /// [`NestPlan::shared_grads`] makes after the repetitions.
    pub fn repetition_body<'n>(&self, nest: &'n Nest) -> Cow<'n, [Item]> {
        if self.shared_grads.is_empty() {
            return Cow::Borrowed(&nest.body);
        }
        let mut body = nest.body.clone();
        for shared in &self.shared_grads {
            if let Some(Item::Nest(inner)) = body.get_mut(shared.inner) {
                if let Some(Item::Dot(dot)) = inner.body.get_mut(shared.dot) {
                    dot.products.grad_args[shared.operand] = false;
                }
            }
        }
        Cow::Owned(body)
    }
}

impl SharedGrad {
    /// The nest of lanes in `nest`'s body and the dot this names, if they are there.
    pub fn dot_in(self, nest: &Nest) -> Option<(&Nest, &DotLoop)> {
        let Some(Item::Nest(inner)) = nest.body.get(self.inner) else {
            return None;
        };
        match inner.body.get(self.dot) {
            Some(Item::Dot(dot)) if self.operand < dot.products.args.len() => Some((inner, dot)),
            _ => None,
        }
    }
}

/// Per [`NestId`] of a schedule, the plan's [`NestPlan`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Nests(Vec<NestPlan>);

impl Nests {
    /// `count` nests, each running one repetition after the other in the body's order.
    pub fn new(count: u32) -> Nests {
        Nests(vec![NestPlan::default(); count as usize])
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `nest`'s plan. (Every nest of the schedule has one: [`super::Plan::verify`].)
    pub fn of(&self, nest: &Nest) -> &NestPlan {
        &self.0[nest.id.0 as usize]
    }

    pub fn of_mut(&mut self, nest: &Nest) -> &mut NestPlan {
        &mut self.0[nest.id.0 as usize]
    }

    /// Every nest's plan, for tests that tamper with them.
    #[cfg(test)]
    pub fn plans_mut(&mut self) -> impl Iterator<Item = &mut NestPlan> {
        self.0.iter_mut()
    }

    /// Whether `id` names a nest of this table.
    pub fn holds(&self, id: NestId) -> bool {
        (id.0 as usize) < self.0.len()
    }
}
