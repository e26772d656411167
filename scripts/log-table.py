#!/usr/bin/env python3
"""The table of `formulas::log` (src/op/formulas.rs), printed as the Rust file that holds it:
for each of the 128 subintervals of [0.6875, 1.375) that `Arith::log_split` indexes
(i < 80: [0.6875 + i/256, +1/256); i >= 80: [1 + (i - 80)/128, +1/128)), `1/c` rounded to a
double (`c` the subinterval's midpoint) and `-log(1/c)` (of the rounded `1/c`) as two
doubles, hi and lo, from mpmath at 60 digits. Needs mpmath (`.venv/bin/pip install mpmath`).

    .venv/bin/python scripts/log-table.py > src/op/log_table.rs
"""
import struct

import mpmath as mp

mp.mp.dps = 60


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


rows = []
for i in range(128):
    lo, width = (mp.mpf(0.6875) + mp.mpf(i) / 256, mp.mpf(1) / 256) if i < 80 else (
        mp.mpf(1) + mp.mpf(i - 80) / 128, mp.mpf(1) / 128)
    c = lo + width / 2
    invc = float(1 / c)
    logc = -mp.log(mp.mpf(invc))
    hi = float(logc)
    lo = float(logc - mp.mpf(hi))
    rows.append((invc, hi, lo))

print("""//! The table of [`super::formulas::log`], made by `scripts/log-table.py` (mpmath at 60 digits):
//! for each of the 128 subintervals [`crate::op::Arith::log_split`] indexes, `1/c` rounded
//! (`c` its midpoint) and `-log` of that, in two doubles, high and low.

use super::Table;
""")
for name, k in (("LOG_INVC", 0), ("LOG_C_HI", 1), ("LOG_C_LO", 2)):
    print(f"pub(super) static {name}: Table = Table::of_bits(")
    print(f'    "{name.lower()}",')
    print("    [")
    for r in rows:
        print(f"        0x{bits(r[k]):016x},")
    print("    ],")
    print(");")
