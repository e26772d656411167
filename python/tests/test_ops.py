"""The ops beyond micrograd's (softplus, log1p, abs, sin, cos, sqrt, max, min) against the math
module's formulas: each expression built twice, so that backward runs it on the interpreter
(the structure's first sight) and then as native code (its second), with the same numbers;
their names in `_op` and in draw_dot's pictures."""

import math

import pytest

from tapejit import Value, draw_dot


def exp(x):
    # tapejit's e^x, a formula of ours (within 1 ULP of the math module's; +inf from 709.78
    # on, where Python's raises).
    return Value(x).exp().data


def log1p(x):
    # tapejit's log(1 + x), a formula of ours: within 1 ULP of the math module's.
    y = Value(x).log1p().data
    assert abs(y - math.log1p(x)) <= math.ulp(math.log1p(x)), (x, y, math.log1p(x))
    return y


def sin(x):
    # tapejit's sin, a formula of ours (libm's beyond 2^20): within 1 ULP of the math module's.
    y = Value(x).sin().data
    assert abs(y - math.sin(x)) <= math.ulp(math.sin(x)), (x, y, math.sin(x))
    return y


def cos(x):
    # tapejit's cos, likewise.
    y = Value(x).cos().data
    assert abs(y - math.cos(x)) <= math.ulp(math.cos(x)), (x, y, math.cos(x))
    return y


def softplus(x):
    # The stable formula tapejit computes, one IEEE operation (or call) at a time.
    return max(x, 0.0) + log1p(exp(-abs(x)))


def sigmoid(x):
    return 1 / (1 + exp(-x))


def sign(x):
    return float((x > 0) - (x < 0))


# name, value, derivative, where it is defined. Every formula is the same operations tapejit
# performs (tapejit's sin, cos, exp and log1p; IEEE's square root): equal to the bit.
UNARY = [
    ("softplus", softplus, sigmoid, lambda x: True),
    ("log1p", log1p, lambda x: 1 / (1 + x), lambda x: x > -1),
    ("abs", abs, sign, lambda x: True),
    ("sin", sin, cos, lambda x: True),
    ("cos", cos, lambda x: -sin(x), lambda x: True),
    ("sqrt", math.sqrt, lambda x: 0.5 / math.sqrt(x), lambda x: x > 0),
]

POINTS = [0.7, -0.3, 2.5, -1e-9, 1e-20, 40.0, -40.0, 1000.0, -1000.0, 1e22, -0.99]

# Powers of two to scale by: up to 2^500, which keeps every number here normal.
_structures = iter(range(1, 500))


def twice(build, *leaves):
    """`build` on fresh leaves of the given data, twice: first on the interpreter, then natively
    (scaled by a power of two of its own, exact, so that no other test's structure is the same).
    Yields each build's root and leaves after backward."""
    scale = 2.0 ** next(_structures)
    for _ in range(2):
        xs = [Value(x) for x in leaves]
        out = build(*xs)
        (out * scale).backward()
        yield out, [x.grad / scale for x in xs]


def same(a, b):
    return a == b or (math.isnan(a) and math.isnan(b))


@pytest.mark.parametrize("name,f,df,defined", UNARY, ids=[u[0] for u in UNARY])
def test_unary_ops_are_the_math_modules_on_the_interpreter_and_natively(name, f, df, defined):
    for x in filter(defined, POINTS):
        for out, [grad] in twice(lambda v: getattr(v, name)(), x):
            assert same(out.data, f(x)), (name, x, out.data, f(x))
            assert same(grad, df(x)), (name, x, grad, df(x))
            assert out._op == name


def test_softplus_is_finite_and_right_far_out():
    for x, want, slope in [(1000.0, 1000.0, 1.0), (-1000.0, 0.0, 0.0), (-700.0, math.exp(-700), math.exp(-700))]:
        for out, [grad] in twice(Value.softplus, x):
            assert math.isfinite(out.data) and math.isfinite(grad)
            assert out.data == pytest.approx(want, rel=1e-15) and grad == pytest.approx(slope, rel=1e-15)


def test_abs_of_minus_zero_is_plus_zero_and_passes_no_gradient():
    for out, [grad] in twice(abs, -0.0):
        assert out.data == 0.0 and math.copysign(1.0, out.data) == 1.0
        assert grad == 0.0
    assert abs(Value(-2.5)).data == 2.5 and abs(Value(-2.5))._op == "abs"


def test_sqrt_is_the_half_power():
    for x in [2.0, 0.3, 1e-310, 1e300]:
        for (by_sqrt, [d_sqrt]), (by_pow, [d_pow]) in zip(twice(Value.sqrt, x), twice(lambda v: v**0.5, x)):
            assert by_sqrt.data == by_pow.data and d_sqrt == d_pow
    assert math.copysign(1.0, Value(-0.0).sqrt().data) == 1.0  # pow's +0, not IEEE's -0


# a, b, the picked value, and the gradients of a and b.
PAIRS = {
    "max": [(3.0, 1.0, 3.0, 1.0, 0.0), (1.0, 3.0, 3.0, 0.0, 1.0), (2.0, 2.0, 2.0, 1.0, 0.0)],
    "min": [(3.0, 1.0, 1.0, 0.0, 1.0), (1.0, 3.0, 1.0, 1.0, 0.0), (2.0, 2.0, 2.0, 1.0, 0.0)],
}


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_and_min_of_values_and_numbers_give_the_gradient_to_the_one_picked(name):
    for a, b, picked, da, db in PAIRS[name]:
        # Two values: on a tie, self is picked and takes the gradient.
        for out, grads in twice(lambda u, v: getattr(u, name)(v), a, b):
            assert out.data == picked and grads == [da, db], (name, a, b)
            assert out._op == name
        # A value and a number.
        for out, [grad] in twice(lambda u: getattr(u, name)(b), a):
            assert out.data == picked and grad == da, (name, a, b)
        for out, [grad] in twice(lambda u: getattr(u, name)(int(b)), a):
            assert out.data == picked and grad == da, (name, a, b)
    with pytest.raises(TypeError):
        getattr(Value(1.0), name)("a")


def test_draw_dot_names_the_new_ops():
    x, y = Value(0.5), Value(-1.5)
    root = x.softplus() + x.log1p() + abs(y) + x.sin() + x.cos() + x.sqrt() + x.max(y) + x.min(y)
    root.backward()
    dot = draw_dot(root).source
    for name in ["softplus", "log1p", "abs", "sin", "cos", "sqrt", "max", "min"]:
        assert f"{{ {name} | data" in dot, name


def test_minus_infinity_to_the_power_minus_one_and_a_half_is_plus_zero():
    # C's pow(-inf, y) for y < 0 not an odd integer, as for -2.5 and -0.5.
    for c in (-1.5, -2.5, -0.5):
        assert math.copysign(1.0, (Value(float("-inf")) ** c).data) == 1.0
        assert (Value(float("-inf")) ** c).data == math.pow(float("-inf"), c) == 0.0


def test_generators_refuse_sizes_they_cannot_make():
    import tapejit
    with pytest.raises(OverflowError):
        tapejit.datasets.micrograd_params([2**62, 2**62], 1)
    with pytest.raises(MemoryError):
        tapejit.datasets.micrograd_params([10, 10**15], 1)
    with pytest.raises(OverflowError):
        tapejit.datasets.make_moons(2**62)


def test_repr_is_pythons_where_two_shortest_forms_tie():
    for x in (-233891771783429.62, -637637799964508.2, 0.1, 1e16, 5e-324):
        assert repr(Value(x)) == f"Value(data={x!r}, grad=0.0)"
