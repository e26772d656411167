//! Graph node -> slot, for a graph whose batch copies past the second are known by rule.
//!
//! Where the graph proved its copies ([`crate::graph::CopyRuns`]), linearization reads the first
//! two copies only; the slots of the others follow from theirs: a copy's node `b` copies on
//! from the first lies `b` times as far from it as the second copy's does (a node's slot moves
//! by the copies' period, an input's by the inputs a copy makes). So those nodes take no entry.

use super::DROPPED;

/// Graph node -> slot ([`DROPPED`] for a node not kept).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SlotOf {
    /// Per graph node, but those of `ruled`.
    slots: Vec<u32>,
    ruled: Option<RuledCopies>,
}

/// Graph nodes `from..end`: copies `2..` of the copies at `start` of `period` graph nodes.
#[derive(Clone, Debug, PartialEq)]
struct RuledCopies {
    start: u32,
    period: u32,
    from: u32,
    end: u32,
    /// Per node of the first copy: how far its slot moves per copy.
    moves: Vec<u32>,
}

impl SlotOf {
    /// `nodes` graph nodes, none placed yet.
    pub fn new(nodes: usize) -> SlotOf {
        SlotOf {
            slots: vec![DROPPED; nodes],
            ruled: None,
        }
    }

    /// `nodes` graph nodes, of which copies `2..count` of the `period` nodes at `start` will
    /// follow the rule ([`SlotOf::rule`]) and take no entry.
    pub fn with_copies(nodes: usize, start: u32, period: u32, count: u32) -> SlotOf {
        let (from, end) = (start + 2 * period, start + count * period);
        SlotOf {
            slots: vec![DROPPED; nodes - (end - from) as usize],
            ruled: Some(RuledCopies {
                start,
                period,
                from,
                end,
                moves: Vec::new(),
            }),
        }
    }

    /// The slots of the ruled copies: the first copy's moved `b` times as far as the second's.
    /// Once the first two copies are placed.
    pub fn rule(&mut self) {
        let Some(r) = &mut self.ruled else { return };
        let (first, second) = (r.start as usize, (r.start + r.period) as usize);
        let n = r.period as usize;
        r.moves = (self.slots[first..first + n]
            .iter()
            .zip(&self.slots[second..second + n]))
        .map(|(&a, &b)| b.wrapping_sub(a))
        .collect();
    }

    /// Where graph node `i` has its entry, if it has one.
    #[inline]
    fn entry(&self, i: u32) -> Option<usize> {
        match &self.ruled {
            Some(r) if i >= r.from => (i >= r.end).then(|| (i - (r.end - r.from)) as usize),
            _ => Some(i as usize),
        }
    }

    #[inline]
    pub fn get(&self, i: u32) -> u32 {
        match (self.entry(i), &self.ruled) {
            (Some(e), _) => self.slots[e],
            (None, Some(r)) => {
                let b = (i - r.start) / r.period;
                let like = i - b * r.period;
                match self.slots[like as usize] {
                    DROPPED => DROPPED,
                    s => s + b * r.moves[(like - r.start) as usize],
                }
            }
            (None, None) => unreachable!("a node without entry follows the rule"),
        }
    }

    /// Places graph node `i`, which is not ruled, in slot `s`.
    #[inline]
    pub fn set(&mut self, i: u32, s: u32) {
        let e = self.entry(i).expect("a ruled node is not placed");
        self.slots[e] = s;
    }

    /// How many graph nodes.
    pub fn len(&self) -> usize {
        self.slots.len() + self.ruled.as_ref().map_or(0, |r| (r.end - r.from) as usize)
    }

    /// Every slot given by an entry (`DROPPED` included): the ruled ones follow them.
    pub fn entries_mut(&mut self) -> impl Iterator<Item = &mut u32> {
        self.slots.iter_mut()
    }

    /// Every node's slot, in node order.
    #[cfg(test)]
    pub fn to_vec(&self) -> Vec<u32> {
        (0..self.len() as u32).map(|i| self.get(i)).collect()
    }
}
