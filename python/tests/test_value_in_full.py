"""micrograd's Value in full: what programs written for micrograd do with its values besides
arithmetic, run with only the import changed, checked against micrograd's own engine
(reference_micrograd.py): data that keeps its Python type where micrograd's does."""

import pytest

import reference_micrograd as micrograd
import tapejit
from tapejit import Value


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
