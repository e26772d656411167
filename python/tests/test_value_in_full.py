"""micrograd's Value in full: what programs written for micrograd do with its values besides
arithmetic, run with only the import changed, checked against micrograd's own engine
(reference_micrograd.py): attributes and weak references on values (and cycles through
attributes freed), data that keeps its Python type where micrograd's does, and a newer
micrograd-style program (AdamW state on the params) on both engines."""

import gc
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
