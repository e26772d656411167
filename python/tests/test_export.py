"""program.export: a compiled program as an object file and a C header (Rust's Jit::export),
which a C program links to compute the bits the program computes in Python, forward and
training. The C half is skipped where there is no C compiler."""

import random
import shutil
import struct
import subprocess

import numpy as np
import pytest

import tapejit
from tapejit import Value


def model_and_loss(seed=3):
    """A small MLP on inputs x0, x1 and a target y: its output, a squared-error loss through
    tanh, exp and log, and its params."""
    random.seed(seed)
    model = tapejit.nn.MLP(2, [4, 1])
    x = [Value(0.0), Value(0.0)]
    y = Value(0.0)
    score = model(x)
    squashed = score.tanh() + (score * score + 1).log() * 0.25 + (score * 0.1).exp()
    loss = (squashed - y) ** 2
    return model, x, y, [score, squashed], loss


def compiled(opt="O2", optimizer=None):
    model, x, y, outputs, loss = model_and_loss()
    return tapejit.compile(loss, inputs=x + [y], params=model.parameters(), outputs=outputs,
                           opt=opt, optimizer=optimizer)


def samples(n, seed=5):
    rng = random.Random(seed)
    return np.array([[rng.uniform(-2, 2), rng.uniform(-2, 2), rng.uniform(-1, 1)]
                     for _ in range(n)])


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def c_array(xs):
    """A C initializer of `xs`' bits."""
    return ", ".join(f"0x{bits(x):016x}ull" for x in xs) or "0"


PRELUDE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
static double from_bits(uint64_t b) { double x; memcpy(&x, &b, 8); return x; }
static void print(double x) { uint64_t b; memcpy(&b, &x, 8); printf("%016llx\n", (unsigned long long)b); }
"""


def run_c(directory, main, objects):
    """Compiles `main` against `objects` in `directory`, runs it, and returns the bits it
    printed (one `%016llx` per line)."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    (directory / "main.c").write_text(PRELUDE + main)
    built = subprocess.run([cc, "-O2", "main.c", *objects, "-lm", "-o", "main"],
                           cwd=directory, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(directory / "main")], capture_output=True, text=True, check=True)
    return [int(line, 16) for line in ran.stdout.split()]


@pytest.mark.parametrize("as_str", [False, True])
def test_export_writes_object_and_header(tmp_path, as_str):
    program = compiled()
    path = tmp_path / "net.o"
    exported = program.export(str(path) if as_str else path, prefix="net")
    assert exported["object"] == str(path)
    assert exported["header"] == str(tmp_path / "net.h")
    assert path.stat().st_size == exported["object_bytes"] > 0
    header = (tmp_path / "net.h").read_text()
    assert "net_forward" in header and "net_init" in header
    assert "NET_WORKSPACE_DOUBLES" in header and "net_step" not in header
    assert exported["workspace_doubles"] > 0 and exported["secs"] >= 0
    # A generic target's object too; default prefix "model".
    program.export(tmp_path / "model.o", target="generic")
    assert "model_forward" in (tmp_path / "model.h").read_text()


@pytest.mark.parametrize("opt", ["O2", "interpreter"])
@pytest.mark.parametrize("target", ["host", "generic"])
def test_exported_forward_is_bit_identical(tmp_path, opt, target):
    program = compiled(opt)
    X = samples(5)
    program.export(tmp_path / "m.o", prefix="m", target=target)
    expected = []
    for x in X:
        expected.append(bits(program.forward(x)))
        expected.extend(bits(o) for o in program.outputs())
    main = f"""
#include "m.h"
static const uint64_t X[] = {{ {c_array(X.ravel())} }};
int main(void) {{
    double *ws = aligned_alloc(64, ((M_WORKSPACE_DOUBLES * 8 + 63) / 64) * 64);
    double x[M_NUM_INPUTS], out[M_NUM_OUTPUTS];
    m_init(ws);
    for (int s = 0; s < {len(X)}; s++) {{
        for (int i = 0; i < M_NUM_INPUTS; i++) x[i] = from_bits(X[s * M_NUM_INPUTS + i]);
        print(m_forward(ws, x, out));
        for (int i = 0; i < M_NUM_OUTPUTS; i++) print(out[i]);
    }}
    return 0;
}}
"""
    assert run_c(tmp_path, main, ["m.o"]) == expected


@pytest.mark.parametrize("opt", ["O2", "interpreter"])
def test_exported_training_is_bit_identical(tmp_path, opt):
    program = compiled(opt, optimizer=tapejit.optim.Adam(lr=0.01))
    X = samples(8)
    lr = 0.01
    # Exported mid-training: the C side goes on from the optimizer's state.
    program.train(X[:2], lr)
    start = program.params.copy()
    exported = program.export(tmp_path / "t.o", prefix="t", training=True)
    header = (tmp_path / "t.h").read_text()
    assert "t_step" in header and "t_set_params" in header
    expected = [bits(program.step(x, lr)) for x in X[2:]]
    expected.extend(bits(p) for p in program.params)
    main = f"""
#include "t.h"
static const uint64_t X[] = {{ {c_array(X[2:].ravel())} }};
static const uint64_t P[] = {{ {c_array(start)} }};
int main(void) {{
    double *ws = aligned_alloc(64, ((T_WORKSPACE_DOUBLES * 8 + 63) / 64) * 64);
    double x[T_NUM_INPUTS], p[T_NUM_PARAMS];
    double lr = from_bits(0x{bits(lr):016x}ull);
    t_init(ws);
    for (int i = 0; i < T_NUM_PARAMS; i++) p[i] = from_bits(P[i]);
    t_set_params(ws, p);
    for (int s = 0; s < {len(X) - 2}; s++) {{
        for (int i = 0; i < T_NUM_INPUTS; i++) x[i] = from_bits(X[s * T_NUM_INPUTS + i]);
        print(t_step(ws, x, lr));
    }}
    t_get_params(ws, p);
    for (int i = 0; i < T_NUM_PARAMS; i++) print(p[i]);
    return 0;
}}
"""
    assert exported["workspace_doubles"] > 0
    got = run_c(tmp_path, main, ["t.o"])
    assert len(got) == len(expected)
    assert got[:len(X) - 2] == expected[:len(X) - 2], "losses"
    assert got[len(X) - 2:] == expected[len(X) - 2:], "params"


def test_bad_exports_raise(tmp_path):
    program = compiled()
    path = tmp_path / "m.o"
    with pytest.raises(ValueError, match="not a C identifier"):
        program.export(path, prefix="2fast")
    with pytest.raises(OSError, match="cannot write"):
        program.export(tmp_path / "missing" / "m.o")
    with pytest.raises(ValueError, match="frozen"):
        program.export(path, params="frozen", training=True)
    with pytest.raises(ValueError, match="params="):
        program.export(path, params="thawed")
    with pytest.raises(ValueError, match="CPU named"):
        program.export(path, target="x86_64-unknown-linux-gnu:nonesuchcpu")
    with pytest.raises(ValueError, match="no target"):
        program.export(path, target="nonesuch-unknown-none")
    for target in ["", "x86_64-unknown-linux-gnu:", ":znver3", "a:b:c", "x86 64"]:
        with pytest.raises(ValueError, match="target="):
            program.export(path, target=target)
    # Training a program without params.
    x = Value(0.0)
    no_params = tapejit.compile((x * 2).exp(), inputs=[x], params=[])
    with pytest.raises(ValueError, match="without params"):
        no_params.export(path, training=True)
