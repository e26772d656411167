"""The JIT's tiers from Python: `tapejit.compile` returns with the first tier running and
native code compiling in the background (tiering="auto"), or native code compiled
("off"), or the first tier alone ("first_tier_only"); every tier gives the same bits, across
the switch too; a pickle keeps the tiering; a process that exits while the drop-in's native
code compiles exits cleanly."""

import os
import pathlib
import pickle
import random
import subprocess
import sys

import numpy as np
import pytest

import tapejit
from tapejit import Value

ROOT = pathlib.Path(__file__).resolve().parents[2]


def irregular(ops=300, seed=0):
    """A graph of `ops` operations, each on the 30th value back and another of the last 29
    (no loop to recover, so every op is native code's to compile; every value reaches the
    loss): its inputs (the first 4 of 30 leaves), its params (the other 26) and its loss."""
    rng = random.Random(seed)
    leaves = [Value(rng.uniform(-1, 1)) for _ in range(30)]
    values = list(leaves)
    for _ in range(ops):
        a, b = values[-30], rng.choice(values[-29:])
        k = rng.randrange(4)
        values.append([(a * b).tanh(), a + b, a.softplus(), (a - b).relu()][k])
    loss = sum(values[-30:]) * 0.05 + 1e-3 * sum(p * p for p in leaves[4:])
    return leaves[:4], leaves[4:], loss


def compiled(tiering=None, **options):
    inputs, params, loss = irregular()
    if tiering is not None:
        options["tiering"] = tiering
    return tapejit.compile(loss, inputs=inputs, params=params, **options)


def samples(n):
    return np.random.default_rng(1).uniform(-1, 1, (n, 4))


def bits(a):
    return np.asarray(a, dtype=np.float64).tobytes()


def test_the_default_runs_the_first_tier_until_native_code_takes_over():
    program = compiled()
    assert program.tiering == "auto"
    # A call switches tiers, at its start: none has run.
    assert program.tier == "first_tier"
    stats = program.stats()
    assert stats["first_tier_op_runs"] > 0
    assert stats["first_tier_passes"] == stats["native_passes"] == 0
    assert stats["native_after_secs"] is None and stats["native_error"] is None
    program.step(samples(1)[0], 0.01)
    stats = program.stats()
    assert stats["first_tier_passes"] + stats["native_passes"] == 1
    assert program.wait_for_native() is None
    assert program.tier == "native"
    stats = program.stats()
    assert stats["native_after_secs"] > 0 and stats["compile_secs"] > 0
    program.step(samples(1)[0], 0.01)
    assert program.stats()["native_passes"] == stats["native_passes"] + 1


def test_off_compiles_native_code_before_returning():
    program = compiled("off")
    assert program.tier == "native"
    stats = program.stats()
    assert stats["first_tier_op_runs"] == 0 and stats["native_after_secs"] is None
    program.wait_for_native()
    program.step(samples(1)[0], 0.01)
    assert program.stats()["native_passes"] == 1


def test_first_tier_only_never_compiles():
    program = compiled("first_tier_only")
    program.wait_for_native()  # nothing to wait for
    program.train(samples(3), 0.01)
    assert program.tier == "first_tier"
    stats = program.stats()
    assert stats["native_passes"] == 0 and stats["first_tier_passes"] == 3


def test_keep_ir_compiles_native_code_before_returning():
    program = compiled(keep_ir=True)
    assert program.tier == "native" and "define" in program.ir()


def test_the_interpreter_has_no_tiers():
    program = compiled(opt="interpreter")
    assert program.tier == "interpreter" and program.stats() == {}
    program.wait_for_native()


@pytest.mark.parametrize("optimizer", [None, tapejit.optim.Adam(lr=1e-2)])
def test_the_same_bits_across_the_switch_as_native_code_throughout(optimizer):
    """Steps and a `train` call on the first tier (as many as run before the compile ends),
    then on native code, against the same on a program compiled natively at once and on
    one that never compiles."""
    X = samples(12)

    def train(program):
        losses = [program.step(x, 0.01) for x in X[:4]]
        losses += list(program.train(X[4:8], 0.01))
        program.wait_for_native()
        losses += list(program.train(X[8:], 0.01))
        return losses, program.params, program.grads, program.optimizer_state

    want = train(compiled("off", optimizer=optimizer))
    for tiering in ["auto", "first_tier_only"]:
        got = train(compiled(tiering, optimizer=optimizer))
        assert bits(got[0]) == bits(want[0]), tiering
        assert bits(got[1]) == bits(want[1]) and bits(got[2]) == bits(want[2]), tiering
        assert got[3].keys() == want[3].keys()
        assert all(bits(got[3][k]) == bits(want[3][k]) for k in want[3]), tiering


def test_a_pickle_keeps_the_tiering():
    x = samples(1)[0]
    tiers = {"auto": "first_tier", "off": "native", "first_tier_only": "first_tier"}
    for tiering, tier in tiers.items():
        program = compiled(tiering)
        program.step(x, 0.01)
        loaded = pickle.loads(pickle.dumps(program))
        assert (loaded.tiering, loaded.tier) == (tiering, tier)
        assert bits(loaded.params) == bits(program.params)
        assert loaded.step(x, 0.01) == program.step(x, 0.01)
    # A pickle made before there was a tiering (three arguments to restore) loads as "auto".
    restore, args = compiled("off").__reduce__()
    assert restore(*args[:3]).tiering == "auto"


def test_a_bad_tiering_is_a_value_error_naming_the_choices():
    with pytest.raises(ValueError, match='"auto", "off" or "first_tier_only"'):
        compiled("fast")
    with pytest.raises(ValueError, match="keep_ir"):
        compiled("first_tier_only", keep_ir=True)


def test_exiting_while_the_drop_in_compiles_is_clean():
    """The drop-in's JITs live in a cache no object owns: one still compiling at exit is
    called off before LLVM is torn down (the process crashed 4 runs in 4 before)."""
    script = """
import sys
sys.path.insert(0, sys.argv[1])
import tapejit, moons
X, y = tapejit.datasets.make_moons(100, 0.1, moons.SEED)
model = moons.mlp(tapejit.nn)
for k in range(20):
    loss, _ = moons.demo_loss(tapejit, model, X, y)
    model.zero_grad()
    loss.backward()
"""
    examples = ROOT / "python" / "examples"
    env = {**os.environ, "TAPEJIT_CACHE": "off"}  # (a cached compile would end at once)
    done = subprocess.run([sys.executable, "-c", script, examples], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
