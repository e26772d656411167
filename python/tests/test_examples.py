"""The Python examples run, and python/examples/moons.py prints, in both of its speeds, the
losses and accuracies `cargo run --release --example moons` prints: the same data and
initial params (tapejit.datasets' seeded generators), the same additions in the same order."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def step_lines(text):
    return [line for line in text.splitlines() if line.startswith("step ")]


def test_moons_prints_the_rust_examples_losses_in_both_speeds():
    rust = ROOT / "target" / "release" / "examples" / "moons"
    if not rust.exists():
        pytest.skip("the Rust example is not built (cargo test --release builds it)")
    want = step_lines(subprocess.run([rust], capture_output=True, text=True, check=True).stdout)
    assert len(want) == 100 and want[-1].endswith("accuracy 100.0%")
    out = subprocess.run(
        [sys.executable, ROOT / "python" / "examples" / "moons.py", "--micrograd-steps", "0"],
        capture_output=True, text=True, check=True,
    ).stdout
    drop_in, compiled = out.split("== compiled")
    assert step_lines(drop_in) == want
    assert step_lines(compiled) == want


def test_draw_writes_a_picture(tmp_path):
    out = subprocess.run(
        [sys.executable, ROOT / "python" / "examples" / "draw.py", tmp_path / "neuron"],
        capture_output=True, text=True, check=True,
    ).stdout
    written = out.splitlines()[0].split()[-1]
    assert pathlib.Path(written).exists()
    assert "nest:" in out


def test_optimizers_example_runs():
    out = subprocess.run(
        [sys.executable, ROOT / "python" / "examples" / "optimizers.py", "--steps", "5", "--rounds", "1"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert "AdamW" in out and "x plain SGD" in out


def test_pool_trains_pickled_programs_in_worker_processes():
    out = subprocess.run(
        [sys.executable, ROOT / "python" / "examples" / "pool.py", "--models", "2", "--steps", "20",
         "--workers", "2"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert out.count("20 steps") == 2, out
