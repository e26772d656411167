"""tapejit's Value against micrograd's (the reference engine beside this file): the same
numbers from the same code, whether `backward` runs on the interpreter (a structure's first
sight) or as native code (every later rebuild), and micrograd's conventions (repr, `_op`,
`_prev`, gradients that add up until zeroed)."""

import math
import random

import pytest

import reference_micrograd as micrograd
import tapejit
from tapejit import Value


def moons_loss(V, model, X, y):
    """micrograd's demo loss (SVM max-margin, mean, L2), written against the Value class `V`."""
    inputs = [list(map(V, row)) for row in X]
    scores = list(map(model, inputs))
    losses = [(1 + -yi * si).relu() for yi, si in zip(y, scores)]
    data_loss = sum(losses) * (1.0 / len(losses))
    reg_loss = 1e-4 * sum((p * p for p in model.parameters()))
    return data_loss + reg_loss


class MicrogradMLP(tapejit.nn.MLP):
    """tapejit.nn's MLP (micrograd's code) on micrograd's own Value, with the same params."""

    def __init__(self, like):
        self.layers = like.layers
        self._params = [micrograd.Value(p.data) for p in like.parameters()]
        self._model = like

    def parameters(self):
        return self._params

    def __call__(self, x):
        # micrograd's forward, with this model's params in place of the tapejit ones.
        ps = iter(self._params)
        for i, layer in enumerate(self._model.layers):
            out = []
            for n in layer.neurons:
                w = [next(ps) for _ in n.w]
                b = next(ps)
                act = sum((wi * xi for wi, xi in zip(w, x)), b)
                out.append(act.relu() if n.nonlin else act)
            x = out[0] if len(out) == 1 else out
        return x


def data(n, seed):
    rng = random.Random(seed)
    X = [[rng.uniform(-2, 2), rng.uniform(-2, 2)] for _ in range(n)]
    y = [1 if a * b > 0 else -1 for a, b in X]
    return X, y


def close(a, b):
    return a == b or abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


def test_moons_training_matches_micrograd_on_the_interpreter_and_then_natively():
    random.seed(3)
    model = tapejit.nn.MLP(2, [8, 8, 1])
    reference = MicrogradMLP(model)
    X, y = data(20, 5)
    for step in range(4):
        loss = moons_loss(Value, model, X, y)
        want = moons_loss(micrograd.Value, reference, X, y)
        # The forward pass is the same arithmetic in the same order: the same bits.
        assert loss.data == want.data, f"step {step}"
        model.zero_grad()
        for p in reference.parameters():
            p.grad = 0
        loss.backward()
        want.backward()
        # micrograd adds gradients in its own order (its operands are a set): close, and
        # the same where a gradient has one term.
        for p, q in zip(model.parameters(), reference.parameters()):
            assert close(p.grad, q.grad), f"step {step}: {p.grad} vs {q.grad}"
        # Both go on from the same params (ours), so each step's forward is exact again.
        for p, q in zip(model.parameters(), reference.parameters()):
            p.data -= 0.1 * p.grad
            q.data = p.data


def test_a_rebuilt_graph_gets_the_same_gradients_natively_as_on_the_interpreter():
    random.seed(4)
    model = tapejit.nn.MLP(3, [5, 1])
    X, y = data(6, 7)
    X = [row + [0.5] for row in X]
    grads = []
    for _ in range(3):  # first sight (interpreter), second (compiled), third (cached)
        model.zero_grad()
        moons_loss(Value, model, X, y).backward()
        grads.append([p.grad for p in model.parameters()])
    assert grads[0] == grads[1] == grads[2]


def test_every_node_gets_its_gradient_including_fused_products():
    # A neuron's products are fused into its sum by the JIT, which does not store them;
    # backward still gives each its gradient (the second build runs natively).
    for _ in range(2):
        w = [Value(0.5), Value(-0.25), Value(2.0)]
        x = [Value(1.5), Value(-2.0), Value(0.75)]
        products = [wi * xi for wi, xi in zip(w, x)]
        act = sum(products, Value(0.1)).tanh()
        act.backward()
        g = 1 - act.data ** 2
        for p in products:
            assert p.grad == g
        for wi, xi in zip(w, x):
            assert wi.grad == xi.data * g and xi.grad == wi.data * g


def test_gradients_add_up_until_zeroed_and_the_root_is_set_to_one():
    x = Value(3.0)
    y = x * x
    y.backward()
    assert x.grad == 6.0 and y.grad == 1.0
    y.backward()
    assert x.grad == 12.0 and y.grad == 1.0
    x.grad = 0
    y.backward()
    assert x.grad == 6.0
    leaf = Value(2.0)
    leaf.backward()
    assert leaf.grad == 1.0


def test_unary_ops_are_the_math_modules():
    # tanh, exp and log are tapejit's own (formulas of ours, the same on every backend): within
    # a few ULP (exp, log: one) of the math module's, which they match on most inputs.
    for x in [0.7, -0.3, 0.05, 2.5, -1e-9]:
        for name, f, df, ulps in [
            ("tanh", math.tanh, lambda x: 1 - math.tanh(x) ** 2, 3),
            ("exp", math.exp, math.exp, 1),
            ("log", math.log, lambda x: 1 / x, 1),
            ("relu", lambda x: max(0.0, x), lambda x: float(x > 0), 0),
        ]:
            if name == "log" and x <= 0:
                continue
            v = Value(x)
            out = getattr(v, name)()
            assert abs(out.data - f(x)) <= ulps * math.ulp(f(x)), (name, x)
            out.backward()
            assert close(v.grad, df(x)), (name, x)


def test_operators_build_what_micrograd_builds():
    a, b = Value(3.0), Value(-1.5)
    cases = [
        (lambda u, v: u + v, None),
        (lambda u, v: u - v, None),
        (lambda u, v: u * v, None),
        (lambda u, v: u / v, None),
        (lambda u, v: -u, None),
        (lambda u, v: 2 - u, None),
        (lambda u, v: 2 / u, None),
        (lambda u, v: 2 * u + 1, None),
        (lambda u, v: u ** 3, None),
        (lambda u, v: u ** 0.5, None),
        (lambda u, v: (u * v).relu(), None),
    ]
    for build, _ in cases:
        ours = build(a, b)
        theirs = build(micrograd.Value(3.0), micrograd.Value(-1.5))
        assert ours.data == theirs.data
        assert ours._op == theirs._op
        assert len(ours._prev) == len(theirs._prev)


def test_repr_and_attributes():
    v = Value(2.0)
    assert repr(v) == "Value(data=2.0, grad=0.0)"
    w = v * 3
    assert w._op == "*" and v in w._prev
    assert (v ** 2)._op == "**2" and (v ** 0.5)._op == "**0.5" and v._op == ""
    v.data = 5.0
    v.grad = -1.0
    assert (v.data, v.grad) == (5.0, -1.0)
    assert repr(Value(1e-5)) == repr(micrograd.Value(1e-5)).replace("grad=0", "grad=0.0")


def test_misuse_is_a_python_exception():
    with pytest.raises(TypeError):
        Value(2.0) ** Value(2.0)
    with pytest.raises(TypeError):
        Value(2.0) + "a"
    with pytest.raises(TypeError):
        Value("a")
    with pytest.raises(TypeError, match="children are Values"):
        Value(1.0, (2.0,), "op")
    # A NaN or infinite leaf: the tape refuses it, with tapejit's message.
    x = Value(float("nan"))
    with pytest.raises(ValueError, match="not finite"):
        (x * 2).backward()


def test_a_chain_deeper_than_the_stack_builds_differentiates_and_frees():
    # Freeing a value frees its operands: a chain of 300,000 (x = x + 1 in a loop) would
    # recurse that deep, so values are released from a list instead.
    x = leaf = Value(1.0)
    for _ in range(300_000):
        x = x * 1.0 + 1.0
    x.backward()
    assert x.data == 300_001.0 and leaf.grad == 1.0
    del x
    assert repr(leaf) == "Value(data=1.0, grad=1.0)"


def test_made_values_are_left_to_reference_counting_not_the_cycle_collector():
    # A value refers only to operands made before it, so values never form a cycle: the
    # collector skips them (it used to traverse a graph's values at every collection, half
    # of a drop-in step), and freeing still works by reference counts alone.
    import gc
    import sys

    x = Value(2.0)
    y = (x * 3 + 1) ** 2 - x / 4
    assert not gc.is_tracked(y) and not gc.is_tracked((-x).relu())
    before = sys.getrefcount(x)
    for _ in range(1000):
        z = (x * x + 1).tanh()
        del z
    gc.collect()
    assert sys.getrefcount(x) == before
    y.backward()
    assert y.data == 48.5 and x.grad == 41.75


@pytest.mark.parametrize("first,second", [(-2, 2), (2, -2), (3.0, 3.0000000000000004), (2, 0.5)])
def test_the_cache_tells_every_exponent_apart(first, second):
    """A structure is keyed by each op's every bit: `x ** c` compiled (seen twice) for one
    exponent is not run for another that differs only in sign or in its last mantissa bits."""
    for _ in range(3):
        x = Value(2.0)
        (x ** first).backward()
    x = Value(2.0)
    y = x ** second
    y.backward()
    want = micrograd.Value(2.0)
    (want ** second).backward()
    assert x.grad == pytest.approx(want.grad, rel=1e-12)
    assert y.data == pytest.approx((want ** second).data, rel=1e-12)
