#!/usr/bin/env python3
"""Expected Q8_0 and binary16 rows of fp32 weights, for tests/test_gguf_requant.c.

The outside reference is the `gguf` Python package (gguf.quants.quantize, numpy): what
`--weights q8_0` and `--weights f16` must write, byte for byte. For each of the two types this
writes tests/data/ggml_quant/requant_<type>.bin:

    bytes 0-3    magic "KVGR"
    u32          version 1
    u32          ggml type code (8 Q8_0, 1 F16)
    u32          number of float32 inputs, n (a multiple of 32)
    n * 4        the inputs (float32 bits, little-endian)
    then         the package's quantized bytes of the n inputs as one row

The inputs are edge cases first, then random rows:
  * a block of zeros, blocks of one nonzero value, blocks whose codes fall on halves
    (x * 127 / max|x| = k + 1/2: roundf takes them away from zero), negative maxima;
  * scales from 1e-30 (a step below binary16's subnormals) to 1e6 (a step beyond 65504);
  * for F16: values halfway between binary16 neighbours (ties to even), 65504, 65519.99,
    65520 (to infinity), the subnormals' edges, +-infinity;
  * random normal rows at scales 1e-3 .. 10.

Run from the repository root:  python3 tools/gguf/make_requant_golden.py
Deterministic (fixed seed): a rerun writes the same bytes.
"""
import os
import struct

import numpy as np
from gguf.constants import GGMLQuantizationType as T
import gguf.quants

OUT = os.path.join("tests", "data", "ggml_quant")


def edge_blocks():
    rows = [np.zeros(32, np.float32)]
    one = np.zeros(32, np.float32)
    one[5] = 3.0
    rows.append(one)
    one = np.zeros(32, np.float32)
    one[31] = -7.5
    rows.append(one)
    # codes on halves: max 127, the others k + 0.5
    half = (np.arange(32, dtype=np.float32) - 16.0) + 0.5
    half[0] = 127.0
    rows.append(half)
    rows.append(-half)
    rows.append(half * np.float32(0.25))
    for s in [1e-30, 1e-8, 1e-5, 6.1e-5 * 127, 1.0, 1000.0, 65504.0 * 127, 1e6 * 127]:
        rows.append((np.linspace(-1.0, 1.0, 32, dtype=np.float32) * np.float32(s)).astype(np.float32))
    return rows


def f16_edges():
    v = [65504.0, -65504.0, 65519.99, 65520.0, -65520.0, 1e9, np.inf, -np.inf,
         2.0 ** -14, 2.0 ** -24, 2.0 ** -25, 2.0 ** -25 * 1.0001, 2.0 ** -26, -2.0 ** -25,
         1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -12, 2048.0 + 1.0, 2048.0 + 3.0,
         0.1, -0.1, 1.0 / 3.0, 0.0, -0.0]
    v += [0.0] * (-len(v) % 32)
    return [np.array(v, np.float32)]


def main():
    rng = np.random.default_rng(20260)
    for typ, name in [(T.Q8_0, "q8_0"), (T.F16, "f16")]:
        rows = edge_blocks() + (f16_edges() if typ == T.F16 else [])
        for s in [1e-3, 0.02, 1.0, 10.0]:
            rows.append((rng.standard_normal(32 * 8) * s).astype(np.float32))
        x = np.concatenate(rows).astype(np.float32)
        with np.errstate(all="ignore"):
            q = gguf.quants.quantize(x.reshape(1, -1), typ)
        path = os.path.join(OUT, "requant_%s.bin" % name)
        with open(path, "wb") as f:
            f.write(b"KVGR" + struct.pack("<III", 1, int(typ), x.size))
            f.write(x.astype("<f4").tobytes())
            f.write(q.tobytes())
        print("%s: %d inputs, %d bytes" % (path, x.size, q.nbytes))


if __name__ == "__main__":
    main()
