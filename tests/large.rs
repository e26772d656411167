//! Scale: a million-node graph must build, linearize and run without recursion (no stack
//! overflow) and in reasonable time. Times are printed (`--nocapture`), never asserted.

mod common;

use std::time::Instant;

use common::chain::{build_chain, Link, PATTERN, SUM_STRIDE, SUM_WEIGHT, W0, W1, X};
use common::{assert_backends_agree_on, assert_close, interpreter, jit, Action, Backend};
use tapejit::op::MathFn;
use tapejit::{Graph, Interpreter, OptLevel, Program, Tape, Value};

const MILLION: usize = 1_000_000;

/// A number with its derivatives with respect to x, w0 and w1 (forward mode).
#[derive(Clone, Copy)]
struct Dual {
    value: f64,
    d: [f64; 3],
}

impl Dual {
    /// `f(self)` given `f(value)` and `f'(value)`.
    fn chain(self, value: f64, derivative: f64) -> Dual {
        Dual {
            value,
            d: self.d.map(|d| d * derivative),
        }
    }
}

/// The chain's loss and its gradient computed independently of the library: plain `f64` in
/// the same order (so the loss must match bit for bit) and forward-mode derivatives (a
/// different summation order, so the gradient matches to rounding).
fn reference_chain(links: usize) -> Dual {
    let x = Dual {
        value: X,
        d: [1.0, 0.0, 0.0],
    };
    let (w0, w1) = (W0, W1);
    let mut v = x;
    let mut sum: Option<Dual> = None;
    for i in 0..links {
        let a = v.value;
        v = match PATTERN[i % PATTERN.len()] {
            Link::MulParam0 => Dual {
                value: a * w0,
                d: [v.d[0] * w0, v.d[1] * w0 + a, v.d[2] * w0],
            },
            Link::AddConstant(c) => v.chain(a + c, 1.0),
            Link::Tanh => {
                let t = MathFn::Tanh.eval(&[a]);
                v.chain(t, 1.0 - t * t)
            }
            Link::ConstantTimes(c) => v.chain(c * a, c),
            Link::Sigmoid => {
                let s = 1.0 / (1.0 + MathFn::Exp.eval(&[-a]));
                v.chain(s, s * (1.0 - s))
            }
            Link::LogOfShifted(c) => v.chain(MathFn::Log.eval(&[a + c]), 1.0 / (a + c)),
            Link::Exp => {
                let e = MathFn::Exp.eval(&[a]);
                v.chain(e, e)
            }
            Link::SubInput => Dual {
                value: a - X,
                d: [v.d[0] - 1.0, v.d[1], v.d[2]],
            },
            Link::DivParam1 => Dual {
                value: a / w1,
                d: [v.d[0] / w1, v.d[1] / w1, v.d[2] / w1 - a / (w1 * w1)],
            },
            Link::Neg => v.chain(-a, -1.0),
            Link::ReluOfShifted(c) => {
                let shifted = a + c;
                assert!(
                    shifted > 0.1,
                    "the chain drifted to relu's kink at link {i}"
                );
                v.chain(shifted, 1.0)
            }
            Link::Square => v.chain(MathFn::Pow.eval(&[a, 2.0]), 2.0 * a),
        };
        if (i + 1) % SUM_STRIDE == 0 {
            sum = Some(match sum {
                None => v,
                Some(s) => Dual {
                    value: s.value + v.value,
                    d: [0, 1, 2].map(|k| s.d[k] + v.d[k]),
                },
            });
        }
    }
    let sum = sum.expect("a chain this long has strided values");
    Dual {
        value: v.value + SUM_WEIGHT * sum.value,
        d: [0, 1, 2].map(|k| v.d[k] + SUM_WEIGHT * sum.d[k]),
    }
}

fn seconds_since(start: Instant) -> String {
    format!("{:.3} s", start.elapsed().as_secs_f64())
}

#[test]
fn a_million_node_chain_builds_linearizes_and_runs() {
    let start = Instant::now();
    let g = Graph::new();
    let chain = build_chain(&g, MILLION);
    println!("built {} nodes in {}", g.len(), seconds_since(start));
    assert!(g.len() >= MILLION - 3, "only {} nodes", g.len());

    let start = Instant::now();
    let tape = Tape::from_graph(&g).unwrap();
    println!(
        "linearized into {} slots in {}",
        tape.len(),
        seconds_since(start)
    );
    assert_eq!(tape.len(), g.len(), "every node of the chain is live");

    let start = Instant::now();
    let mut program = Interpreter::from_tape(tape);
    program.set_inputs(&[X]).unwrap();
    let loss = program.forward();
    println!("interpreted forward in {}", seconds_since(start));
    let start = Instant::now();
    program.backward().unwrap();
    println!("interpreted backward in {}", seconds_since(start));

    let expected = reference_chain(chain.links);
    assert_eq!(
        loss.to_bits(),
        expected.value.to_bits(),
        "loss {loss} vs {}",
        expected.value
    );
    assert_eq!(program.value(chain.loss).unwrap().to_bits(), loss.to_bits());
    let gradient = [chain.x, chain.w[0], chain.w[1]].map(|v| program.grad(v).unwrap());
    for (k, name) in ["x", "w0", "w1"].iter().enumerate() {
        let what = format!("dloss/d{name}");
        assert_close(&what, gradient[k], expected.d[k], 1e-9, 1e-12);
    }
}

/// A sum of a million params: a single node with a million operands, and a parameter
/// vector of a million.
#[test]
fn a_sum_of_a_million_params_runs() {
    let g = Graph::new();
    let params: Vec<Value> = (0..MILLION).map(|i| g.param(i as f64)).collect();
    let total = g.sum(&params);
    g.set_loss(total * 2.0).unwrap();
    let start = Instant::now();
    let mut program = Interpreter::new(&g).unwrap();
    program.step(&[], 0.25).unwrap();
    println!("linearized and stepped in {}", seconds_since(start));
    assert!(program.param_grads().iter().all(|&d| d == 2.0));
    // p_i - 0.25 * 2 for each i
    assert!(program
        .params()
        .iter()
        .enumerate()
        .all(|(i, &p)| p == i as f64 - 0.5));
}

/// The JIT on a chain long enough to span many native functions, against the interpreter.
/// (Not longer: at O2, LLVM takes seconds per few thousand nodes.)
#[test]
fn jit_matches_interpreter_on_a_long_chain() {
    let g = Graph::new();
    build_chain(&g, 5_000);
    let start = Instant::now();
    let mut backends: Vec<Backend> = vec![interpreter(&g)];
    backends.extend([OptLevel::O0, OptLevel::O2].map(|level| jit(&g, level)));
    println!(
        "compiled {} nodes at O0 and O2 in {}",
        g.len(),
        seconds_since(start)
    );
    // The chain is tame near its design point, not for any inputs and params: a script of
    // its own rather than the random one.
    let lr = 1e-3;
    let script = [
        Action::SetInputs(vec![X]),
        Action::Forward,
        Action::Backward,
        Action::Update(lr),
        Action::SetInputs(vec![0.3]),
        Action::Forward,
        Action::Backward,
        Action::Update(lr),
        Action::ZeroGrad,
        Action::Forward,
        Action::Backward,
        Action::Step(vec![0.7], lr),
    ];
    assert_backends_agree_on("5k-node chain", &mut backends, &script);
    let reference = backends[0].program.as_ref();
    assert!(reference
        .values()
        .iter()
        .chain(reference.grads())
        .all(|x| x.is_finite()));
}
