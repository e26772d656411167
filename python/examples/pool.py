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
import random

import tapejit
from moons import SEED, placeholders


def build(seed, lr):
    """The moons demo's model (its params from `seed`) and loss, compiled with AdamW."""
    random.seed(seed)
    model = tapejit.nn.MLP(2, [16, 16, 1])
    X, y = tapejit.datasets.make_moons(100, 0.1, SEED)
    loss, inputs, _, batch = placeholders(model, X, y)
    program = tapejit.compile(loss, inputs=inputs, params=model.parameters(),
                              optimizer=tapejit.optim.AdamW(lr=lr))
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
