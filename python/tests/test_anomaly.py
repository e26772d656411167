"""Anomaly mode: off by default (NaN flows, as before); on, an op that makes a NaN or an
infinity of finite operands raises at the line that made it, and a non-finite derivative
in backward or in a compiled program's step names the value, its op and operands, and the
file and line that made it. A non-finite leaf is named by its value, not the tape's
numbering."""

import pytest

import tapejit
from tapejit import Value


def test_off_by_default_nan_flows():
    x = Value(-1.0)
    y = x.log()
    assert y.data != y.data


def test_an_op_that_makes_nan_raises_where_it_is_made():
    x = Value(-1.0)
    with tapejit.detect_anomaly():
        with pytest.raises(FloatingPointError, match=r"log of \[-1.0\] gave NaN"):
            x.log()
        with pytest.raises(FloatingPointError, match="exp of"):
            Value(1000.0).exp()
        Value(float("nan")).exp()  # not made here: its operand was not finite
    assert x.log().data != x.log().data  # off again


def test_backward_names_the_value_whose_derivative_is_not_finite_and_where_it_was_made():
    for _ in range(3):  # the interpreter, then native code
        with tapejit.detect_anomaly():
            x = Value(0.0)
            root = (x * 2.0).sqrt()  # this line
            loss = root + x * x
            with pytest.raises(FloatingPointError) as e:
                loss.backward()
        message = str(e.value)
        assert "(sqrt)" in message and "[0.0]" in message, message
        assert f"test_anomaly.py:{root_line()}" in message, message


def root_line():
    import inspect
    source, start = inspect.getsourcelines(test_backward_names_the_value_whose_derivative_is_not_finite_and_where_it_was_made)
    return start + next(i for i, line in enumerate(source) if "# this line" in line)


def test_a_compiled_program_names_the_value_too():
    with tapejit.detect_anomaly():
        x, w = Value(0.0), Value(1.0)
        loss = (w * x).sqrt() + w * w
        program = tapejit.compile(loss, inputs=[x], params=[w])
        with pytest.raises(FloatingPointError, match=r"\(sqrt\).*made at .*test_anomaly.py"):
            program.step([0.0], 0.1)
        assert list(program.params) == [1.0]  # no update after an anomaly
    program.step([0.0], 0.1)  # off: no check


def test_a_non_finite_leaf_is_named_by_its_value():
    x = Value(float("inf"))
    loss = x * 2.0 + Value(1.0)
    with pytest.raises(ValueError, match=r"a leaf of the graph is not finite \(inf\): Value\(data=inf"):
        loss.backward()


def test_the_mode_remembers_the_living_values_only():
    # Each value's site is forgotten when it is dropped: a long run in the mode does not
    # keep every value it ever made.
    import gc
    import resource
    tapejit.set_detect_anomaly(True)
    try:
        def steps(n):
            for _ in range(n):
                x = Value(0.5)
                for _ in range(2000):
                    x = x * 1.0001 + 0.0001
                x.backward()
                del x
                gc.collect()
        steps(5)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        steps(60)
        grown_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown_kb < 20_000, f"{grown_kb} KB kept for 120,000 dropped values"
    finally:
        tapejit.set_detect_anomaly(False)


def test_copies_of_a_value_made_before_the_mode_are_not_checked_again():
    import copy
    import pickle
    big = Value(1e308) * 10  # inf, made with the mode off
    blob = pickle.dumps(big)
    with tapejit.detect_anomaly():
        for copied in (copy.copy(big), copy.deepcopy(big), pickle.loads(blob)):
            assert copied.data == float("inf")
