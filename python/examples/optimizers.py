"""micrograd's moons demo compiled, stepped by each optimizer: time per step beside plain SGD.

    python python/examples/optimizers.py [--steps N] [--rounds R]

The demo's model and loss (python/examples/moons.py) are compiled once per optimizer
(plain SGD, which the JIT fuses into its step, then tapejit.optim's SGD with momentum, Adam
and AdamW, which update after the native backward pass); each round runs N steps of every
program in turn, and the medians over the rounds are printed with their ratio to plain SGD.
"""

import argparse
import statistics
import time

import numpy as np

import tapejit
from moons import SEED, mlp


def program(X, y, optimizer):
    model = mlp(tapejit.nn)
    xs = [[tapejit.Value(0.0), tapejit.Value(0.0)] for _ in X]
    ys = [tapejit.Value(0.0) for _ in y]
    scores = list(map(model, xs))
    losses = [(1 + -yi * si).relu() for yi, si in zip(ys, scores)]
    total = sum(losses) * (1.0 / len(losses)) + 1e-4 * sum((p * p for p in model.parameters()))
    return tapejit.compile(total, inputs=[v for row in xs for v in row] + ys,
                           params=model.parameters(), optimizer=optimizer)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    X, y = tapejit.datasets.make_moons(100, 0.1, SEED)
    batch = np.array([v for row in X for v in row] + list(y), dtype=np.float64)
    optimizers = {
        "plain SGD": tapejit.optim.SGD(lr=0.05),
        "SGD momentum 0.9": tapejit.optim.SGD(lr=0.05, momentum=0.9),
        "Adam": tapejit.optim.Adam(lr=0.01),
        "AdamW": tapejit.optim.AdamW(lr=0.01),
    }
    programs = {name: program(X, y, o) for name, o in optimizers.items()}
    times = {name: [] for name in programs}
    for _ in range(args.rounds):
        for name, p in programs.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                p.step(batch)
            times[name].append((time.perf_counter() - start) / args.steps)
    base = statistics.median(times["plain SGD"])
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:18s} {m * 1e6:7.2f} us/step  {m / base:.2f}x plain SGD"
              f"  (rounds {min(ts) * 1e6:.2f}-{max(ts) * 1e6:.2f})")


if __name__ == "__main__":
    main()
