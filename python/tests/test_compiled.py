"""tapejit.compile: a graph built once with micrograd's API, run natively on numpy arrays,
against the same steps done the drop-in way (which the other tests check against micrograd)."""

import random

import numpy as np
import pytest

import tapejit
from tapejit import Value


def model_and_loss(seed=1):
    """A micrograd MLP on one sample: inputs x0, x1 and the label y (all placeholders), the
    demo's max-margin loss; the model's params."""
    random.seed(seed)
    model = tapejit.nn.MLP(2, [4, 4, 1])
    x = [Value(0.0), Value(0.0)]
    y = Value(0.0)
    score = model(x)
    loss = (1 + -y * score).relu() + 1e-4 * sum(p * p for p in model.parameters())
    return model, x, y, score, loss


def samples(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.uniform(-2, 2), rng.uniform(-2, 2)
        out.append([a, b, 1.0 if a * b > 0 else -1.0])
    return np.array(out)


@pytest.mark.parametrize("opt", ["interpreter", "O0", "O2", "O3"])
def test_train_matches_drop_in_steps_bit_for_bit(opt):
    model, x, y, score, loss = model_and_loss()
    program = tapejit.compile(loss, inputs=x + [y], params=model.parameters(), outputs=[score], opt=opt)
    assert (program.num_inputs, program.num_params) == (3, len(model.parameters()))
    X = samples(12, 2)
    losses = program.train(X, 0.05)

    # The same steps, rebuilt and run the drop-in way.
    ref, _, _, _, _ = model_and_loss()
    want = []
    for a, b, label in X:
        s = ref([Value(a), Value(b)])
        l = (1 + -Value(label) * s).relu() + 1e-4 * sum(p * p for p in ref.parameters())
        want.append(l.data)
        ref.zero_grad()
        l.backward()
        for p in ref.parameters():
            p.data -= 0.05 * p.grad
    assert list(losses) == want
    assert list(program.params) == [p.data for p in ref.parameters()]
    assert list(program.grads) == [p.grad for p in ref.parameters()]


def test_step_forward_outputs_params_and_sync():
    model, x, y, score, loss = model_and_loss()
    program = tapejit.compile(loss, inputs=x + [y], outputs=[score])
    # Default params: the leaves that are neither inputs nor numbers (the model's).
    assert program.num_params == len(model.parameters())
    before = program.params.copy()
    first = program.forward(np.array([0.5, -1.0, 1.0]))
    assert program.outputs().shape == (1,)
    assert program.step([0.5, -1.0, 1.0], 0.1) == first
    assert not np.array_equal(program.params, before)
    program.params = before
    assert np.array_equal(program.params, before)
    program.step([0.5, -1.0, 1.0], 0.1)
    program.sync()
    assert sorted(p.data for p in model.parameters()) == sorted(program.params)


def test_ir_when_kept():
    _, x, y, _, loss = model_and_loss()
    assert "define" in tapejit.compile(loss, inputs=x + [y], keep_ir=True).ir()
    with pytest.raises(RuntimeError):
        tapejit.compile(loss, inputs=x + [y], opt="interpreter").ir()


def test_misuse_is_a_python_exception_with_tapejits_message():
    model, x, y, score, loss = model_and_loss()
    program = tapejit.compile(loss, inputs=x + [y])
    with pytest.raises(ValueError, match="inputs"):
        program.step([1.0, 2.0], 0.1)  # two numbers for three inputs
    with pytest.raises(ValueError, match="not finite"):
        program.step([1.0, float("nan"), 1.0], 0.1)
    with pytest.raises(ValueError, match="learning rate"):
        program.step([1.0, 2.0, 1.0], float("inf"))
    with pytest.raises(ValueError):
        program.train(np.zeros((2, 4)), 0.1)  # rows of four
    with pytest.raises(ValueError, match="not in the loss's graph"):
        tapejit.compile(loss, inputs=[Value(1.0)])  # a value of another graph
    with pytest.raises(ValueError, match="not a leaf"):
        tapejit.compile(loss, inputs=[score])
    with pytest.raises(ValueError, match="twice"):
        tapejit.compile(loss, inputs=x + [x[0]])
    with pytest.raises(ValueError, match="opt"):
        tapejit.compile(loss, inputs=x + [y], opt="O9")
    with pytest.raises(ValueError):
        program.params = [1.0]


def test_default_params_leave_out_leaves_the_loss_only_adds():
    """A running sum's `Value(0.0)` start (and a constant written as a Value, added and
    scaled) is not a default param: the loss is affine in it, its gradient a constant, and
    training it would lower the loss without end. The model's weights and biases are."""
    model = tapejit.nn.MLP(2, [3, 1])
    xs = [[Value(0.0), Value(0.0)] for _ in range(4)]
    ys = [Value(0.0) for _ in range(4)]
    total = Value(0.0)
    offset = Value(5.0)
    for x, y in zip(xs, ys):
        total = total + (model(x) - y) ** 2
    loss = (total + offset) * 0.25 - offset / 4
    program = tapejit.compile(loss, inputs=[v for x in xs for v in x] + ys)
    assert program.num_params == len(model.parameters())
    batch = np.array([0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7, 0.8, 1.0, -1.0, 0.5, 0.0])
    for _ in range(3):
        program.step(batch, 0.1)
    program.sync()
    assert total.data == 0.0 and offset.data == 5.0


def test_a_param_the_loss_does_not_use_is_trained_with_gradient_zero():
    """As PyTorch takes one: listed in `params`, kept in its place, its gradient 0."""
    model, x, y, score, loss = model_and_loss()
    unused = Value(3.0)
    params = model.parameters()
    program = tapejit.compile(loss, inputs=x + [y], params=params[:2] + [unused] + params[2:])
    program.step([1.0, 2.0, 1.0], 0.1)
    assert program.params[2] == 3.0 and program.grads[2] == 0.0
    assert program.num_params == len(params) + 1
