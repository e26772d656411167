"""JAX beside the math families of benches/common/families_math.rs (issue #41): the same
computation in jax.numpy, f64, from the same params and data (splitmix64, as `Draws` draws
them), one jitted training step (value_and_grad, then p - lr * grad) per call.

    .venv-jax/bin/python benches/jax/families_math.py attention|lstm|nbody [--unroll]

Prints one line: the compile seconds, the median microseconds per step over 15 runs of 200
steps (and the fastest run), and the loss at the initial params, which is the tape's loss at
the first step up to rounding. The rollouts (lstm, nbody) step through `lax.scan`, as a JAX
user writes a loop; `--unroll` writes them as a Python loop instead, one XLA graph of every
step.
"""
import math
import statistics
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402

MASK = (1 << 64) - 1


class Draws:
    """splitmix64, as `Draws` in benches/common/families_math.rs."""

    def __init__(self, seed):
        self.state = seed

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def uniform(self, lo, hi):
        u = (self.next_u64() >> 11) / float(1 << 53)
        return lo + (hi - lo) * u

    def uniforms(self, n, lo, hi):
        return [self.uniform(lo, hi) for _ in range(n)]


def array(xs, shape):
    return jnp.asarray(xs, dtype=jnp.float64).reshape(shape)


# ------------------------------------------------------------------------------------------
# attention: T = 16, D = 8, seed 41
# ------------------------------------------------------------------------------------------


def attention(unroll):
    del unroll
    t, d, seed = 16, 8, 41
    s = 1.0 / math.sqrt(d)
    w = Draws(seed).uniforms(3 * d * d, -s, s)
    params = tuple(array(w[k * d * d:(k + 1) * d * d], (d, d)) for k in range(3))
    data = Draws(seed + 1).uniforms(2 * t * d, -1.0, 1.0)
    x, y = array(data[:t * d], (t, d)), array(data[t * d:], (t, d))

    def loss(p):
        wq, wk, wv = p
        q, k, v = x @ wq.T, x @ wk.T, x @ wv.T
        scores = q @ k.T / math.sqrt(d)
        e = jnp.exp(scores - jnp.max(scores, axis=1, keepdims=True))
        a = e / jnp.sum(e, axis=1, keepdims=True)
        return jnp.mean((a @ v - y) ** 2)

    return f"T = {t}, D = {d}", params, loss, 0.1


# ------------------------------------------------------------------------------------------
# lstm: one input per step, H = 8, T = 50, seed 42
# ------------------------------------------------------------------------------------------


def lstm(unroll):
    n_in, h, steps, seed = 1, 8, 50, 42
    n = n_in + h
    s = 1.0 / math.sqrt(h)
    draws = Draws(seed)
    gates = []
    for _ in range(4):  # i, f, u, o: per neuron its weights over [x, h], then its bias
        rows = [draws.uniforms(n + 1, -s, s) for _ in range(h)]
        gates.append((array([r[:n] for r in rows], (h, n)), array([r[n] for r in rows], (h,))))
    readout = draws.uniforms(h + 1, -s, s)
    params = (tuple(gates), (array(readout[:h], (h,)), jnp.float64(readout[h])))
    xs = Draws(seed + 1).uniforms(steps * n_in, -1.0, 1.0)
    target = xs[0]
    xs = array(xs, (steps, n_in))

    def loss(p):
        ((wi, bi), (wf, bf), (wu, bu), (wo, bo)), (v, c0) = p

        def cell(carry, x):
            hs, cs = carry
            xh = jnp.concatenate([x, hs])
            i = jax.nn.sigmoid(wi @ xh + bi)
            f = jax.nn.sigmoid(wf @ xh + bf)
            u = jnp.tanh(wu @ xh + bu)
            o = jax.nn.sigmoid(wo @ xh + bo)
            cs = f * cs + i * u
            return (o * jnp.tanh(cs), cs), None

        carry = (jnp.zeros(h), jnp.zeros(h))
        if unroll:
            for k in range(steps):
                carry, _ = cell(carry, xs[k])
        else:
            carry, _ = jax.lax.scan(cell, carry, xs)
        return (c0 + v @ carry[0] - target) ** 2

    return f"T = {steps}, H = {h}", params, loss, 0.1


# ------------------------------------------------------------------------------------------
# nbody: N = 8, T = 20, seed 43
# ------------------------------------------------------------------------------------------

NBODY_DT = 0.01
NBODY_SOFTENING = 0.05


def nbody(unroll):
    n, steps, seed = 8, 20, 43
    params = array(Draws(seed).uniforms(2 * n, -0.5, 0.5), (n, 2))
    draws = Draws(seed + 1)
    pos = array(draws.uniforms(2 * n, -1.0, 1.0), (n, 2))
    m = array(draws.uniforms(n, 0.5, 1.5), (n,))
    targets = array(draws.uniforms(2 * n, -1.0, 1.0), (n, 2))

    def step(carry, _):
        x, v = carry
        dx = x[None, :, :] - x[:, None, :]  # dx[i, j] = x_j - x_i; 0 on the diagonal
        w = (jnp.sum(dx * dx, axis=2) + NBODY_SOFTENING) ** -1.5
        a = jnp.sum(dx * (w * m[None, :])[:, :, None], axis=1)
        v = v + a * NBODY_DT
        return (x + v * NBODY_DT, v), None

    def loss(v0):
        carry = (pos, v0)
        if unroll:
            for _ in range(steps):
                carry, _ = step(carry, None)
        else:
            carry, _ = jax.lax.scan(step, carry, None, length=steps)
        return jnp.sum((carry[0] - targets) ** 2)

    return f"N = {n}, T = {steps}", params, loss, 0.1


FAMILIES = {"attention": attention, "lstm": lstm, "nbody": nbody}


def main():
    args = sys.argv[1:]
    unroll = "--unroll" in args
    names = [a for a in args if a != "--unroll"]
    if len(names) != 1 or names[0] not in FAMILIES:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(FAMILIES)} [--unroll]")
    name = names[0]
    size, params, loss, lr = FAMILIES[name](unroll)

    @jax.jit
    def train_step(p, lr):
        value, grad = jax.value_and_grad(loss)(p)
        return jax.tree_util.tree_map(lambda a, g: a - lr * g, p, grad), value

    start = time.perf_counter()
    compiled = train_step.lower(params, lr).compile()
    compile_secs = time.perf_counter() - start
    p, first_loss = compiled(params, lr)
    jax.block_until_ready(p)
    times = []
    for _ in range(15):
        p = params
        start = time.perf_counter()
        for _ in range(200):
            p, _ = compiled(p, lr)
        jax.block_until_ready(p)
        times.append((time.perf_counter() - start) / 200)
    loop = "unrolled" if unroll else "scan" if name != "attention" else "-"
    print(
        f"jax {jax.__version__} {name} ({size}, loop {loop}) f64: compile {compile_secs:.3f} s; "
        f"{statistics.median(times) * 1e6:.1f} us/step (min {min(times) * 1e6:.1f}); "
        f"initial loss {float(first_loss):.17g}"
    )


if __name__ == "__main__":
    main()
