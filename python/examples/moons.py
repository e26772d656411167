"""micrograd's demo.ipynb on tapejit, in its two speeds.

    python python/examples/moons.py [--steps N] [--micrograd-steps N]

1. Drop-in: micrograd's own training loop, which rebuilds the graph every step, with only the
   import changed. The first step runs on the interpreter; the second starts the JIT on the
   structure (its first tier at once, native code once compiled in the background), which
   every later step reuses.
2. Compiled: the same model and loss built once, with placeholders for the data, and
   `tapejit.compile`'s program stepping on numpy arrays, timed on native code (the example
   waits for it).

Both print micrograd's line per step (loss, accuracy) and end with the time per step; with
micrograd installed (pip install micrograd), its time per step on the same code too. The
data (make_moons-style, 100 points, noise 0.1) and the initial params come from tapejit's
seeded generators, as in `cargo run --release --example moons`, which prints the same
losses; they are not scikit-learn's, so the numbers differ from the notebook's.
"""

import argparse
import statistics
import time

import numpy as np

import tapejit


def demo_loss(engine, model, X, y):
    """The notebook's loss(): SVM max-margin loss, mean over the batch, plus 1e-4 L2."""
    Value = engine.Value
    inputs = [list(map(Value, xrow)) for xrow in X]
    scores = list(map(model, inputs))
    losses = [(1 + -yi * scorei).relu() for yi, scorei in zip(y, scores)]
    data_loss = sum(losses) * (1.0 / len(losses))
    alpha = 1e-4
    reg_loss = alpha * sum((p * p for p in model.parameters()))
    total_loss = data_loss + reg_loss
    accuracy = [(yi > 0) == (scorei.data > 0) for yi, scorei in zip(y, scores)]
    return total_loss, sum(accuracy) / len(accuracy)


SEED = 1337


def mlp(nn):
    """The notebook's MLP(2, [16, 16, 1]) of `nn` (tapejit's or micrograd's), initialised by
    tapejit's seeded generator as the Rust example is."""
    model = nn.MLP(2, [16, 16, 1])
    sizes = [2, 16, 16, 1]
    for p, x in zip(model.parameters(), tapejit.datasets.micrograd_params(sizes, SEED)):
        p.data = x
    return model


def drop_in(engine, nn, X, y, steps, show=True):
    """The notebook's training loop on `engine` (tapejit or micrograd); seconds per step."""
    model = mlp(nn)
    times = []
    for k in range(steps):
        start = time.perf_counter()
        total_loss, acc = demo_loss(engine, model, X, y)
        model.zero_grad()
        total_loss.backward()
        learning_rate = 1.0 - 0.9 * k / 100
        for p in model.parameters():
            p.data -= learning_rate * p.grad
        times.append(time.perf_counter() - start)
        if show:
            print(f"step {k} loss {total_loss.data}, accuracy {acc*100}%")
    return times


def placeholders(model, X, y):
    """The demo's loss of `model` built once on placeholder leaves for the data: the loss,
    the inputs (each point's two coordinates, then the labels) and the scores; and the
    data as the batch `step` takes."""
    xs = [[tapejit.Value(0.0), tapejit.Value(0.0)] for _ in X]
    ys = [tapejit.Value(0.0) for _ in y]
    scores = list(map(model, xs))
    losses = [(1 + -yi * scorei).relu() for yi, scorei in zip(ys, scores)]
    data_loss = sum(losses) * (1.0 / len(losses))
    total_loss = data_loss + 1e-4 * sum((p * p for p in model.parameters()))
    batch = np.array([v for row in X for v in row] + list(y), dtype=np.float64)
    return total_loss, [v for row in xs for v in row] + ys, scores, batch


def compiled(X, y, steps):
    """The same model and loss, built once on placeholders and compiled."""
    model = mlp(tapejit.nn)
    total_loss, inputs, scores, batch = placeholders(model, X, y)
    start = time.perf_counter()
    program = tapejit.compile(total_loss, inputs=inputs, params=model.parameters(),
                              outputs=scores)
    print(f"compiled in {time.perf_counter() - start:.3f} s: {program}")
    program.wait_for_native()
    print(f"native code in {time.perf_counter() - start:.3f} s")
    labels = np.array(y)
    times = []
    for k in range(steps):
        start = time.perf_counter()
        loss = program.step(batch, 1.0 - 0.9 * k / 100)
        times.append(time.perf_counter() - start)
        acc = np.mean((program.outputs() > 0) == (labels > 0))
        print(f"step {k} loss {loss}, accuracy {acc*100}%")
    program.sync()
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--micrograd-steps", type=int, default=3,
                        help="steps micrograd runs for its time per step (about 1 s each)")
    args = parser.parse_args()
    X, y = tapejit.datasets.make_moons(100, 0.1, SEED)

    print("== drop-in: micrograd's loop, import changed")
    drop = drop_in(tapejit, tapejit.nn, X, y, args.steps)
    print("== compiled: built once, tapejit.compile")
    comp = compiled(X, y, args.steps)

    def per_step(times):
        later = times[2:] or times
        return statistics.median(later)

    print(f"drop-in: {per_step(drop)*1e3:.2f} ms/step (median of steps 2..; step 1 starts the JIT: "
          f"{drop[1]*1e3 if len(drop) > 1 else float('nan'):.0f} ms)")
    print(f"compiled: {per_step(comp)*1e6:.1f} us/step")
    if args.micrograd_steps < 1:
        return
    try:
        import micrograd.engine
        import micrograd.nn
    except ImportError:
        print("micrograd is not installed (pip install micrograd): no time to compare with")
        return
    mg = drop_in(micrograd.engine, micrograd.nn, X, y, args.micrograd_steps, show=False)
    mg_step = statistics.median(mg)
    print(f"micrograd {args.micrograd_steps} steps: {mg_step*1e3:.0f} ms/step: drop-in "
          f"{mg_step / per_step(drop):.0f}x, compiled {mg_step / per_step(comp):.0f}x faster")


if __name__ == "__main__":
    main()
