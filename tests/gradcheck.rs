//! Finite-difference gradient checks on the interpreter: the reference must compute the true
//! derivative of every op, not merely agree with the JIT.
//!
//! Central differences `(f(x + h) - f(x - h)) / 2h` with `h = 1e-5 * max(1, |x|)` have a
//! truncation error of about `h^2 f''' / 6` and a rounding error of about `eps |f| / h`, both
//! far below the relative tolerance of 1e-6 on the domains sampled here.

mod common;

use common::assert_close;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strum::IntoEnumIterator;
use tapejit::op::Domain as OpDomain;
use tapejit::{Graph, Interpreter, Op, Program, Value};
use Domain::{Anywhere, AwayFromZero, Positive};

const RELATIVE_TOLERANCE: f64 = 1e-6;
/// For derivatives that are (close to) 0, where a relative tolerance means nothing.
const ABSOLUTE_TOLERANCE: f64 = 1e-8;
const POINTS_PER_CASE: usize = 25;

/// Where a variable is sampled.
#[derive(Clone, Copy)]
enum Domain {
    Anywhere,
    Positive,
    /// Either sign, at least 0.3 from 0: divisors, negative powers, relu (off its kink).
    AwayFromZero,
}

impl Domain {
    fn sample(self, rng: &mut StdRng) -> f64 {
        match self {
            Anywhere => rng.gen_range(-3.0..3.0),
            Positive => rng.gen_range(0.2..4.0),
            AwayFromZero => rng.gen_range(0.3..3.0) * if rng.gen_bool(0.5) { 1.0 } else { -1.0 },
        }
    }
}

/// An expression of one variable per domain.
struct Case {
    name: &'static str,
    domains: &'static [Domain],
    build: for<'g> fn(&[Value<'g>]) -> Value<'g>,
}

const fn case(
    name: &'static str,
    domains: &'static [Domain],
    build: for<'g> fn(&[Value<'g>]) -> Value<'g>,
) -> Case {
    Case {
        name,
        domains,
        build,
    }
}

const CASES: &[Case] = &[
    // Binary operators, between values and with a constant on either side.
    case("x + y", &[Anywhere, Anywhere], |v| v[0] + v[1]),
    case("x - y", &[Anywhere, Anywhere], |v| v[0] - v[1]),
    case("x * y", &[Anywhere, Anywhere], |v| v[0] * v[1]),
    case("x / y", &[Anywhere, AwayFromZero], |v| v[0] / v[1]),
    case("2 + x", &[Anywhere], |v| 2.0 + v[0]),
    case("x - 3", &[Anywhere], |v| v[0] - 3.0),
    case("3 - x", &[Anywhere], |v| 3.0 - v[0]),
    case("2 * x", &[Anywhere], |v| 2.0 * v[0]),
    case("x * -1.5", &[Anywhere], |v| v[0] * -1.5),
    case("1 / x", &[AwayFromZero], |v| 1.0 / v[0]),
    case("x / 4", &[Anywhere], |v| v[0] / 4.0),
    case("-x", &[Anywhere], |v| -v[0]),
    // Powers: integer exponents on either sign, fractional ones on positive bases.
    case("x^0", &[AwayFromZero], |v| v[0].powf(0.0)),
    case("x^1", &[Anywhere], |v| v[0].powf(1.0)),
    case("x^2", &[Anywhere], |v| v[0].powf(2.0)),
    case("x^3", &[Anywhere], |v| v[0].powf(3.0)),
    case("x^-1", &[AwayFromZero], |v| v[0].powf(-1.0)),
    case("x^-2", &[AwayFromZero], |v| v[0].powf(-2.0)),
    case("x^0.5", &[Positive], |v| v[0].powf(0.5)),
    case("x^1.5", &[Positive], |v| v[0].powf(1.5)),
    case("x^-0.5", &[Positive], |v| v[0].powf(-0.5)),
    case("x^(1/3)", &[Positive], |v| v[0].powf(1.0 / 3.0)),
    case("x^2.5", &[Positive], |v| v[0].powf(2.5)),
    // Transcendental functions and relu.
    case("exp(x)", &[Anywhere], |v| v[0].exp()),
    case("log(x)", &[Positive], |v| v[0].log()),
    case("tanh(x)", &[Anywhere], |v| v[0].tanh()),
    case("relu(x)", &[AwayFromZero], |v| v[0].relu()),
    case("sigmoid(x)", &[Anywhere], |v| v[0].sigmoid()),
    // max, off its kink: each side wins in one case, and |x| either way.
    case("max(x, y + 7)", &[Anywhere, Anywhere], |v| {
        v[0].max(v[1] + 7.0)
    }),
    case("max(x + 7, y)", &[Anywhere, Anywhere], |v| {
        (v[0] + 7.0).max(v[1])
    }),
    case("max(x, -x)", &[AwayFromZero], |v| v[0].max(-v[0])),
    case("min(x, y + 7)", &[Anywhere, Anywhere], |v| {
        v[0].min(v[1] + 7.0)
    }),
    case("min(x - 7, y)", &[Anywhere, Anywhere], |v| {
        (v[0] - 7.0).min(v[1])
    }),
    case("min(x, -x)", &[AwayFromZero], |v| v[0].min(-v[0])),
    // The newer unary ops, softplus far out on either side too.
    case("softplus(x)", &[Anywhere], |v| v[0].softplus()),
    case("softplus(10x)", &[Anywhere], |v| (v[0] * 10.0).softplus()),
    case("log1p(x)", &[Positive], |v| v[0].log1p()),
    case("log1p(0.2x - 0.9)", &[Positive], |v| {
        (v[0] * 0.2 - 0.9).log1p()
    }),
    case("abs(x)", &[AwayFromZero], |v| v[0].abs()),
    case("sin(x)", &[Anywhere], |v| v[0].sin()),
    case("cos(x)", &[Anywhere], |v| v[0].cos()),
    case("sin(10x)", &[Anywhere], |v| (v[0] * 10.0).sin()),
    case("sqrt(x)", &[Positive], |v| v[0].sqrt()),
    // Sums, including an operand that appears twice.
    case("sum(x)", &[Anywhere], |v| v[0].graph().sum(v)),
    case("sum(x, y, z)", &[Anywhere, Anywhere, Anywhere], |v| {
        v[0].graph().sum(v)
    }),
    case("sum(x, y, x)", &[Anywhere, Anywhere], |v| {
        v[0].graph().sum(&[v[0], v[1], v[0]])
    }),
    // Shared subexpressions: the gradient sums over every path.
    case("x * x", &[Anywhere], |v| v[0] * v[0]),
    case("xy / (xy + 5)", &[Positive, Positive], |v| {
        (v[0] * v[1]) / (v[0] * v[1] + 5.0)
    }),
];

#[test]
fn every_op_matches_finite_differences() {
    let mut rng = StdRng::seed_from_u64(2024);
    for case in CASES {
        let graph = Graph::new();
        let inputs = graph.inputs(case.domains.len());
        graph.set_loss((case.build)(&inputs)).unwrap();
        let mut program = Interpreter::new(&graph).unwrap();
        for _ in 0..POINTS_PER_CASE {
            let point: Vec<f64> = case.domains.iter().map(|d| d.sample(&mut rng)).collect();
            check_gradient(case.name, &mut program, &point, &[]);
        }
    }
}

/// Every op of `Op::iter()`, its operands sampled inside [`Op::domain`]: a new op is checked
/// here without editing this file (`powf` at several exponents, `sum` of three operands).
#[test]
fn every_op_of_the_enum_matches_finite_differences_in_its_domain() {
    let mut rng = StdRng::seed_from_u64(2025);
    let ops = Op::iter()
        .filter(|op| !op.is_leaf())
        .flat_map(|op| match op {
            Op::Powf(_) => [0.0, 1.0, 2.0, 3.0, -1.0, -2.0, 0.5, 1.5, -0.5, 1.0 / 3.0]
                .map(Op::Powf)
                .to_vec(),
            op => vec![op],
        });
    for op in ops {
        let arity = op.arity().unwrap_or(3);
        let graph = Graph::new();
        let inputs = graph.inputs(arity);
        graph.set_loss(graph.apply(op, &inputs).unwrap()).unwrap();
        let mut program = Interpreter::new(&graph).unwrap();
        for _ in 0..POINTS_PER_CASE {
            let mut point: Vec<f64> = Vec::with_capacity(arity);
            for i in 0..arity {
                let x = match op.domain(i) {
                    OpDomain::Real => Anywhere.sample(&mut rng),
                    OpDomain::Positive => Positive.sample(&mut rng),
                    OpDomain::NonZero => AwayFromZero.sample(&mut rng),
                    OpDomain::ApartFrom(k) => point[k] + AwayFromZero.sample(&mut rng),
                };
                point.push(x);
            }
            check_gradient(&format!("{op:?}"), &mut program, &point, &[]);
        }
    }
}

/// A small network mixing every op, differentiated with respect to params and inputs alike.
#[test]
fn composite_expression_matches_finite_differences() {
    let graph = Graph::new();
    let x = graph.inputs(2);
    let w = [graph.param(0.5), graph.param(-0.8), graph.param(1.2)];
    let bias = graph.param(0.1);
    let hidden = (w[0] * x[0] + w[1] * x[1] + bias).tanh();
    let gate = (w[2] * x[0] - x[1] / (w[1] * w[1] + 1.0)).sigmoid();
    let positive = (hidden * gate).exp() + 0.5;
    let features = [
        positive.log(),
        positive.powf(1.5),
        (hidden + 2.0).relu(),
        (gate - 3.0).relu(),
        -(hidden * hidden),
        2.0 / positive,
    ];
    let target = 0.25;
    let loss = (graph.sum(&features) - target).powf(2.0);
    graph.set_loss(loss).unwrap();

    let mut program = Interpreter::new(&graph).unwrap();
    let mut rng = StdRng::seed_from_u64(99);
    for _ in 0..POINTS_PER_CASE {
        let inputs = [Anywhere.sample(&mut rng), Anywhere.sample(&mut rng)];
        let params: Vec<f64> = (0..4).map(|_| rng.gen_range(-1.5..1.5)).collect();
        check_gradient("composite", &mut program, &inputs, &params);
    }
}

/// Asserts that backward's gradient of the loss with respect to every input and param
/// matches central differences at the given point.
fn check_gradient(name: &str, program: &mut Interpreter, inputs: &[f64], params: &[f64]) {
    let input_base = program.tape().input_base();
    let params = if params.is_empty() {
        program.params().to_vec()
    } else {
        params.to_vec()
    };
    loss_at(program, inputs, &params);
    // Params accumulate gradients across backward calls, so start from zero.
    program.zero_grad();
    program.backward().unwrap();
    let input_grads = program.grads()[input_base..input_base + inputs.len()].to_vec();
    let param_grads = program.param_grads().to_vec();

    for (i, &analytic) in input_grads.iter().enumerate() {
        let numeric = central_difference(inputs, i, |x| loss_at(program, x, &params));
        let what = format!("{name}: d/d input {i} at inputs {inputs:?}, params {params:?}");
        assert_close(
            &what,
            analytic,
            numeric,
            RELATIVE_TOLERANCE,
            ABSOLUTE_TOLERANCE,
        );
    }
    for (i, &analytic) in param_grads.iter().enumerate() {
        let numeric = central_difference(&params, i, |p| loss_at(program, inputs, p));
        let what = format!("{name}: d/d param {i} at inputs {inputs:?}, params {params:?}");
        assert_close(
            &what,
            analytic,
            numeric,
            RELATIVE_TOLERANCE,
            ABSOLUTE_TOLERANCE,
        );
    }
}

fn loss_at(program: &mut Interpreter, inputs: &[f64], params: &[f64]) -> f64 {
    program.set_inputs(inputs).unwrap();
    program.set_params(params).unwrap();
    program.forward()
}

/// `df/dx_i` at `x` by central differences.
fn central_difference(x: &[f64], i: usize, mut f: impl FnMut(&[f64]) -> f64) -> f64 {
    let h = 1e-5 * x[i].abs().max(1.0);
    let mut shifted = x.to_vec();
    shifted[i] = x[i] + h;
    let (up, f_up) = (shifted[i], f(&shifted));
    shifted[i] = x[i] - h;
    let (down, f_down) = (shifted[i], f(&shifted));
    // Divide by the step actually taken: x ± h is rounded.
    (f_up - f_down) / (up - down)
}
