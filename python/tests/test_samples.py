"""A compiled program's ``train`` and ``train_minibatches`` on samples as they are stored
(uint8 with ``divide``, float32, labels one-hot, an ``order`` of rows): the bits of the same
calls on the numbers converted to float64 in Python."""

import random

import numpy as np
import pytest

import tapejit
from tapejit import Value

PIXELS, CLASSES = 6, 3


def classifier(seed=3):
    """A small classifier: PIXELS inputs, then the label one-hot, a cross-entropy loss."""
    random.seed(seed)
    model = tapejit.nn.MLP(PIXELS, [5, CLASSES])
    x = [Value(0.0) for _ in range(PIXELS)]
    y = [Value(0.0) for _ in range(CLASSES)]
    logits = model(x)
    exps = [l.exp() for l in logits]
    total = sum(exps)
    loss = -sum(t * (e / total).log() for t, e in zip(y, exps))
    return tapejit.compile(loss, inputs=x + y, params=model.parameters(), tiering="off")


def data(rows, seed):
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(rows, PIXELS), dtype=np.uint8)
    pixels[rng.random((rows, PIXELS)) < 0.5] = 0
    labels = rng.integers(0, CLASSES, size=rows)
    return pixels, labels


def as_numbers(pixels, labels, order):
    x = pixels[order].astype(np.float64) / 255.0
    one_hot = np.eye(CLASSES)[labels[order]]
    return np.ascontiguousarray(np.hstack([x, one_hot]))


def test_uint8_labels_and_order_train_as_their_numbers():
    pixels, labels = data(40, 1)
    order = np.random.default_rng(2).permutation(40)
    a, b = classifier(), classifier()
    got = a.train(pixels, 0.1, divide=255.0, labels=labels, classes=CLASSES, order=order)
    want = b.train(as_numbers(pixels, labels, order), 0.1)
    assert got.tobytes() == want.tobytes()
    assert a.params.tobytes() == b.params.tobytes()


@pytest.mark.parametrize("threads", [1, 2])
def test_minibatches_from_uint8_match_their_numbers(threads):
    pixels, labels = data(50, 3)
    order = list(range(50)) + [7, 7, 0]
    a, b = classifier(), classifier()
    got = a.train_minibatches(pixels, 8, 0.1, threads, divide=255.0, labels=labels,
                              classes=CLASSES, order=order)
    want = b.train_minibatches(as_numbers(pixels, labels, order), 8, 0.1, 1)
    assert got.tobytes() == want.tobytes()
    assert a.params.tobytes() == b.params.tobytes()


def test_float32_rows_are_widened():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((10, PIXELS + CLASSES)).astype(np.float32)
    a, b = classifier(), classifier()
    got = a.train(x, 0.05)
    want = b.train(x.astype(np.float64), 0.05)
    assert got.tobytes() == want.tobytes()
    assert a.params.tobytes() == b.params.tobytes()


def test_bad_samples_are_errors_that_change_nothing():
    pixels, labels = data(10, 5)
    p = classifier()
    before = p.params.tobytes()
    with pytest.raises(ValueError, match="not from 0 to 255"):
        p.train(pixels, 0.1, divide=255.0, labels=labels - 1, classes=CLASSES)
    with pytest.raises(ValueError, match="is not one of 3 classes"):
        p.train(pixels, 0.1, divide=255.0, labels=labels + 3, classes=CLASSES)
    with pytest.raises(ValueError, match="order"):
        p.train(pixels, 0.1, divide=255.0, labels=labels, classes=CLASSES, order=[0, 10])
    with pytest.raises(TypeError, match="go together"):
        p.train(pixels, 0.1, labels=labels)
    with pytest.raises(TypeError, match="uint8"):
        p.train(pixels.astype(np.float64), 0.1, divide=255.0, labels=labels, classes=CLASSES)
    with pytest.raises(ValueError, match="rows of 5"):
        p.train(pixels[:, :5], 0.1, labels=labels, classes=CLASSES)
    with pytest.raises(ValueError, match="byte 0 converts to NaN"):
        p.train(pixels, 0.1, divide=0.0, labels=labels, classes=CLASSES)
    bad = np.zeros((2, PIXELS + CLASSES), dtype=np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match="input 11 is not finite"):
        p.train(bad, 0.1)
    assert p.params.tobytes() == before


def test_an_order_of_booleans_is_refused_not_read_as_rows_0_and_1():
    pixels, labels = data(3, 4)
    with pytest.raises(TypeError, match="flatnonzero"):
        classifier().train(pixels, 0.1, divide=255.0, labels=labels, classes=CLASSES,
                           order=np.array([True, False, True]))


def test_more_threads_than_cores_give_the_same_bits():
    pixels, labels = data(64, 5)
    a, b = classifier(), classifier()
    many = a.train_minibatches(pixels, 8, 0.1, 16, divide=255.0, labels=labels, classes=CLASSES)
    one = b.train_minibatches(pixels, 8, 0.1, 1, divide=255.0, labels=labels, classes=CLASSES)
    assert many.tobytes() == one.tobytes()
    assert a.params.tobytes() == b.params.tobytes()


def test_float32_rows_in_either_byte_order_and_no_rows():
    pixels, labels = data(6, 7)
    rows = as_numbers(pixels, labels, np.arange(6)).astype(np.float32)
    a, b = classifier(), classifier()
    assert (a.train(rows.astype(">f4"), 0.1).tobytes() == b.train(rows, 0.1).tobytes())
    with pytest.raises(ValueError, match="at least one sample"):
        classifier().train(rows[:0], 0.1)
