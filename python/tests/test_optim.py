"""Compiled optimizers against torch.optim: the reference trajectories that
tests/data/make_optim_reference.py computed once with torch (the suite needs no torch), run
through tapejit.compile with tapejit.optim: every loss, the final params and the state within
1e-12 (relative); the step's rate is the optimizer's ``lr`` (a schedule sets it between
steps); state is read and written back; bad settings are typed errors."""

import json
import pathlib

import numpy as np
import pytest

import tapejit
from tapejit import Value

REFERENCE = json.loads(
    (pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "optim_reference.json").read_text())
STEPS = 100


def model():
    """The reference's 3-4-1 tanh MLP on its 8 samples, full batch: the loss, the leaves
    for the inputs (features and targets) and the params, in creation order."""
    m = REFERENCE["model"]
    init = iter(m["init"])
    hidden = [([Value(next(init)) for _ in range(3)], Value(next(init))) for _ in range(4)]
    out_w, out_b = [Value(next(init)) for _ in range(4)], Value(next(init))
    params = [p for w, b in hidden for p in w + [b]] + out_w + [out_b]
    inputs, errors = [], []
    for _ in m["x"]:
        x, y = [Value(0.0) for _ in range(3)], Value(0.0)
        inputs += x + [y]
        h = [sum((wi * xi for wi, xi in zip(w[1:], x[1:])), w[0] * x[0]) + b for w, b in hidden]
        h = [hj.tanh() for hj in h]
        out = sum((v * hj for v, hj in zip(out_w[1:], h[1:])), out_w[0] * h[0]) + out_b
        errors.append((out - y) ** 2)
    loss = sum(errors[1:], errors[0]) * 0.125
    data = [c for x, y in zip(m["x"], m["y"]) for c in x + [y]]
    return loss, inputs, params, np.array(data)


def optimizer(run):
    o = dict(run["options"])
    kind = {"SGD": tapejit.optim.SGD, "Adam": tapejit.optim.Adam, "AdamW": tapejit.optim.AdamW}
    if "betas" in o:
        o["betas"] = tuple(o["betas"])
    return kind[run["optimizer"]](**o)


def close(got, want, whole=False):
    """Within 1e-12 of `want`, relative to each number (or, `whole`, to the largest: a
    moment that cancels down to 1e-5 of the gradients it averages keeps their absolute
    error, as torch's own does)."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    scale = np.max(np.abs(want)) if whole else np.abs(want)
    return np.max(np.abs(got - want) / np.maximum(scale, 1e-300)) < 1e-12


@pytest.mark.parametrize("run", REFERENCE["runs"], ids=lambda r: r["name"])
@pytest.mark.parametrize("opt", ["O2", "interpreter"])
def test_compiled_optimizers_follow_torch(run, opt):
    loss, inputs, params, data = model()
    o = optimizer(run)
    program = tapejit.compile(loss, inputs=inputs, params=params, opt=opt, optimizer=o)
    losses = []
    for t in range(STEPS):
        if "lrs" in run:
            o.lr = run["lrs"][t]
        losses.append(program.step(data))
    assert close(losses, run["losses"])
    assert close(program.params, run["params"])
    state = program.optimizer_state
    for name, want in run["state"].items():
        if name == "step":
            assert state["step"] == want
        else:
            assert close(state[name], want, whole=True)


def test_state_moves_between_programs_and_rates_are_explicit_or_the_optimizers():
    loss, inputs, params, data = model()
    o = tapejit.optim.AdamW(lr=0.01)
    a = tapejit.compile(loss, inputs=inputs, params=params, optimizer=o)
    b = tapejit.compile(loss, inputs=inputs, params=params, optimizer=tapejit.optim.AdamW(lr=0.01))
    for _ in range(5):
        a.step(data)
        b.step(data, 0.01)
    assert list(a.params) == list(b.params)
    c = tapejit.compile(loss, inputs=inputs, params=params, optimizer=tapejit.optim.AdamW(lr=0.01))
    c.params = a.params
    c.optimizer_state = a.optimizer_state
    assert c.optimizer_state["step"] == 5
    a.train(np.tile(data, 3))
    c.train(np.tile(data, 3))
    assert list(a.params) == list(c.params)

    with pytest.raises(ValueError, match="exp_avg"):
        c.optimizer_state = {"step": 1, "exp_avg": np.zeros(len(params))}
    plain = tapejit.compile(loss, inputs=inputs, params=params)
    with pytest.raises(TypeError, match="learning rate"):
        plain.step(data)
    assert plain.optimizer is None and plain.optimizer_state == {"step": 0}


@pytest.mark.parametrize("bad,match", [
    (tapejit.optim.Adam(betas=(1.0, 0.999)), "betas"),
    (tapejit.optim.AdamW(eps=-1.0), "eps"),
    (tapejit.optim.SGD(lr=0.1, nesterov=True), "Nesterov"),
    ("adam", "tapejit.optim"),
])
def test_bad_optimizers_are_refused(bad, match):
    loss, inputs, params, _ = model()
    with pytest.raises((ValueError, TypeError), match=match):
        tapejit.compile(loss, inputs=inputs, params=params, optimizer=bad)


def test_a_pickled_program_continues_where_it_left_off():
    """A compiled program pickles with its graph, params, optimizer and state: loaded (and
    compiled again), it steps on to the same bits as one never pickled."""
    import pickle
    loss, inputs, params, data = model()
    program = tapejit.compile(loss, inputs=inputs, params=params,
                              optimizer=tapejit.optim.AdamW(lr=0.01))
    for _ in range(5):
        program.step(data)
    copy = pickle.loads(pickle.dumps(program))
    assert copy.optimizer_state["step"] == 5 and copy.optimizer == program.optimizer
    assert list(copy.params) == list(program.params)
    for _ in range(5):
        program.step(data)
        copy.step(data)
    assert list(copy.params) == list(program.params)


def test_a_checkpoint_holds_the_params_and_the_optimizers_state(tmp_path):
    """Program.save writes the params and the moments and step count (safetensors tensors
    optimizer.exp_avg, ...); load puts both back, and training continues to the same bits.
    Another optimizer's checkpoint, or one without the state this optimizer keeps, is
    refused and changes nothing."""
    loss, inputs, params, data = model()
    compiled = lambda o: tapejit.compile(loss, inputs=inputs, params=params, optimizer=o)
    a = compiled(tapejit.optim.Adam(lr=0.01))
    for _ in range(4):
        a.step(data)
    path = str(tmp_path / "adam.safetensors")
    a.save(path)
    b = compiled(tapejit.optim.Adam(lr=0.01))
    b.load(path)
    assert b.optimizer_state["step"] == 4
    for _ in range(4):
        a.step(data)
        b.step(data)
    assert list(a.params) == list(b.params)

    plain = compiled(None)
    before = list(plain.params)
    with pytest.raises(ValueError, match="optimizer adam"):
        plain.load(path)
    assert list(plain.params) == before
    plain.save(str(tmp_path / "plain.safetensors"))
    with pytest.raises(ValueError, match="no optimizer state"):
        b.load(str(tmp_path / "plain.safetensors"))


def test_a_pickled_program_keeps_the_constants_it_was_compiled_with():
    import copy
    import pickle
    from tapejit import Value
    w, x, c = Value(0.5), Value(0.0), Value(2.0)
    program = tapejit.compile((w * x - c) ** 2, inputs=[x], params=[w])
    c.data = 100.0  # a constant changed after compile: the program does not see it
    for copied in (pickle.loads(pickle.dumps(program)), copy.deepcopy(program)):
        assert copied.forward([1.0]) == program.forward([1.0]) == 2.25


def test_settings_but_lr_are_fixed_once_compiled():
    from tapejit import Value
    w, x = Value(0.5), Value(0.0)
    opt = tapejit.optim.AdamW(lr=0.1, weight_decay=0.01)
    tapejit.compile((w * x - 1.0) ** 2, inputs=[x], params=[w], optimizer=opt)
    with pytest.raises(AttributeError, match="compile again"):
        opt.weight_decay = 0.9
    opt.lr = 0.05  # a schedule still may
    assert opt == tapejit.optim.AdamW(lr=0.05, weight_decay=0.01)
