#!/usr/bin/env python3
"""The coefficients of tanh's odd series in src/op/formulas.rs (`odd_series`), and the error
of the fit: P(s), of degree 11 in s = a^2, interpolates (tanh(a) / a - 1) / s at the
Chebyshev nodes of [0, 0.625^2], in 60-digit arithmetic, then is rounded to doubles.

Needs mpmath (`pip install mpmath`; not needed by the build or the tests):

    python3 scripts/fit-tanh.py

prints, for degrees 9..13, the largest relative error of a + a s P(s) against tanh(a) on
[0, 0.625] (in ULP of 2^-53), then degree 11's coefficients as the bit patterns formulas.rs
holds.
"""
import struct

import mpmath as mp

mp.mp.dps = 60
SPLIT = mp.mpf("0.625")
S0 = SPLIT * SPLIT


def g(s):
    if s == 0:
        return mp.mpf(-1) / 3
    a = mp.sqrt(s)
    return (mp.tanh(a) / a - 1) / s


def fit(n):
    nodes = [S0 / 2 + S0 / 2 * mp.cos(mp.pi * (2 * i + 1) / (2 * (n + 1))) for i in range(n + 1)]
    a = mp.matrix([[x**j for j in range(n + 1)] for x in nodes])
    c = mp.lu_solve(a, mp.matrix([g(x) for x in nodes]))
    return [c[j] for j in range(n + 1)]


def worst(coefficients):
    doubles = [float(c) for c in coefficients]
    err = mp.mpf(0)
    for i in range(1, 2001):
        a = SPLIT * i / 2000
        s = a * a
        p = mp.mpf(0)
        for c in reversed(doubles):
            p = p * s + mp.mpf(c)
        err = max(err, abs((a + a * s * p) / mp.tanh(a) - 1))
    return err


for n in range(9, 14):
    print(f"degree {n}: {mp.nstr(worst(fit(n)) / mp.mpf(2) ** -53, 4)} ULP")
for c in fit(11):
    d = float(c)
    print("0x%016x, // %r" % (struct.unpack("<Q", struct.pack("<d", d))[0], d))
