"""Several models trained at once in a process pool: compiled programs pickle (their graph,
params, optimizer and its state; compiled again where they are loaded), so
`multiprocessing` (or Dask, or Ray) can ship them to workers and back.

    python python/examples/pool.py [--models N] [--steps N] [--workers N]

Each model is micrograd's moons MLP(2, [16, 16, 1]) from its own seed, trained with AdamW
at its own learning rate; the workers return the trained programs, and the parent reads
their losses and params.
"""

import argparse
import multiprocessing

import numpy as np

import tapejit


def build(seed, lr):
    """The moons demo's model and loss on placeholders, compiled with AdamW."""
    import random
    random.seed(seed)
    model = tapejit.nn.MLP(2, [16, 16, 1])
    X, y = tapejit.datasets.make_moons(100, 0.1, 1337)
    xs = [[tapejit.Value(0.0), tapejit.Value(0.0)] for _ in X]
    ys = [tapejit.Value(0.0) for _ in y]
    scores = list(map(model, xs))
    losses = [(1 + -yi * si).relu() for yi, si in zip(ys, scores)]
    total = sum(losses) * (1.0 / len(losses)) + 1e-4 * sum((p * p for p in model.parameters()))
    program = tapejit.compile(total, inputs=[v for row in xs for v in row] + ys,
                              params=model.parameters(), optimizer=tapejit.optim.AdamW(lr=lr))
    batch = np.array([v for row in X for v in row] + list(y), dtype=np.float64)
    return program, batch


def train(job):
    """In a worker: steps on the program it was sent; returns it and its last loss."""
    program, batch, steps = job
    loss = None
    for _ in range(steps):
        loss = program.step(batch)
    return program, loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    jobs = []
    for k in range(args.models):
        program, batch = build(seed=k, lr=0.01 * (k + 1))
        jobs.append((program, batch, args.steps))
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        trained = pool.map(train, jobs)
    for k, (program, loss) in enumerate(trained):
        print(f"model {k}: lr {program.optimizer.lr:g}, {program.optimizer_state['step']} steps, "
              f"loss {loss:.4f}")


if __name__ == "__main__":
    main()
