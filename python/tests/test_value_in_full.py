"""micrograd's Value in full: what programs written for micrograd do with its values besides
arithmetic, run with only the import changed. Attributes and weak references on values (and
cycles through attributes freed), copy, deepcopy and pickle of values and of tapejit.nn
models (a chain deeper than Python's recursion too), data that keeps its Python type where
micrograd's does, and micrograd's way of adding an op (`Value(data, children, op)` with a
Python `_backward`), checked against micrograd's own engine (reference_micrograd.py)."""

import copy
import gc
import math
import pickle
import random
import weakref

import pytest

import reference_micrograd as micrograd
import tapejit
from tapejit import Value


# Attributes, weak references and the cycle collector.


def test_attributes_and_weak_references():
    v = Value(2.0)
    v.m = 0
    v._vis_color = "red"
    assert (v.m, v._vis_color) == (0, "red")
    assert vars(v) == {"m": 0, "_vis_color": "red"}
    del v.m
    assert not hasattr(v, "m")
    w = (v * 3).relu()
    w.label = "w"
    assert w.label == "w" and w.data == 6.0
    r = weakref.ref(w)
    assert r() is w
    del w
    assert r() is None
    with pytest.raises(AttributeError):
        v._op = "x"


def test_attributes_track_a_value_for_the_cycle_collector_and_only_then():
    # Values nobody sets attributes on stay untracked (the drop-in's speed); the first
    # attribute tracks the value, and a value set as an attribute is tracked with its graph.
    x = Value(2.0)
    y = (x * 3 + 1).relu()
    z = y * y
    assert not gc.is_tracked(y) and not gc.is_tracked(z)
    y.note = "hidden"
    assert gc.is_tracked(y) and not gc.is_tracked(z)
    x.later = z
    assert gc.is_tracked(z)
    # The properties set in every training step track nothing.
    u = x * 2
    u.grad = 0
    u.data = 1.5
    assert not gc.is_tracked(u)


@pytest.mark.parametrize("shape", ["itself", "a value made of it", "deep", "both ways"])
def test_a_cycle_through_an_attribute_is_collected(shape):
    gc.collect()
    a = Value(1.0) * 2
    if shape == "itself":
        a.me = a
    elif shape == "a value made of it":
        a.partner = (a + 1).tanh()
    elif shape == "deep":
        b = a
        for _ in range(1000):
            b = b * 1.0 + 1.0
        a.descendant = b
        del b
    else:
        b = a * 3
        a.child, b.parent = b, a
        del b
    alive = weakref.ref(a)
    del a
    gc.collect()
    assert alive() is None


def test_a_custom_ops_closure_cycle_is_collected():
    # micrograd's idiom: out._backward is a closure over out itself.
    x = Value(0.5)
    out = Value(math.sin(x.data), (x,), "sin")

    def _backward():
        x.grad += math.cos(x.data) * out.grad

    out._backward = _backward
    alive = weakref.ref(out)
    del out, _backward
    gc.collect()
    assert alive() is None


# Data keeps its Python type where micrograd's does.


CASES = [
    lambda V: V(1),
    lambda V: V(1) + 2,
    lambda V: V(1) + 2.0,
    lambda V: 2 * V(3) - 1,
    lambda V: -V(3),
    lambda V: V(3) - V(5),
    lambda V: V(2) ** 2,
    lambda V: V(2) ** 0,
    lambda V: V(2) ** 2.0,
    lambda V: V(2) ** -1,
    lambda V: V(6) / 3,
    lambda V: 6 / V(3),
    lambda V: V(-2).relu(),
    lambda V: V(-2.5).relu(),
    lambda V: V(2.5).relu(),
    lambda V: V(-0.0).relu(),
    lambda V: V(3).relu(),
    lambda V: sum([V(1), V(2), V(3)]),
    lambda V: sum([V(1), V(2.0), V(3)]),
    lambda V: V(1.5) * 2,
    lambda V: V(True) + 1,
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_data_has_micrograds_type(case):
    build = CASES[case]
    ours, theirs = build(Value).data, build(micrograd.Value).data
    assert ours == theirs and type(ours) is type(theirs), (ours, theirs)
    assert repr(build(Value)).startswith(f"Value(data={theirs!r},")


def test_data_set_keeps_the_type_given_and_micrograds_float_ops_give_floats():
    v = Value(1.5)
    v.data = 4
    assert v.data == 4 and type(v.data) is int
    assert type((v * 2).data) is int
    v.data -= 0.5
    assert type(v.data) is float
    for y in [Value(2).tanh(), Value(2).exp(), Value(2).log(), Value(4) ** 0.5]:
        assert type(y.data) is float


def test_an_int_beyond_2_to_the_53_is_held_as_a_float():
    # The tape computes in f64, which holds every int below 2^53 exactly: data reads as an
    # int there, and as the nearest float beyond (documented in number.rs).
    big = 2**53 - 1
    assert Value(big).data == big and type(Value(big).data) is int
    assert type(Value(2**53).data) is float and Value(2**60).data == float(2**60)
    assert type((Value(2**52) * 4).data) is float
    assert type((Value(2**26) * 2**26).data) is int


def test_gradients_are_the_same_with_int_data():
    x, y = Value(3), Value(3.0)
    (x * x + 2 * x).backward()
    (y * y + 2 * y).backward()
    assert x.grad == y.grad == 8.0


# copy, deepcopy and pickle.


def graph_of(v):
    return [(n.data, type(n.data), n.grad, n._op) for n in v.topo()]


def built():
    x, w = Value(3), Value(-0.5)
    y = ((x * w + 1) ** 2 + x.relu() / 4).tanh()
    y.color = "blue"
    x.name = "x"
    y.backward()
    return x, w, y


def test_copy_shares_the_operands_and_copies_the_attributes():
    x, w, y = built()
    c = copy.copy(y)
    assert c is not y and (c.data, c.grad, c._op) == (y.data, y.grad, y._op)
    assert c._prev == y._prev and c.color == "blue"
    c.color = "red"
    assert y.color == "blue"


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_graph_copies_whole(how):
    x, w, y = built()
    if how == "deepcopy":
        c = copy.deepcopy(y)
    else:
        c = pickle.loads(pickle.dumps(y))
    assert graph_of(c) == graph_of(y)
    assert c.color == "blue"
    leaves = {n.__dict__.get("name"): n for n in c.topo() if n._op == ""}
    assert leaves["x"] is not x and leaves["x"].name == "x"
    # The copy is a graph of its own: backward on it gives the original's gradients.
    for n in c.topo():
        n.grad = 0
    c.backward()
    assert graph_of(c) == graph_of(y)
    assert x.grad == leaves["x"].grad


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_values_keep_their_identity_through_a_copy(how):
    x = Value(2.0)
    y = x * x  # one operand, twice
    z = y + x
    if how == "deepcopy":
        x2, y2, z2 = copy.deepcopy([x, y, z])
    else:
        x2, y2, z2 = pickle.loads(pickle.dumps([x, y, z]))
    assert y2._prev == {x2} and z2._prev == {y2, x2}
    z2.backward()
    assert x2.grad == 5.0 and x.grad == 0.0


def test_a_chain_deeper_than_the_stack_pickles_and_copies():
    x = leaf = Value(1.0)
    for _ in range(100_000):
        x = x + 1
    middle = x
    for _ in range(1000):
        x = x * 1.0
    for c in [pickle.loads(pickle.dumps(x)), copy.deepcopy(x)]:
        assert c.data == 100_001.0 and type(c.data) is float
        c.backward()
        assert c.grad == 1.0
    # Each pickle is its own: a value saved inside another's graph pickles whole later too,
    # and after a pickle that failed.
    x.unpicklable = lambda: None
    with pytest.raises(Exception):
        pickle.dumps(x)
    assert pickle.loads(pickle.dumps(middle)).data == 100_001.0
    assert copy.copy(x)._prev == x._prev and leaf.grad == 0.0


def mlp(seed):
    random.seed(seed)
    return tapejit.nn.MLP(3, [4, 4, 1])


def moons_like(n, seed):
    rng = random.Random(seed)
    X = [[rng.uniform(-1, 1) for _ in range(3)] for _ in range(n)]
    y = [1 if a * b + c > 0 else -1 for a, b, c in X]
    return X, y


def train(model, X, y, steps):
    losses = []
    for k in range(steps):
        scores = [model(list(map(Value, row))) for row in X]
        loss = sum((1 + -yi * s).relu() for yi, s in zip(y, scores)) * (1.0 / len(X))
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            p.data -= 0.1 * p.grad
        losses.append(loss.data)
    return losses


def test_a_deep_copied_model_trains_independently():
    X, y = moons_like(12, 1)
    model = mlp(2)
    before = [p.data for p in model.parameters()]
    twin = copy.deepcopy(model)
    assert [p.data for p in twin.parameters()] == before
    assert not set(map(id, twin.parameters())) & set(map(id, model.parameters()))
    copied = train(twin, X, y, 4)
    assert [p.data for p in model.parameters()] == before
    assert train(model, X, y, 4) == copied
    assert [p.data for p in model.parameters()] == [p.data for p in twin.parameters()]


def test_a_pickled_model_gives_the_same_outputs_and_gradients():
    X, y = moons_like(8, 3)
    model = mlp(4)
    train(model, X, y, 2)
    loaded = pickle.loads(pickle.dumps(model))
    assert repr(loaded) == repr(model)
    assert type(loaded.layers[0].neurons[0].b.data) is type(model.layers[0].neurons[0].b.data)
    for m in (model, loaded):
        m.zero_grad()
        out = [m(list(map(Value, row))) for row in X]
        sum(out).backward()
        m.outputs = [o.data for o in out]
    assert loaded.outputs == model.outputs
    assert [p.grad for p in loaded.parameters()] == [p.grad for p in model.parameters()]


# micrograd's way of adding an op.


def sin(self):
    """An op added as micrograd adds one, for whichever Value class `self` is."""
    out = type(self)(math.sin(self.data), (self,), "sin")

    def _backward():
        self.grad += math.cos(self.data) * out.grad

    out._backward = _backward
    return out


def clamp_sum(*values):
    """A three-operand op (micrograd's children are any number)."""
    V = type(values[0])
    out = V(max(-1.0, min(1.0, sum(v.data for v in values))), values, "clamp_sum")

    def _backward():
        inside = -1.0 < out.data < 1.0
        for v in values:
            v.grad += inside * out.grad

    out._backward = _backward
    return out


def custom_graph(V):
    x, w, b = V(0.5), V(-1.5), V(0.25)
    h = sin(x * w + b) * x
    y = clamp_sum(h, x.relu(), b * b) ** 2 + sin(h)
    return y, [x, w, b]


def test_a_graph_with_a_python_backward_runs_micrograds_algorithm():
    for _ in range(3):  # never cached: every backward runs the program's functions
        ours, our_leaves = custom_graph(Value)
        theirs, their_leaves = custom_graph(micrograd.Value)
        assert ours.data == theirs.data
        ours.backward()
        theirs.backward()
        for p, q in zip(our_leaves, their_leaves):
            assert p.grad == pytest.approx(q.grad, rel=1e-12, abs=1e-15)
        assert ours._op == "+" and {v._op for v in ours.topo()} >= {"sin", "clamp_sum", "**2"}


def test_a_backward_set_on_a_built_in_value_is_the_one_that_runs():
    calls = []
    x = Value(2.0)
    y = x * 3
    y._backward = lambda: calls.append(y.grad)
    z = y + 1
    z.backward()
    assert calls == [1.0] and x.grad == 0.0
    del y._backward
    x.grad = 0
    z.backward()
    assert x.grad == 3.0


def test_topo_is_micrograds_order_and_backward_readable_on_every_value():
    x, w = Value(0.5), Value(3.0)
    y = (x * w + 1).tanh() * x
    order = y.topo()
    assert order[-1] is y and len(order) == 7 and len(set(map(id, order))) == 7
    position = {id(v): k for k, v in enumerate(order)}
    assert all(position[id(c)] < position[id(v)] for v in order for c in v._prev)
    # micrograd's backward written out by hand, with each value's own _backward.
    for v in order:
        v.grad = 0
    y.grad = 1
    for v in reversed(order):
        v._backward()
    by_hand = (x.grad, w.grad)
    x.grad = w.grad = 0
    y.backward()
    assert (x.grad, w.grad) == pytest.approx(by_hand, rel=1e-15)
    assert x._backward() is None and "_backward of Value" in repr(y._backward)


def test_compile_refuses_a_python_backward_and_draw_dot_names_the_op():
    y, leaves = custom_graph(Value)
    with pytest.raises(ValueError, match="Python function.*op \"sin\"|op \"clamp_sum\""):
        tapejit.compile(y, inputs=leaves[:1])
    dot = tapejit.draw_dot(y).source
    assert "{ sin |" in dot and "{ clamp_sum |" in dot and "{ + (root) |" in dot
    nodes = y.topo()
    assert dot.count("[label=") == len(nodes) == 13
    # An edge per operand: `b * b` has two, its _prev one.
    assert dot.count("->") == sum(len(v._prev) for v in nodes) + 1


def test_a_deep_chain_of_custom_nodes_runs_and_frees():
    x = leaf = Value(1.0)
    for _ in range(20_000):
        x = sin(x)
    x.backward()
    assert 0 < leaf.grad < 1
    alive = weakref.ref(x)
    del x
    gc.collect()
    assert alive() is None
    # Without closures (no cycles), freed by reference counts, as deep as the stack is not.
    x = Value(1.0)
    for _ in range(300_000):
        x = Value(x.data, (x,), "id")
    x.backward()
    alive = weakref.ref(x)
    del x
    assert alive() is None


def _double_backward():
    """A module-level `_backward` (picklable, unlike a closure)."""


def test_a_custom_node_copies_and_pickles_with_its_backward():
    x = Value(3)
    out = Value(6, (x,), "double")
    out._backward = _double_backward
    out.note = "kept"
    for c in [pickle.loads(pickle.dumps(out)), copy.deepcopy(out)]:
        assert (c.data, c._op, c.note, c._backward) == (6, "double", "kept", _double_backward)
        assert [v.data for v in c._prev] == [3] and next(iter(c._prev)) is not x
    with pytest.raises(AttributeError, match="none was set"):
        del Value(1.0, (x,), "op")._backward


# A newer micrograd program, on both engines.


def adamw_program(V, steps=6, show=False):
    """An MLP trained with AdamW written in pure Python on the Values, as newer micrograd
    programs are: optimizer state (`p.m`, `p.v`) and colors set as attributes on each param,
    the loss built as a running sum. Runs on any micrograd-like Value class `V`; returns the
    losses."""
    rng = random.Random(7)
    sizes = [2, 6, 6, 1]
    layers = [[([V(rng.uniform(-1, 1)) for _ in range(nin)], V(0)) for _ in range(nout)]
              for nin, nout in zip(sizes, sizes[1:])]
    params = [p for layer in layers for w, b in layer for p in w + [b]]
    for p in params:
        p.m = 0
        p.v = 0
        p._vis_color = "lightblue"

    def forward(x):
        for k, layer in enumerate(layers):
            x = [sum((wi * xi for wi, xi in zip(w, x)), b) for w, b in layer]
            if k < len(layers) - 1:
                x = [xi.relu() for xi in x]
        return x[0]

    data = [([rng.uniform(-2, 2), rng.uniform(-2, 2)], rng.choice([-1.0, 1.0])) for _ in range(10)]
    beta1, beta2, eps, lr, weight_decay = 0.9, 0.95, 1e-8, 0.05, 1e-4
    losses = []
    for t in range(1, steps + 1):
        total = V(0.0)
        for x, y in data:
            total = total + (forward([V(xi) for xi in x]) - y) ** 2
        loss = total * (1.0 / len(data))
        loss._vis_color = "red"
        for p in params:
            p.grad = 0
        loss.backward()
        for p in params:
            p.m = beta1 * p.m + (1 - beta1) * p.grad
            p.v = beta2 * p.v + (1 - beta2) * p.grad ** 2
            m_hat = p.m / (1 - beta1 ** t)
            v_hat = p.v / (1 - beta2 ** t)
            p.data -= lr * (m_hat / (v_hat ** 0.5 + eps) + weight_decay * p.data)
        losses.append(loss.data)
        if show:
            print(f"step {t} loss {loss.data}")
    return losses


def test_a_newer_micrograd_program_prints_micrograds_losses():
    ours = adamw_program(Value, show=True)
    theirs = adamw_program(micrograd.Value)
    assert len(ours) == len(theirs) == 6 and ours[-1] < ours[0]
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 1e-9 * abs(b), (a, b)


def test_a_backward_that_wraps_the_old_one_calls_the_ops_own():
    # A hook around a node's backward (`old = v._backward`), or `v._backward = v._backward`:
    # the old one stays micrograd's closure, not whatever `_backward` is set later.
    for wrap in (lambda old: (lambda: old()), lambda old: old):
        a, b = Value(2.0), Value(3.0)
        v = a * b
        v._backward = wrap(v._backward)
        v.backward()
        assert (a.grad, b.grad) == (3.0, 2.0)
