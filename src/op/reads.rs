//! What an op's derivative reads: found by running [`Op::local_grads`] itself over values
//! that only record which inputs they depend on, so the answer cannot drift from the
//! formula.

use super::{Arith, MathFn, Op};

/// Which of `local_grads`' inputs a value depends on: bit `i` operand `i` (the last bit
/// standing for every operand from it on), [`OUT`] the op's value.
#[derive(Clone, Copy)]
struct Reads(u64);

const OUT: u64 = 1 << 63;
const LAST_OPERAND: usize = 61;

fn operand_bit(i: usize) -> u64 {
    1 << i.min(LAST_OPERAND)
}

/// The [`Arith`] whose values are [`Reads`]: every operation depends on its operands.
struct Tracer;

impl Arith for Tracer {
    type V = Reads;
    fn constant(&mut self, _: f64) -> Reads {
        Reads(0)
    }
    fn add(&mut self, a: Reads, b: Reads) -> Reads {
        Reads(a.0 | b.0)
    }
    fn sub(&mut self, a: Reads, b: Reads) -> Reads {
        Reads(a.0 | b.0)
    }
    fn mul(&mut self, a: Reads, b: Reads) -> Reads {
        Reads(a.0 | b.0)
    }
    fn div(&mut self, a: Reads, b: Reads) -> Reads {
        Reads(a.0 | b.0)
    }
    fn neg(&mut self, a: Reads) -> Reads {
        a
    }
    fn call(&mut self, _: MathFn, args: &[Reads]) -> Reads {
        Reads(args.iter().fold(0, |m, a| m | a.0))
    }
    fn select_gt(&mut self, a: Reads, b: Reads, then: Reads, otherwise: Reads) -> Reads {
        Reads(a.0 | b.0 | then.0 | otherwise.0)
    }
    fn mul_add(&mut self, a: Reads, b: Reads, c: Reads) -> Reads {
        Reads(a.0 | b.0 | c.0)
    }
    fn pow2(&mut self, k: Reads) -> Reads {
        k
    }
    fn log_split(&mut self, x: Reads) -> [Reads; 3] {
        [x; 3]
    }
    fn lookup(&mut self, _: &'static super::Table, i: Reads) -> Reads {
        i
    }
}

/// What [`Op::local_grads`] of an op with `arity` operands reads besides the gradient.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackwardReads {
    /// Per operand: whether its value is read.
    pub operands: Vec<bool>,
    /// Whether the op's own value is read.
    pub out: bool,
}

impl Op {
    /// Which values this op's derivatives read, for operands of which `takes_grad` says
    /// which take a gradient: a value no derivative reads need not survive forward
    /// (`crate::plan::local`). Only the derivatives of operands that take one are ever
    /// computed into something, so `a * 0.5` needs `a` back only where the constant would
    /// take a gradient.
    pub fn backward_reads(self, takes_grad: &[bool]) -> BackwardReads {
        let x: Vec<Reads> = (0..takes_grad.len())
            .map(|i| Reads(operand_bit(i)))
            .collect();
        let mut local = Vec::new();
        self.local_grads(&mut Tracer, &x, Reads(OUT), Reads(0), &mut local);
        let read = (local.iter().zip(takes_grad))
            .filter(|&(_, &takes)| takes)
            .fold(0, |m, (r, _)| m | r.0);
        BackwardReads {
            operands: (0..takes_grad.len())
                .map(|i| read & operand_bit(i) != 0)
                .collect(),
            out: read & OUT != 0,
        }
    }
}

impl Op {
    /// Whether this op's derivatives read no operand's value, each operand receiving `g` or
    /// `-g` (a sum, a difference, a negation), so a caller need not gather the operands (the
    /// kernel tier's runs). A constant-time answer a caller specialized to the op folds away;
    /// `tests::operands_ignored_as_traced` holds it to [`Op::backward_reads`] (it may say
    /// no where the trace says yes, never the other way).
    #[inline(always)]
    pub fn derivative_ignores_operands(self) -> bool {
        matches!(self, Op::Add | Op::Sub | Op::Neg | Op::Sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(op: Op, arity: usize) -> (Vec<bool>, bool) {
        let r = op.backward_reads(&vec![true; arity]);
        (r.operands, r.out)
    }

    #[test]
    fn operands_ignored_as_traced() {
        use strum::IntoEnumIterator;
        let ops = Op::iter().chain([Op::Powf(0.5), Op::Powf(1.5), Op::Powf(-1.5)]);
        for op in ops.filter(|op| op.derivative_ignores_operands()) {
            for arity in [1, 2, 5] {
                let arity = op.arity().unwrap_or(arity);
                assert_eq!(reads(op, arity).0, vec![false; arity], "{op:?}");
            }
        }
    }

    #[test]
    fn derivatives_read_what_their_formulas_say() {
        assert_eq!(reads(Op::Add, 2), (vec![false, false], false));
        assert_eq!(reads(Op::Sub, 2), (vec![false, false], false));
        assert_eq!(reads(Op::Mul, 2), (vec![true, true], false));
        assert_eq!(reads(Op::Div, 2), (vec![false, true], true));
        assert_eq!(reads(Op::Powf(0.5), 1), (vec![false], true));
        assert_eq!(reads(Op::Powf(2.0), 1), (vec![true], false));
        assert_eq!(reads(Op::Tanh, 1), (vec![false], true));
        assert_eq!(reads(Op::Log, 1), (vec![true], false));
        assert_eq!(reads(Op::Sum, 3), (vec![false; 3], false));
        assert_eq!(reads(Op::Max, 2), (vec![true, true], false));
        assert_eq!(reads(Op::Min, 2), (vec![true, true], false));
        assert_eq!(reads(Op::Sqrt, 1), (vec![false], true));
        for op in [Op::Softplus, Op::Log1p, Op::Abs, Op::Sin, Op::Cos] {
            assert_eq!(reads(op, 1), (vec![true], false), "{op:?}");
        }
    }

    #[test]
    fn only_the_derivatives_of_operands_taking_a_gradient_read() {
        let reads = |op: Op, takes: &[bool]| {
            let r = op.backward_reads(takes);
            (r.operands, r.out)
        };
        // `a * c`, `c` a constant: d/da reads `c`; `a` is read only for d/dc.
        assert_eq!(reads(Op::Mul, &[true, false]), (vec![false, true], false));
        assert_eq!(reads(Op::Mul, &[false, true]), (vec![true, false], false));
        // `a / c`: the value only for d/dc.
        assert_eq!(reads(Op::Div, &[true, false]), (vec![false, true], false));
        assert_eq!(reads(Op::Div, &[false, false]), (vec![false, false], false));
        assert_eq!(reads(Op::Tanh, &[false]), (vec![false], false));
    }
}
