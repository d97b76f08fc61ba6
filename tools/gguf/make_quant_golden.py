#!/usr/bin/env python3
"""Expected dequantized values of GGUF tensor blocks, for tests/test_gguf_quant.c.

The outside reference is the `gguf` Python package (gguf.quants.dequantize, numpy, float32).
For every type kvlab dequantizes this writes blocks of raw bytes and the float32 values the
package computes from them, into tests/data/ggml_quant/<type>.bin:

    bytes 0-3    magic "KVGQ"
    u32          version 1
    u32          ggml type code
    u32          weights per block
    u32          bytes per block
    u32          number of blocks, nb
    nb * bytes   the blocks
    nb * block   float32, the expected values (their bits, little-endian)

The blocks are edge cases first, then random ones:
  * every special fp16 value (zeros of both signs, the smallest and largest subnormals, the
    smallest normal, +-1, +-65504, +-inf, quiet and signaling NaNs) in every fp16 field of the
    block (the scale, the minimum, the super-block steps), the other bytes random;
  * all codes and sub-block scales at their minimum (bytes 0x00) and at their maximum
    (0xff), Q6_K's signed scales at -128 and 127, each under a few scales;
  * blocks the package's own quantizer made from random normal rows (the types it can
    quantize), and blocks with a realistic small fp16 scale and random codes;
  * blocks of random bytes (random fp16 scales: NaN and infinity now and then).
For F32, F16 and BF16 the "blocks" are single values: the special bit patterns, then random.

sizes.txt lists every type the package knows: code, name, weights per block, bytes per block.

exhaustive.txt holds, for F16 and BF16, the SHA-256 of the float32 values (little-endian) of
all 65536 codes in order, so the test checks every code while the files stay small.

Run from the repository root:  python3 tools/gguf/make_quant_golden.py
Deterministic (fixed seeds): a rerun writes the same bytes.
"""
import hashlib
import os
import struct
import sys

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T
import gguf.quants

OUT = os.path.join("tests", "data", "ggml_quant")

# fp16 special values: +-0, min/max subnormal, min normal, +-1, +-max, +-inf, qNaN, sNaN
F16_SPECIAL = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x3C00, 0xBC00,
               0x7BFF, 0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0x7FFF]
# realistic steps of a weight matrix's blocks: 1e-3 .. 1e-1 and their negatives
F16_TYPICAL = [0x1419, 0x2266, 0x2E66, 0x9419, 0xA266]

# per type: (offsets of its fp16 fields, byte range of Q6_K-style signed scales or None,
#            number of blocks written)
LAYOUT = {
    T.Q4_0: ([0], None, 256),
    T.Q4_1: ([0, 2], None, 256),
    T.Q5_0: ([0], None, 256),
    T.Q5_1: ([0, 2], None, 256),
    T.Q8_0: ([0], None, 256),
    T.Q2_K: ([80, 82], None, 64),
    T.Q3_K: ([108], None, 64),
    T.Q4_K: ([0, 2], None, 64),
    T.Q5_K: ([0, 2], None, 64),
    T.Q6_K: ([208], (192, 208), 64),
}
QUANTIZABLE = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0}


def put_f16(block, off, code):
    block[off:off + 2] = np.frombuffer(struct.pack("<H", code), dtype=np.uint8)


def quantized_blocks(t, rng):
    """The edge cases, then random blocks, until the type's count is reached."""
    block, size = GGML_QUANT_SIZES[t]
    fields, signed_scales, count = LAYOUT[t]
    out = []

    def rand_block():
        return rng.integers(0, 256, size, dtype=np.uint8)

    # every special value in every fp16 field, the other fields typical or the same special
    for code in F16_SPECIAL:
        for f in fields:
            b = rand_block()
            for g in fields:
                put_f16(b, g, code if g == f else int(rng.choice(F16_TYPICAL)))
            out.append(b)
        if len(fields) > 1:
            b = rand_block()
            for g in fields:
                put_f16(b, g, code)
            out.append(b)
    # all codes (and sub-block scales) at their minimum and maximum, under a few scales
    for fill in (0x00, 0xFF):
        for code in (0x3C00, 0xBC00, 0x7BFF, 0x0001, 0x0000):
            b = np.full(size, fill, dtype=np.uint8)
            for g in fields:
                put_f16(b, g, code)
            out.append(b)
    if signed_scales:
        lo, hi = signed_scales
        for sc in (0x80, 0x7F, 0x00):
            b = rand_block()
            b[lo:hi] = sc
            put_f16(b, fields[0], int(rng.choice(F16_TYPICAL)))
            out.append(b)
    # the package's own quantizer on random normal rows
    if t in QUANTIZABLE:
        n_q = (count - len(out)) // 2
        rows = rng.standard_normal((n_q, block)).astype(np.float32)
        rows *= rng.choice([1e-3, 1e-2, 1.0, 100.0], size=(n_q, 1)).astype(np.float32)
        q = gguf.quants.quantize(rows, t).reshape(n_q, size)
        out.extend(np.array(r, dtype=np.uint8) for r in q)
    # typical scales with random codes, then random bytes
    while len(out) < count:
        b = rand_block()
        if len(out) % 2 == 0:
            for g in fields:
                put_f16(b, g, int(rng.choice(F16_TYPICAL)))
        out.append(b)
    return np.stack(out[:count])


def float_values(t, rng):
    """Single values of F32, F16 or BF16 as bytes."""
    if t == T.F32:
        special = [0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x3F800000,
                   0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                   0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF, 0x7FC12345]
        vals = np.array(special + list(rng.integers(0, 2**32, 240, dtype=np.uint64)),
                        dtype=np.uint32)
    else:
        special = F16_SPECIAL if t == T.F16 else [
            0x0000, 0x8000, 0x0001, 0x807F, 0x0080, 0x3F80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80,
            0x7FC0, 0xFFC0, 0x7F81, 0x7FBF, 0xFFFF]
        vals = np.array(special + list(rng.integers(0, 2**16, 497)), dtype=np.uint16)
    return vals.view(np.uint8).reshape(len(vals), -1)


def dequantize(t, blocks):
    with np.errstate(all="ignore"):  # NaN and infinite scales are meant
        out = gguf.quants.dequantize(np.ascontiguousarray(blocks).reshape(-1), t)
    return np.asarray(out, dtype=np.float32).reshape(-1)


def write(t, blocks):
    block, size = GGML_QUANT_SIZES[t]
    values = dequantize(t, blocks)
    assert blocks.shape == (len(blocks), size) and values.size == len(blocks) * block
    path = os.path.join(OUT, t.name.lower() + ".bin")
    with open(path, "wb") as f:
        f.write(b"KVGQ" + struct.pack("<5I", 1, int(t), block, size, len(blocks)))
        f.write(blocks.astype(np.uint8).tobytes())
        f.write(values.astype("<f4").tobytes())
    return path, os.path.getsize(path)


def main():
    if not os.path.isdir(os.path.join("tests", "data")):
        sys.exit("run from the repository root (tests/data/ not found)")
    os.makedirs(OUT, exist_ok=True)
    total = 0
    for t in [T.F32, T.F16, T.BF16] + list(LAYOUT):
        rng = np.random.default_rng(1000 + int(t))
        blocks = float_values(t, rng) if t in (T.F32, T.F16, T.BF16) else quantized_blocks(t, rng)
        path, n = write(t, blocks)
        total += n
        print(f"{path}: {len(blocks)} blocks, {n} bytes")
    lines = []
    for t in (T.F16, T.BF16):
        codes = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.uint8)
        values = dequantize(t, codes.reshape(65536, 2)).astype("<f4")
        lines.append(f"{t.name} {hashlib.sha256(values.tobytes()).hexdigest()}\n")
    with open(os.path.join(OUT, "exhaustive.txt"), "w") as f:
        f.write("".join(lines))
    with open(os.path.join(OUT, "sizes.txt"), "w") as f:
        for t, (block, size) in sorted(GGML_QUANT_SIZES.items(), key=lambda kv: int(kv[0])):
            f.write(f"{int(t)} {t.name} {block} {size}\n")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
