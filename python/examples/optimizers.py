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

import tapejit
from moons import SEED, mlp, placeholders


def program(X, y, optimizer):
    model = mlp(tapejit.nn)
    loss, inputs, _, batch = placeholders(model, X, y)
    program = tapejit.compile(loss, inputs=inputs, params=model.parameters(), optimizer=optimizer)
    return program, batch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    X, y = tapejit.datasets.make_moons(100, 0.1, SEED)
    optimizers = {
        "plain SGD": tapejit.optim.SGD(lr=0.05),
        "SGD momentum 0.9": tapejit.optim.SGD(lr=0.05, momentum=0.9),
        "Adam": tapejit.optim.Adam(lr=0.01),
        "AdamW": tapejit.optim.AdamW(lr=0.01),
    }
    programs = {name: program(X, y, o) for name, o in optimizers.items()}
    times = {name: [] for name in programs}
    for _ in range(args.rounds):
        for name, (p, batch) in programs.items():
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
