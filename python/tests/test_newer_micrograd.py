"""A newer micrograd program, written for micrograd: a 3-class MLP trained with AdamW whose
state lives on each param (`p.m`, `p.v`), values coloured for a picture by an attribute,
the loss a running sum from `Value(0.0)`. With only the import changed it prints
micrograd's losses (relative difference < 1e-9); the same training compiled with
tapejit.optim.AdamW (its state in the program) prints them too."""

import math
import random

import numpy as np

import importlib.util
import pathlib

import tapejit


def newer_micrograd():
    """micrograd's engine (reference_micrograd.py, a fresh copy of the module) with `exp` and
    `log` as later micrograd versions add them."""
    path = pathlib.Path(__file__).with_name("reference_micrograd.py")
    spec = importlib.util.spec_from_file_location("newer_micrograd", path)
    engine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(engine)
    Value = engine.Value

    def exp(self):
        out = Value(math.exp(self.data), (self,), "exp")

        def _backward():
            self.grad += out.data * out.grad
        out._backward = _backward
        return out

    def log(self):
        out = Value(math.log(self.data), (self,), "log")

        def _backward():
            self.grad += (1 / self.data) * out.grad
        out._backward = _backward
        return out

    Value.exp, Value.log = exp, log
    return Value

STEPS = 30
LR, BETAS, EPS, WD = 0.05, (0.9, 0.95), 1e-8, 1e-4


def dataset(n=24, seed=7):
    """Three blobs in the plane: points and their classes."""
    rng = random.Random(seed)
    centers = [(0.0, 1.0), (-0.9, -0.5), (0.9, -0.5)]
    points = []
    for i in range(n):
        k = i % 3
        points.append(([centers[k][0] + rng.gauss(0, 0.35), centers[k][1] + rng.gauss(0, 0.35)], k))
    return points


class MLP:
    """The program's own model: relu layers, a linear last one (micrograd's nn, inlined as
    such programs carry it), its init from a seeded generator."""

    def __init__(self, Value, sizes, seed=1234):
        rng = random.Random(seed)
        self.layers = [[([Value(rng.uniform(-1, 1)) for _ in range(nin)], Value(0.0))
                        for _ in range(nout)] for nin, nout in zip(sizes, sizes[1:])]

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            out = [sum((wi * xi for wi, xi in zip(w, x)), b) for w, b in layer]
            x = out if i == len(self.layers) - 1 else [o.relu() for o in out]
        return x

    def parameters(self):
        return [p for layer in self.layers for w, b in layer for p in w + [b]]


def cross_entropy(logits, target):
    ex = [l.exp() for l in logits]
    denom = sum(ex[1:], ex[0])
    return -(ex[target] / denom).log()


def train(Value):
    """The program as its author wrote it, on `Value`: its losses."""
    net = MLP(Value, [2, 8, 3])
    params = net.parameters()
    for p in params:
        p.m = 0.0
        p.v = 0.0
    data = dataset()
    losses = []
    for t in range(STEPS):
        total = Value(0.0)
        for x, k in data:
            logits = net([Value(c) for c in x])
            total = total + cross_entropy(logits, k)
        loss = total * (1.0 / len(data))
        loss._vis_color = "red"
        for p in params:
            p.grad = 0.0
        loss.backward()
        for p in params:
            p.m = BETAS[0] * p.m + (1 - BETAS[0]) * p.grad
            p.v = BETAS[1] * p.v + (1 - BETAS[1]) * p.grad ** 2
            m_hat = p.m / (1 - BETAS[0] ** (t + 1))
            v_hat = p.v / (1 - BETAS[1] ** (t + 1))
            p.data -= LR * (m_hat / (v_hat ** 0.5 + EPS) + WD * p.data)
        losses.append(loss.data)
    return losses


def compiled_losses():
    """The same model and loss on placeholders, compiled once, AdamW in the program."""
    Value = tapejit.Value
    net = MLP(Value, [2, 8, 3])
    data = dataset()
    xs = [[Value(0.0), Value(0.0)] for _ in data]
    onehots = [[Value(0.0) for _ in range(3)] for _ in data]
    total = Value(0.0)
    for x, onehot in zip(xs, onehots):
        logits = net(x)
        ex = [l.exp() for l in logits]
        denom = sum(ex[1:], ex[0])
        logp = [(e / denom).log() for e in ex]
        total = total + -sum((o * lp for o, lp in zip(onehot[1:], logp[1:])), onehot[0] * logp[0])
    loss = total * (1.0 / len(data))
    opt = tapejit.optim.AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    program = tapejit.compile(loss, inputs=[v for x in xs for v in x] + [v for o in onehots for v in o],
                              params=net.parameters(), optimizer=opt)
    batch = np.array([c for x, _ in data for c in x] + [float(j == k) for _, k in data for j in range(3)])
    return [program.step(batch) for _ in range(STEPS)]


def test_the_program_prints_micrograds_losses_with_the_import_changed():
    want = train(newer_micrograd())
    got = train(tapejit.Value)
    assert np.allclose(got, want, rtol=1e-9, atol=0)
    assert want[-1] < 0.5 * want[0]


def test_compiled_with_adamw_prints_them_too():
    want = train(newer_micrograd())
    assert np.allclose(compiled_losses(), want, rtol=1e-9, atol=0)
