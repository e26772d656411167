#!/usr/bin/env python3
"""How far tapejit's formula of a math function lies from the true value, in ULP, beside
libm's (Python's math module): the largest error, the mean, and how many results are not
the correctly rounded one, over N points (special values, then random points over the
function's ranges, seeded), the true value in mpmath at 40 digits.

Needs the Python package built (`bash scripts/test` builds it into .venv) and mpmath
(`.venv/bin/pip install mpmath`; not needed by the build or the tests):

    .venv/bin/python scripts/ulp-error.py exp 1000000
    .venv/bin/python scripts/ulp-error.py tanh 1000000
    .venv/bin/python scripts/ulp-error.py pow-1.5 1000000    # powf(-1.5)
    .venv/bin/python scripts/ulp-error.py log 1000000
    .venv/bin/python scripts/ulp-error.py log1p 1000000
    .venv/bin/python scripts/ulp-error.py sin 1000000
    .venv/bin/python scripts/ulp-error.py cos 1000000
    .venv/bin/python scripts/ulp-error.py pow 1000000        # x ** c for constants c of every kind

tapejit's numbers are the interpreter's (`Value(x).exp().data`), which every backend gives.
"""
import math
import random
import sys

import mpmath as mp
from tapejit import Value

mp.mp.dps = 40


def points(name, n):
    rng = random.Random(12)
    special = [0.0, -0.0, 1.0, -1.0, 0.5, 5e-324, -5e-324, 2.0**-30, -(2.0**-30)]
    if name == "pow-1.5":
        # Positive numbers of every binade (subnormals, and where a sqrt(a) would overflow or
        # be subnormal), and plain ranges.
        special = [1.0, 2.0, 4.0, 0.25, 2.0**-1022, 5e-324, 1.7976931348623157e308, 2.0**600,
                   2.0**-600, 2.0**682, 2.0**-682, 2.0**716, 1e-300, 1e300]
        ranges = [(0.0, 2.0), (0.5, 100.0), (1e-4, 1.0), (1.0, 1e6)]
        xs = list(special)
        while len(xs) < n:
            i = len(xs)
            if i % 5 == 4:
                xs.append(2.0 ** rng.uniform(-1074, 1024) if rng.random() < 0.95
                          else rng.uniform(5e-324, 2.0**-1022))
            else:
                lo, hi = ranges[i % 5]
                x = rng.uniform(lo, hi)
                xs.append(x if x > 0 else 1.0)
        return xs[:n]
    if name == "log":
        # Positive numbers of every binade (subnormals too), around 1 (the near-1 window's
        # edges at 1 +- 1/16), and plain ranges.
        special = [1.0, 2.0, 0.5, 5e-324, 2.0**-1022, 1.7976931348623157e308, 1.0625, 0.9375,
                   1.0 + 2.0**-52, 1.0 - 2.0**-53, 0.6875, 1.375, math.e]
        ranges = [(0.5, 2.0), (0.9, 1.1), (1.0 - 1e-6, 1.0 + 1e-6), (1e-3, 1e3)]
        xs = list(special)
        while len(xs) < n:
            i = len(xs)
            if i % 5 == 4:
                xs.append(2.0 ** rng.uniform(-1074, 1024) if rng.random() < 0.95
                          else rng.uniform(5e-324, 2.0**-1022))
            else:
                lo, hi = ranges[i % 5]
                xs.append(rng.uniform(lo, hi))
        return [x for x in xs[:n] if x > 0]
    if name == "log1p":
        special = [0.0, -0.0, 1.0, -0.5, 0.0625, -0.0625, 5e-324, -1e-300, 2.0**-30, -(2.0**-30),
                   1.7976931348623157e308, -1.0 + 2.0**-53, 1e-8, 0.375, -0.3125]
        ranges = [(-0.07, 0.07), (-1.0, 1.0), (-1.0, -0.9), (1.0, 1e6)]
        xs = list(special)
        while len(xs) < n:
            i = len(xs)
            if i % 5 == 4:
                xs.append(rng.choice([1, -1]) * 2.0 ** rng.uniform(-60, 0) if rng.random() < 0.5
                          else 2.0 ** rng.uniform(0, 1024))
            else:
                lo, hi = ranges[i % 5]
                xs.append(rng.uniform(lo, hi))
        return [x for x in xs[:n] if x > -1]
    if name == "pow":
        # (x, c): exponents of every kind (odd, even, non-integral, either sign, small and
        # large), bases over the range where the power is finite and non-zero, near 1, and
        # negative ones for integral exponents.
        exponents = [3.0, -3.0, 4.0, -2.0, 2.5, -0.75, 1 / 3, 0.25, 7.0, 1.1, -5.0, 1e-3, 151.0,
                     -40.5, 1.5, 0.1]
        pairs = [(2.0, 3.0), (3.0, 3.0), (10.0, 2.5), (0.5, 1.1), (1.0 + 2.0**-52, 1e3)]
        while len(pairs) < n:
            i = len(pairs)
            c = exponents[i % len(exponents)]
            bound = min(1000.0 / abs(c), 1000.0)
            x = 2.0 ** rng.uniform(-bound, bound) if i % 3 else rng.uniform(0.9, 1.1)
            if i % 7 == 0:
                # Results subnormal, or overflowing.
                x = 2.0 ** rng.uniform(-min(1080 / abs(c), 1074), min(1030 / abs(c), 1023))
            if c == int(c) and rng.random() < 0.5:
                x = -x
            pairs.append((x, c))
        return pairs[:n]
    if name in ("sin", "cos"):
        # Every range the reduction covers (up to 2^20), points within a few ULP of multiples
        # of pi/2 (where it cancels), tiny arguments, and beyond 2^20 (libm's, as a check).
        special += [math.pi / 2, math.pi, 3 * math.pi / 2, 2 * math.pi, 1e5, 2.0**20 - 1,
                    math.pi / 4, -math.pi / 4, 2.0**-27, 1e-300, 1e22]
        xs = list(special)
        while len(xs) < n:
            i = len(xs)
            k = i % 6
            if k == 0:
                xs.append(rng.uniform(-4.0, 4.0))
            elif k == 1:
                xs.append(rng.uniform(-2.0**20, 2.0**20))
            elif k == 2:
                xs.append(rng.uniform(-0.8, 0.8))
            elif k == 3:
                xs.append(rng.choice([1, -1]) * 2.0 ** rng.uniform(-60, 20))
            elif k == 4:
                near = float(rng.randrange(-600_000, 600_000) * mp.pi / 2)
                for _ in range(rng.randrange(0, 4)):
                    near = math.nextafter(near, rng.choice([-math.inf, math.inf]))
                xs.append(near)
            else:
                xs.append(rng.uniform(-1e9, 1e9) if rng.random() < 0.1 else rng.uniform(-10.0, 10.0))
        return xs[:n]
    if name == "exp":
        special += [709.782712893384, 709.78, -745.1332191019411, -708.4, -745.0]
        ranges = [(-745.2, 709.8), (-1.0, 1.0), (-20.0, 20.0), (-745.2, -708.0)]
    else:
        special += [0.625, -0.625, 21.9, -21.9, 1e-8]
        ranges = [(-1.0, 1.0), (-0.625, 0.625), (-22.0, 22.0), (0.6, 0.65)]
    xs = list(special)
    while len(xs) < n:
        i = len(xs)
        if i % 5 == 4:
            xs.append(rng.choice([1, -1]) * 2.0 ** rng.uniform(-60, 0))
        else:
            lo, hi = ranges[i % 5]
            xs.append(rng.uniform(lo, hi))
    return xs[:n]


def ulp_error(got, true):
    """|got - true| in ULP at `true`; 0 for an overflow both round to infinity."""
    if math.isinf(got):
        return mp.mpf(0) if got == float(true) else mp.inf
    return abs(mp.mpf(got) - true) / ulp(true)


def ulp(true):
    """The spacing of doubles at `true` (subnormals: 2^-1074)."""
    if true == 0:
        return mp.mpf(2) ** -1074
    e = int(mp.floor(mp.log(abs(true), 2)))
    return mp.mpf(2) ** (max(e, -1022) - 52)


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "exp"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    ours = {
        "exp": lambda x: Value(x).exp().data,
        "tanh": lambda x: Value(x).tanh().data,
        "pow-1.5": lambda x: (Value(x) ** -1.5).data,
        "log": lambda x: Value(x).log().data,
        "log1p": lambda x: Value(x).log1p().data,
        "sin": lambda x: Value(x).sin().data,
        "cos": lambda x: Value(x).cos().data,
        "pow": lambda x, c: (Value(x) ** c).data,
    }[name]
    libm = {"exp": math.exp, "tanh": math.tanh, "pow-1.5": lambda x: math.pow(x, -1.5),
            "log": math.log, "log1p": math.log1p, "sin": math.sin, "cos": math.cos,
            "pow": math.pow}[name]
    true_fn = {"exp": mp.exp, "tanh": mp.tanh, "pow-1.5": lambda x: x ** mp.mpf(-1.5),
               "log": mp.log, "log1p": mp.log1p, "sin": mp.sin, "cos": mp.cos,
               "pow": lambda x, c: mp.power(x, mp.mpf(c))}[name]
    # Per function: max error, its x, total, not correctly rounded, max over normal results.
    stats = {who: [mp.mpf(0), None, mp.mpf(0), 0, mp.mpf(0)] for who in ("tapejit", "libm")}
    smallest_normal = mp.mpf(2) ** -1022
    for x in points(name, n):
        args = x if isinstance(x, tuple) else (x,)
        true = true_fn(mp.mpf(args[0]), *args[1:])
        rounded = float(true)
        for who, f in (("tapejit", ours), ("libm", libm)):
            try:
                got = f(*args)
            except OverflowError:
                got = math.copysign(math.inf, true)
            err = ulp_error(got, true)
            s = stats[who]
            s[2] += err
            s[3] += got != rounded
            if err > s[0]:
                s[0], s[1] = err, x
            if abs(true) >= smallest_normal and err > s[4]:
                s[4] = err
    print(f"{name} on {n} points (seeded), ULP error: max (at x), max where the result is")
    print("normal, mean; results not correctly rounded")
    for who, (worst, at, total, wrong, normal) in stats.items():
        print(
            f"  {who:8} {float(worst):.3f} (x = {at!r})  {float(normal):.3f}  "
            f"mean {float(total / n):.4f}  {wrong} ({wrong / n:.2%})"
        )


if __name__ == "__main__":
    main()
