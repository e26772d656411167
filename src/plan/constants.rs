//! Operands that read one number: `x * 0.5`, made at every use as micrograd makes it, gives
//! each repetition of a body a `Const` node of its own, all holding the same number. A loop
//! would load them from the buffers, in lanes a vector of equal numbers per lane group, at
//! every repetition; the emitter uses the number itself. (Nothing adds into their gradients
//! either: [`crate::tape::Tape::takes_grad`].)

use std::collections::HashMap;

use crate::op::Op;
use crate::passes::schedule::{every_repetition, Affine, Item, MapLoop};
use crate::tape::Tape;

/// Per map (named by the slots it writes) and operand: the constant (its bits) that operand
/// reads in every iteration of every repetition of the nests around.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Constants(HashMap<(Affine, usize), u64>);

impl Constants {
    /// The constant operands of `functions`' maps (a dot's products' among them).
    pub fn find(tape: &Tape, functions: &[Vec<Item>]) -> Constants {
        let mut found = Constants::default();
        for item in functions.iter().flatten() {
            found.visit(tape, item, &mut Vec::new());
        }
        found
    }

    /// The number operand `i` of `map` reads wherever it runs, if it reads one.
    pub fn operand(&self, map: &MapLoop, i: usize) -> Option<f64> {
        if self.0.is_empty() {
            return None;
        }
        self.0.get(&(map.out, i)).copied().map(f64::from_bits)
    }

    /// How many operands read one.
    pub fn count(&self) -> usize {
        self.0.len()
    }

    fn visit(&mut self, tape: &Tape, item: &Item, counts: &mut Vec<u32>) {
        match item {
            Item::Map(m) => self.map(tape, m, counts),
            Item::Dot(d) => self.map(tape, &d.products, counts),
            Item::Nest(nest) => {
                counts.push(nest.count);
                for b in &nest.body {
                    self.visit(tape, b, counts);
                }
                counts.pop();
            }
            Item::Straight(_) | Item::Sum(_) | Item::SumPart { .. } => {}
        }
    }

    /// `m`'s operands that read the same constant in its every iteration, inside nests of
    /// `counts` repetitions.
    fn map(&mut self, tape: &Tape, m: &MapLoop, counts: &[u32]) {
        let constant = |a: Affine, t: u32, js: &[u32]| match tape.op(a.at_levels(t, js)) {
            Op::Const(c) => Some(c.to_bits()),
            _ => None,
        };
        for (i, &a) in m.args.iter().enumerate() {
            let Some(c) = constant(a, 0, &[]) else {
                continue;
            };
            let everywhere = every_repetition(counts, |js| {
                (0..m.len).all(|t| constant(a, t, js) == Some(c))
            });
            if everywhere {
                self.0.insert((m.out, i), c);
            }
        }
    }
}
