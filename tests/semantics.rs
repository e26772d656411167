//! micrograd's semantics, checked by hand-derived values and gradients on the interpreter and
//! on the JIT (default level).

mod common;

use common::{assert_close, semantics_backends};
use tapejit::{Error, Graph, Jit, Program, Tape, Value};

/// Hand-derived results are compared within this relative tolerance.
const TOLERANCE: f64 = 1e-9;

/// Runs `check` on a fresh program of `graph` for every backend.
fn on_each_backend(graph: &Graph, check: impl Fn(&str, &mut dyn Program)) {
    for (backend, compile) in semantics_backends() {
        let mut program = compile(graph);
        check(backend, program.as_mut());
    }
}

fn close(what: &str, got: f64, expected: f64) {
    assert_close(what, got, expected, TOLERANCE, 0.0);
}

/// Forward then backward, for tests that only look at the results.
fn forward_backward(program: &mut dyn Program) {
    program.forward();
    program.backward().unwrap();
}

/// micrograd's test_engine.py `test_sanity_check`.
#[test]
fn micrograd_sanity_check() {
    let g = Graph::new();
    let x = g.param(-4.0);
    let z = 2.0 * x + 2.0 + x;
    let q = z.relu() + z * x;
    let h = (z * z).relu();
    let y = h + q + q * x;
    g.set_loss(y).unwrap();
    on_each_backend(&g, |backend, p| {
        forward_backward(p);
        close(&format!("{backend}: y"), p.value(y).unwrap(), -20.0);
        close(&format!("{backend}: dy/dx"), p.grad(x).unwrap(), 46.0);
    });
}

/// micrograd's test_engine.py `test_more_ops`, with micrograd's (PyTorch-checked) numbers.
#[test]
// Written as micrograd writes it: `c += c + 1` means `c = c + (c + 1)`.
#[allow(clippy::misrefactored_assign_op)]
fn micrograd_more_ops() {
    let graph = Graph::new();
    let a = graph.param(-4.0);
    let b = graph.param(2.0);
    let mut c = a + b;
    let mut d = a * b + b.powf(3.0);
    c += c + 1.0;
    c += 1.0 + c + (-a);
    d += d * 2.0 + (b + a).relu();
    d += 3.0 * d + (b - a).relu();
    let e = c - d;
    let f = e.powf(2.0);
    let mut g = f / 2.0;
    g += 10.0 / f;
    graph.set_loss(g).unwrap();
    on_each_backend(&graph, |backend, p| {
        forward_backward(p);
        close(
            &format!("{backend}: g"),
            p.value(g).unwrap(),
            24.70408163265306,
        );
        close(
            &format!("{backend}: dg/da"),
            p.grad(a).unwrap(),
            138.83381924198252,
        );
        close(
            &format!("{backend}: dg/db"),
            p.grad(b).unwrap(),
            645.5772594752186,
        );
    });
}

/// One op applied to one input: its value and derivative at a point, derived by hand.
struct UnaryCase {
    name: &'static str,
    build: for<'g> fn(Value<'g>) -> Value<'g>,
    at: f64,
    value: f64,
    derivative: f64,
}

const fn unary(
    name: &'static str,
    build: for<'g> fn(Value<'g>) -> Value<'g>,
    [at, value, derivative]: [f64; 3],
) -> UnaryCase {
    UnaryCase {
        name,
        build,
        at,
        value,
        derivative,
    }
}

/// `[at, value, derivative]` for each expression.
const UNARY_CASES: &[UnaryCase] = &[
    unary("exp(x)", |x| x.exp(), [0.0, 1.0, 1.0]),
    unary("log(x)", |x| x.log(), [1.0, 0.0, 1.0]),
    unary(
        "log(x)",
        |x| x.log(),
        [4.0, 2.0 * std::f64::consts::LN_2, 0.25],
    ),
    unary("tanh(x)", |x| x.tanh(), [0.0, 0.0, 1.0]),
    unary("sigmoid(x)", |x| x.sigmoid(), [0.0, 0.5, 0.25]),
    unary("relu(x)", |x| x.relu(), [3.0, 3.0, 1.0]),
    unary("relu(x)", |x| x.relu(), [-3.0, 0.0, 0.0]),
    // micrograd's relu passes no gradient at 0: `(out.data > 0) * out.grad`.
    unary("relu(x)", |x| x.relu(), [0.0, 0.0, 0.0]),
    unary(
        "max(x, 2)",
        |x| x.max(x.graph().constant(2.0)),
        [3.0, 3.0, 1.0],
    ),
    unary(
        "max(x, 2)",
        |x| x.max(x.graph().constant(2.0)),
        [1.0, 2.0, 0.0],
    ),
    // On a tie, max picks (and passes the gradient to) self.
    unary(
        "max(x, 2)",
        |x| x.max(x.graph().constant(2.0)),
        [2.0, 2.0, 1.0],
    ),
    unary(
        "max(2, x)",
        |x| x.graph().constant(2.0).max(x),
        [2.0, 2.0, 0.0],
    ),
    unary("-x", |x| -x, [2.0, -2.0, -1.0]),
    unary("x^2", |x| x.powf(2.0), [3.0, 9.0, 6.0]),
    unary("x^0.5", |x| x.powf(0.5), [4.0, 2.0, 0.25]),
    unary("x^-1", |x| x.powf(-1.0), [2.0, 0.5, -0.25]),
    unary("x^0", |x| x.powf(0.0), [5.0, 1.0, 0.0]),
    unary("2 - x", |x| 2.0 - x, [5.0, -3.0, -1.0]),
    unary("1 / x", |x| 1.0 / x, [4.0, 0.25, -0.0625]),
    unary("x / 4", |x| x / 4.0, [2.0, 0.5, 0.25]),
    unary("x - 3", |x| x - 3.0, [1.0, -2.0, 1.0]),
    unary("sum(x)", |x| x.graph().sum(&[x]), [7.0, 7.0, 1.0]),
    unary(
        "softplus(x)",
        |x| x.softplus(),
        [0.0, std::f64::consts::LN_2, 0.5],
    ),
    // log(1 + e), e / (1 + e)
    unary(
        "softplus(x)",
        |x| x.softplus(),
        [1.0, 1.313_261_687_518_222_8, 0.731_058_578_630_004_9],
    ),
    unary(
        "softplus(x)",
        |x| x.softplus(),
        [-1.0, 0.313_261_687_518_222_8, 0.268_941_421_369_995_1],
    ),
    // Far out, where log(1 + e^x) would round 1 + e^x to 1 or e^x overflow.
    unary(
        "softplus(x)",
        |x| x.softplus(),
        [-700.0, 9.859_676_543_759_77e-305, 9.859_676_543_759_77e-305],
    ),
    unary(
        "softplus(x)",
        |x| x.softplus(),
        [-30.0, 9.357_622_968_839_737e-14, 9.357_622_968_839_737e-14],
    ),
    unary("softplus(x)", |x| x.softplus(), [800.0, 800.0, 1.0]),
    unary("log1p(x)", |x| x.log1p(), [0.0, 0.0, 1.0]),
    unary(
        "log1p(x)",
        |x| x.log1p(),
        [1.0, std::f64::consts::LN_2, 0.5],
    ),
    unary(
        "log1p(x)",
        |x| x.log1p(),
        [-0.5, -std::f64::consts::LN_2, 2.0],
    ),
    unary("abs(x)", |x| x.abs(), [-3.0, 3.0, -1.0]),
    unary("abs(x)", |x| x.abs(), [2.5, 2.5, 1.0]),
    // PyTorch's sgn: no gradient at 0.
    unary("abs(x)", |x| x.abs(), [0.0, 0.0, 0.0]),
    unary("sin(x)", |x| x.sin(), [0.0, 0.0, 1.0]),
    unary(
        "sin(x)",
        |x| x.sin(),
        [std::f64::consts::FRAC_PI_6, 0.5, 0.866_025_403_784_438_6],
    ),
    unary("cos(x)", |x| x.cos(), [0.0, 1.0, 0.0]),
    unary(
        "cos(x)",
        |x| x.cos(),
        [std::f64::consts::FRAC_PI_3, 0.5, -0.866_025_403_784_438_6],
    ),
    unary("sqrt(x)", |x| x.sqrt(), [4.0, 2.0, 0.25]),
    unary("sqrt(x)", |x| x.sqrt(), [2.25, 1.5, 1.0 / 3.0]),
    unary(
        "min(x, 2)",
        |x| x.min(x.graph().constant(2.0)),
        [3.0, 2.0, 0.0],
    ),
    unary(
        "min(x, 2)",
        |x| x.min(x.graph().constant(2.0)),
        [1.0, 1.0, 1.0],
    ),
    // On a tie, min picks (and passes the gradient to) self, as max does.
    unary(
        "min(x, 2)",
        |x| x.min(x.graph().constant(2.0)),
        [2.0, 2.0, 1.0],
    ),
    unary(
        "min(2, x)",
        |x| x.graph().constant(2.0).min(x),
        [2.0, 2.0, 0.0],
    ),
];

#[test]
fn unary_ops_at_hand_derived_points() {
    for case in UNARY_CASES {
        let g = Graph::new();
        let x = g.input();
        let y = (case.build)(x);
        g.set_loss(y).unwrap();
        on_each_backend(&g, |backend, p| {
            p.set_inputs(&[case.at]).unwrap();
            forward_backward(p);
            let what = format!("{backend}: {} at {}", case.name, case.at);
            assert_close(
                &format!("{what} value"),
                p.value(y).unwrap(),
                case.value,
                TOLERANCE,
                0.0,
            );
            let dy = p.grad(x).unwrap();
            assert_close(
                &format!("{what} derivative"),
                dy,
                case.derivative,
                TOLERANCE,
                0.0,
            );
        });
    }
}

/// micrograd's relu is `0 if x < 0 else x`: -0.0 passes through unchanged (it is not < 0),
/// negative numbers become +0.0. A backend using `maxnum` or `x > 0 ? x : 0` would differ.
#[test]
fn relu_keeps_the_sign_of_zero_as_micrograd_does() {
    let g = Graph::new();
    let x = g.input();
    let y = x.relu();
    g.add_output(y).unwrap();
    let cases: [(f64, f64); 4] = [(-0.0, -0.0), (0.0, 0.0), (-3.0, 0.0), (2.5, 2.5)];
    on_each_backend(&g, |backend, p| {
        for (input, expected) in cases {
            p.set_inputs(&[input]).unwrap();
            p.forward();
            let got = p.value(y).unwrap();
            assert_eq!(
                got.to_bits(),
                expected.to_bits(),
                "{backend}: relu({input:?}) = {got:?}, expected {expected:?}"
            );
        }
    });
}

/// `x ** c` for the exponents IEEE arithmetic computes exactly (0, 1, 2, -1, 1/2) is the
/// correctly rounded power (`x * x`, `1 / x`, the square root), and on the special values
/// (signed zeros, infinities, NaN, negatives under a square root) what libm's `pow` gives.
#[test]
fn exact_powers_are_correctly_rounded_and_keep_pows_special_values() {
    let g = Graph::new();
    let x = g.input();
    // Infinities and NaN come from a log: inputs must be finite.
    let log_x = x.log();
    let exponents = [0.0, 1.0, 2.0, -1.0, 0.5, 3.0];
    let mut outs = Vec::new();
    for base in [x, log_x] {
        for c in exponents {
            let y = base.powf(c);
            g.add_output(y).unwrap();
            outs.push((base, c, y));
        }
    }
    let exact = |v: f64, c: f64| -> f64 {
        let special = v == 0.0 || !v.is_finite();
        match c {
            _ if special => v.powf(c),
            2.0 => v * v,
            -1.0 => 1.0 / v,
            0.5 => v.sqrt(),
            _ => v.powf(c),
        }
    };
    let inputs = [-0.0, 0.0, 3.0, 2.0, 1e-310, -2.0, 1e200, 0.5];
    on_each_backend(&g, |backend, p| {
        for input in inputs {
            p.set_inputs(&[input]).unwrap();
            p.forward();
            for &(base, c, y) in &outs {
                let v = p.value(base).unwrap();
                let (got, expected) = (p.value(y).unwrap(), exact(v, c));
                let same =
                    got.to_bits() == expected.to_bits() || (got.is_nan() && expected.is_nan());
                assert!(
                    same,
                    "{backend}: {v:?} ** {c} = {got:?}, expected {expected:?}"
                );
            }
        }
    });
}

/// One op of one input at a point where its value and derivative are special: both exact, to
/// the bit (a NaN as any NaN).
struct SpecialCase {
    name: &'static str,
    build: for<'g> fn(Value<'g>) -> Value<'g>,
    at: f64,
    value: f64,
    derivative: f64,
}

const fn special(
    name: &'static str,
    build: for<'g> fn(Value<'g>) -> Value<'g>,
    [at, value, derivative]: [f64; 3],
) -> SpecialCase {
    SpecialCase {
        name,
        build,
        at,
        value,
        derivative,
    }
}

/// `[at, value, derivative]`, exact.
const SPECIAL_CASES: &[SpecialCase] = &[
    // Finite far out: e^-|x| underflows to 0 and log1p(0) = 0; sigmoid is 1 / (1 + e^-x).
    special("softplus(x)", |x| x.softplus(), [1000.0, 1000.0, 1.0]),
    special("softplus(x)", |x| x.softplus(), [-1000.0, 0.0, 0.0]),
    special("softplus(x)", |x| x.softplus(), [f64::MAX, f64::MAX, 1.0]),
    special("softplus(x)", |x| x.softplus(), [-f64::MAX, 0.0, 0.0]),
    // x itself once e^-x is below half an ULP of x (PyTorch's threshold is 20).
    special("softplus(x)", |x| x.softplus(), [40.0, 40.0, 1.0]),
    special("abs(x)", |x| x.abs(), [-0.0, 0.0, 0.0]),
    special("abs(x)", |x| x.abs(), [0.0, 0.0, 0.0]),
    special("abs(x)", |x| x.abs(), [-f64::MAX, f64::MAX, -1.0]),
    special("abs(x)", |x| x.abs(), [-5e-324, 5e-324, -1.0]),
    // pow's values: sqrt(-0) = +0 (the IEEE root is -0), its derivative 0.5 / +0.
    special("sqrt(x)", |x| x.sqrt(), [-0.0, 0.0, f64::INFINITY]),
    special("sqrt(x)", |x| x.sqrt(), [0.0, 0.0, f64::INFINITY]),
    special("sqrt(x)", |x| x.sqrt(), [-1.0, f64::NAN, f64::NAN]),
    // sqrt(-inf) = +inf, as pow gives (the IEEE root is NaN): inputs are finite, log(0) is
    // -inf. The derivative through log at 0 is 0 / 0.
    special(
        "sqrt(log(x))",
        |x| x.log().sqrt(),
        [0.0, f64::INFINITY, f64::NAN],
    ),
    special("log1p(x)", |x| x.log1p(), [-0.0, -0.0, 1.0]),
    // log(1 + 1e-20) would be 0.
    special("log1p(x)", |x| x.log1p(), [1e-20, 1e-20, 1.0]),
    special(
        "log1p(x)",
        |x| x.log1p(),
        [-1.0, f64::NEG_INFINITY, f64::INFINITY],
    ),
    special("sin(x)", |x| x.sin(), [-0.0, -0.0, 1.0]),
    special("cos(x)", |x| x.cos(), [-0.0, 1.0, 0.0]),
    // Ties of signed zeros: max and min keep self, which takes the gradient.
    special(
        "max(x, +0)",
        |x| x.max(x.graph().constant(0.0)),
        [-0.0, -0.0, 1.0],
    ),
    special(
        "max(+0, x)",
        |x| x.graph().constant(0.0).max(x),
        [-0.0, 0.0, 0.0],
    ),
    special(
        "min(x, +0)",
        |x| x.min(x.graph().constant(0.0)),
        [-0.0, -0.0, 1.0],
    ),
    special(
        "min(+0, x)",
        |x| x.graph().constant(0.0).min(x),
        [-0.0, 0.0, 0.0],
    ),
    special(
        "min(x, -0)",
        |x| x.min(x.graph().constant(-0.0)),
        [0.0, 0.0, 1.0],
    ),
];

#[test]
fn new_ops_at_special_points_are_exact() {
    let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for case in SPECIAL_CASES {
        let g = Graph::new();
        let x = g.input();
        let y = (case.build)(x);
        g.set_loss(y).unwrap();
        on_each_backend(&g, |backend, p| {
            p.set_inputs(&[case.at]).unwrap();
            forward_backward(p);
            let what = format!("{backend}: {} at {:?}", case.name, case.at);
            let (value, derivative) = (p.value(y).unwrap(), p.grad(x).unwrap());
            assert!(
                same(value, case.value),
                "{what}: value {value:?}, expected {:?}",
                case.value
            );
            assert!(
                same(derivative, case.derivative),
                "{what}: derivative {derivative:?}, expected {:?}",
                case.derivative
            );
        });
    }
}

/// `sqrt` is `powf(0.5)`'s very numbers, value and derivative, on both backends.
#[test]
fn sqrt_is_the_half_power_to_the_bit() {
    let inputs = [0.0, -0.0, 2.0, 1e-310, 1e300, 0.3, -4.0, 5e-324];
    let by_sqrt = values_and_derivatives(|x| x.sqrt(), &inputs);
    let by_pow = values_and_derivatives(|x| x.powf(0.5), &inputs);
    assert_eq!(by_sqrt.len(), semantics_backends().len() * inputs.len());
    for ((at, sqrt), (_, pow)) in by_sqrt.iter().zip(&by_pow) {
        assert_eq!(
            sqrt.map(f64::to_bits),
            pow.map(f64::to_bits),
            "{at}: sqrt {sqrt:?}, powf(0.5) {pow:?}"
        );
    }
}

/// `[value, derivative]` of `build(x)` at each of `inputs` on each backend, named.
fn values_and_derivatives(
    build: for<'g> fn(Value<'g>) -> Value<'g>,
    inputs: &[f64],
) -> Vec<(String, [f64; 2])> {
    let g = Graph::new();
    let x = g.input();
    let y = build(x);
    g.set_loss(y).unwrap();
    let results = std::cell::RefCell::new(Vec::new());
    on_each_backend(&g, |backend, p| {
        for &input in inputs {
            p.set_inputs(&[input]).unwrap();
            p.zero_grad();
            forward_backward(p);
            let got = [p.value(y).unwrap(), p.grad(x).unwrap()];
            results
                .borrow_mut()
                .push((format!("{backend} at {input:?}"), got));
        }
    });
    results.into_inner()
}

/// A value used twice receives the gradient of both uses.
#[test]
fn shared_subexpressions_sum_their_gradients() {
    let g = Graph::new();
    let x = g.input();
    let square = x * x;
    let double = x + x;
    let cube = x * x * x;
    g.set_loss(g.sum(&[square, double, cube])).unwrap();
    on_each_backend(&g, |backend, p| {
        for at in [-1.5, 0.0, 0.5, 3.0] {
            p.set_inputs(&[at]).unwrap();
            forward_backward(p);
            // d/dx (x^2 + 2x + x^3) = 2x + 2 + 3x^2
            let expected = 2.0 * at + 2.0 + 3.0 * at * at;
            close(
                &format!("{backend}: gradient at {at}"),
                p.grad(x).unwrap(),
                expected,
            );
        }
    });
}

/// `loss = 2 * (p * x)`: at p = 3, x = 5, dloss/dt = 2 for t = p * x, dloss/dp = 2x = 10 and
/// dloss/dx = 2p = 6.
fn scaled_product(g: &Graph) -> (Value<'_>, Value<'_>, Value<'_>, Value<'_>) {
    let x = g.input();
    let p = g.param(3.0);
    let t = p * x;
    let loss = t * 2.0;
    g.set_loss(loss).unwrap();
    (x, p, t, loss)
}

/// Params accumulate gradients across backward calls (as micrograd's do until zero_grad);
/// every other node is recomputed from 0 (micrograd rebuilds those nodes every step).
#[test]
fn param_gradients_accumulate_across_backward_calls_and_others_do_not() {
    let g = Graph::new();
    let (x, p, t, loss) = scaled_product(&g);
    on_each_backend(&g, |backend, prog| {
        prog.set_inputs(&[5.0]).unwrap();
        prog.forward();
        for (call, param_grad) in [(1, 10.0), (2, 20.0), (3, 30.0)] {
            prog.backward().unwrap();
            let at = format!("{backend}, backward call {call}");
            assert_eq!(prog.grad(p).unwrap(), param_grad, "{at}: param");
            assert_eq!(prog.param_grads(), &[param_grad], "{at}: param_grads");
            assert_eq!(prog.grad(t).unwrap(), 2.0, "{at}: intermediate");
            assert_eq!(prog.grad(x).unwrap(), 6.0, "{at}: input");
            assert_eq!(prog.grad(loss).unwrap(), 1.0, "{at}: loss");
        }
        prog.zero_grad();
        // As micrograd's Module.zero_grad: the params' gradients; the others are recomputed
        // by the next backward anyway.
        assert!(
            prog.param_grads().iter().all(|&d| d == 0.0),
            "{backend}: zero_grad left {:?}",
            prog.param_grads()
        );
        prog.backward().unwrap();
        assert_eq!(prog.grad(p).unwrap(), 10.0, "{backend}: after zero_grad");
    });
}

#[test]
fn update_subtracts_learning_rate_times_gradient() {
    let g = Graph::new();
    let (_, p, _, _) = scaled_product(&g);
    on_each_backend(&g, |backend, prog| {
        prog.set_inputs(&[5.0]).unwrap();
        forward_backward(prog);
        prog.update(0.1).unwrap();
        assert_eq!(prog.params(), &[3.0 - 0.1 * 10.0], "{backend}");
        assert_eq!(prog.value(p).unwrap(), 3.0 - 0.1 * 10.0, "{backend}");
        // update does not touch gradients, nor (until the next forward) other values.
        assert_eq!(prog.param_grads(), &[10.0], "{backend}");
        assert_eq!(prog.loss().unwrap(), 30.0, "{backend}");
    });
}

/// step = set_inputs, zero_grad, forward, backward, update; it returns the loss before the
/// update, and leftover gradients from earlier backward calls do not leak into it.
#[test]
fn step_is_one_whole_sgd_step() {
    let g = Graph::new();
    let (_, p, _, _) = scaled_product(&g);
    on_each_backend(&g, |backend, prog| {
        prog.set_inputs(&[1.0]).unwrap();
        prog.forward();
        prog.backward().unwrap();
        prog.backward().unwrap();
        let loss = prog.step(&[5.0], 0.1).unwrap();
        assert_eq!(
            loss, 30.0,
            "{backend}: step returns the loss before the update"
        );
        assert_eq!(
            prog.param_grads(),
            &[10.0],
            "{backend}: one backward's worth"
        );
        assert_eq!(prog.value(p).unwrap(), 2.0, "{backend}: 3 - 0.1 * 10");
        // The next step sees the updated param: loss = 2 * 2 * 5.
        assert_eq!(
            prog.step(&[5.0], 0.1).unwrap(),
            20.0,
            "{backend}: second step"
        );
    });
}

#[test]
fn outputs_come_in_the_order_they_were_added() {
    let g = Graph::new();
    let x = g.input();
    let (a, b, c) = (x + 1.0, x * 10.0, -x);
    let indices: Vec<usize> = [c, a, b, a]
        .into_iter()
        .map(|v| g.add_output(v).unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2, 3]);
    on_each_backend(&g, |backend, p| {
        p.set_inputs(&[2.0]).unwrap();
        let loss = p.forward();
        assert!(
            loss.is_nan(),
            "{backend}: forward without a loss returns NaN"
        );
        assert_eq!(p.outputs(), [-2.0, 3.0, 20.0, 3.0], "{backend}");
    });
}

/// Params and inputs keep their creation order, however they interleave with each other
/// and with ops.
#[test]
fn params_and_inputs_keep_their_creation_order() {
    let g = Graph::new();
    let x0 = g.input();
    let p0 = g.param(10.0);
    let early = x0 * p0;
    let x1 = g.input();
    let p1 = g.param(20.0);
    let p2 = g.param(30.0);
    let x2 = g.input();
    // loss = 1*x0*p0 + 2*x1*p1 + 3*x2*p2: dloss/dp_i = (i+1) x_i, dloss/dx_i = (i+1) p_i
    let loss = early + 2.0 * x1 * p1 + 3.0 * x2 * p2;
    g.set_loss(loss).unwrap();
    on_each_backend(&g, |backend, p| {
        assert_eq!(p.params(), &[10.0, 20.0, 30.0], "{backend}: initial params");
        p.set_inputs(&[1.0, 2.0, 3.0]).unwrap();
        forward_backward(p);
        assert_eq!(p.value(x1).unwrap(), 2.0, "{backend}");
        assert_eq!(p.param_grads(), &[1.0, 4.0, 9.0], "{backend}: param grads");
        let input_grads = [x0, x1, x2].map(|x| p.grad(x).unwrap());
        assert_eq!(input_grads, [10.0, 40.0, 90.0], "{backend}: input grads");
        p.set_params(&[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(p.forward(), 1.0 + 4.0 + 9.0, "{backend}: after set_params");
        assert_eq!(p.value(p1).unwrap(), 1.0, "{backend}");
    });
}

/// Values that no output nor the loss needs are dropped; params and inputs always stay (so
/// the parameter vector and the input slice keep the graph's numbering).
#[test]
fn dead_nodes_are_dropped_and_leaves_kept() {
    let g = Graph::new();
    let x = g.input();
    let unused_input = g.input();
    let p = g.param(2.0);
    let unused_param = g.param(7.0);
    let kept = p * x;
    let dead = (x.exp() + 1.0).tanh();
    g.set_loss(kept).unwrap();
    let tape = Tape::from_graph(&g).unwrap();
    // x, unused_input, p, unused_param, kept; not exp, 1.0, +, tanh.
    assert_eq!((g.len(), tape.len()), (9, 5));
    on_each_backend(&g, |backend, prog| {
        assert_eq!(prog.tape().len(), 5, "{backend}");
        prog.set_inputs(&[3.0, 4.0]).unwrap();
        forward_backward(prog);
        prog.update(0.5).unwrap();
        assert_eq!(prog.value(unused_input).unwrap(), 4.0, "{backend}");
        assert_eq!(prog.grad(unused_param).unwrap(), 0.0, "{backend}");
        assert_eq!(
            prog.value(unused_param).unwrap(),
            7.0,
            "{backend}: no gradient, no change"
        );
        assert_eq!(
            prog.value(dead),
            Err(Error::NotOnTape { node: dead.id() }),
            "{backend}"
        );
    });
}

/// Any value on the tape can be read after forward and backward, not just outputs and loss;
/// one the loss does not depend on has gradient 0.
#[test]
fn intermediate_values_and_gradients_can_be_read() {
    let g = Graph::new();
    let x = g.input();
    let p = g.param(0.5);
    let hidden = (p * x).tanh();
    let loss = hidden * hidden;
    let side_output = hidden + 100.0;
    g.add_output(side_output).unwrap();
    g.set_loss(loss).unwrap();
    on_each_backend(&g, |backend, prog| {
        prog.set_inputs(&[2.0]).unwrap();
        forward_backward(prog);
        let h = 1.0f64.tanh();
        close(
            &format!("{backend}: hidden"),
            prog.value(hidden).unwrap(),
            h,
        );
        close(
            &format!("{backend}: dloss/dhidden"),
            prog.grad(hidden).unwrap(),
            2.0 * h,
        );
        close(
            &format!("{backend}: side output"),
            prog.outputs()[0],
            h + 100.0,
        );
        assert_eq!(
            prog.grad(side_output).unwrap(),
            0.0,
            "{backend}: outside the loss"
        );
        assert_eq!(prog.values().len(), prog.tape().len(), "{backend}");
        assert_eq!(prog.grads().len(), prog.tape().len(), "{backend}");
    });
}

/// The last `set_loss` wins.
#[test]
fn set_loss_replaces_the_earlier_loss() {
    let g = Graph::new();
    let p = g.param(3.0);
    g.set_loss(p * p).unwrap();
    g.set_loss(p * 10.0).unwrap();
    on_each_backend(&g, |backend, prog| {
        assert_eq!(prog.forward(), 30.0, "{backend}");
        prog.backward().unwrap();
        assert_eq!(prog.param_grads(), &[10.0], "{backend}");
    });
}

/// A program is a snapshot: building on the graph afterwards does not change it.
#[test]
fn a_program_ignores_later_changes_to_its_graph() {
    let g = Graph::new();
    let x = g.input();
    g.add_output(x * 2.0).unwrap();
    let mut programs: Vec<(&str, Box<dyn Program>)> = semantics_backends()
        .into_iter()
        .map(|(name, compile)| (name, compile(&g)))
        .collect();
    let later = x * 3.0;
    g.add_output(later).unwrap();
    g.set_loss(later).unwrap();
    for (backend, p) in &mut programs {
        p.set_inputs(&[1.0]).unwrap();
        p.forward();
        assert_eq!(p.outputs(), [2.0], "{backend}");
        assert_eq!(p.loss(), Err(Error::NoLoss), "{backend}");
    }
}

/// Two programs of one graph own separate buffers.
#[test]
fn programs_of_the_same_graph_are_independent() {
    let g = Graph::new();
    let x = g.input();
    let p = g.param(1.0);
    g.set_loss(p * x).unwrap();
    let mut first = Jit::compile(&g).unwrap();
    let mut second = Jit::compile(&g).unwrap();
    first.set_params(&[2.0]).unwrap();
    first.set_inputs(&[10.0]).unwrap();
    second.set_inputs(&[10.0]).unwrap();
    assert_eq!(first.forward(), 20.0);
    assert_eq!(second.forward(), 10.0);
    drop(first);
    second.backward().unwrap();
    assert_eq!(second.param_grads(), &[10.0]);
}

#[test]
fn sum_takes_slices_vecs_and_iterators() {
    let g = Graph::new();
    let xs = g.inputs(3);
    let by_slice = g.sum(&xs);
    let by_vec = g.sum(xs.clone());
    let by_iter = g.sum(xs.iter().map(|&x| x * x));
    let empty = g.sum(Vec::<Value>::new());
    for v in [by_slice, by_vec, by_iter, empty] {
        g.add_output(v).unwrap();
    }
    for (backend, compile) in semantics_backends() {
        let mut program = compile(&g);
        program.set_inputs(&[1.0, 2.0, 3.0]).unwrap();
        program.forward();
        assert_eq!(program.outputs(), [6.0, 6.0, 14.0, 0.0], "{backend}");
    }
}
