#!/usr/bin/env python3
"""Small GGUF files and what they hold, for tests/test_gguf.c and tests/test_gguf_model.c.

The outside writer is the `gguf` Python package (GGUFWriter): these files are what it writes,
and expected.txt is what the script gave it, cross-checked by reading each file back with the
package's own GGUFReader. kvlab's reader is held to that, never to itself.

Files (tests/data/gguf/):
  types_v3.gguf   every metadata value type (u8 ... f64, bool, string, the empty string),
                  arrays of every element type, arrays of strings, nested arrays (arrays of
                  arrays of numbers, of strings, three levels deep); tensors of 1 to 4 dims
                  (F32, F16, I8, I32, Q8_0, Q4_1)
  types_v2.gguf   the same bytes with version 2 (v2 and v3 share the layout: v3 only allowed
                  big-endian files)
  align64.gguf    general.alignment 64, tensors whose sizes are not multiples of it
  tiny_llama.gguf a two-layer Llama (dim 32, H 4, H_kv 2, hidden 64, vocab 40), untied
                  classifier, weights in Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16 and F32
  not_llama.gguf  general.architecture qwen2, no tensors
  llama_rope.gguf the tiny Llama's keys with llama.rope.scaling.type "none" and one tensor,
                  Llama 3's rope_freqs.weight with random factors (one negative, which the
                  loader refuses by name)

expected.txt, one fact a line (strings as hex bytes, floats as %.17g of their exact value):
  file NAME VERSION ALIGNMENT N_KV N_TENSORS
  kv KEY TYPE VALUE                     a scalar (TYPE the GGUF type name)
  kv KEY array ELEMTYPE N V1 V2 ...     an array of numbers or strings
  kv KEY array array N                  an array of arrays (count only)
  tensor NAME TYPE N_DIMS NE0 NE1 NE2 NE3 OFFSET NBYTES FNV1A64   the data's 64-bit FNV-1a
  config DIM HIDDEN L H H_KV VOCAB SEQ THETA EPS ROT TIED         tiny_llama's kv_config
  weight NAME INDEX VALUE               a dequantized weight (gguf.quants.dequantize), flat
                                        index in the row-major [ne1][ne0] matrix
  sum NAME N SUM                        the sum of a tensor's N dequantized weights (double)

  kvhash KEY TYPE N FNV1A64              a long array: the hash of its elements as the file
                                        stores them (a string as its u64 length and bytes)

Run from the repository root:  python3 tools/gguf/make_test_files.py
Deterministic (fixed seed): a rerun writes the same bytes.

With --real FILE it describes SmolLM2-135M-Instruct.Q4_1.gguf instead (as the package reads
it: every key, each array longer than 64 by its hash, the tensor table, the config and the
dequantized weights of a few tensors) into tests/data/gguf/smollm2.txt, for
tests/test_gguf_realmodel.c:  python3 tools/gguf/make_test_files.py --real PATH
"""
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFValueType as VT, GGUFWriter, GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

OUT = os.path.join("tests", "data", "gguf")
NAMES = {VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32",
         VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool", VT.STRING: "string",
         VT.ARRAY: "array", VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64"}
lines = []


def fnv1a64(b):
    h = 0xcbf29ce484222325
    for x in b:
        h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def num(t, v):
    """A value as expected.txt writes it: exact for every type."""
    if t == VT.FLOAT32:
        return "%.17g" % float(np.float32(v))
    if t == VT.FLOAT64:
        return "%.17g" % float(v)
    if t == VT.BOOL:
        return "1" if v else "0"
    if t == VT.STRING:
        b = v.encode("utf-8") if isinstance(v, str) else v
        return b.hex() if b else "-"
    return str(int(v))


def expect_kv(key, t, v, sub=None):
    if t != VT.ARRAY:
        lines.append("kv %s %s %s" % (key, NAMES[t], num(t, v)))
    elif sub == VT.ARRAY:
        lines.append("kv %s array array %d" % (key, len(v)))
    else:
        lines.append("kv %s array %s %d %s" % (key, NAMES[sub], len(v),
                                               " ".join(num(sub, x) for x in v)))


def add(w, key, t, v, sub=None):
    w.add_key_value(key, v, t, sub_type=sub)
    expect_kv(key, t, v, sub)


def every_type(w):
    scalars = [(VT.UINT8, 255), (VT.INT8, -128), (VT.UINT16, 65535), (VT.INT16, -32768),
               (VT.UINT32, 4294967295), (VT.INT32, -2147483648), (VT.FLOAT32, 3.14159265),
               (VT.BOOL, True), (VT.UINT64, 18446744073709551615),
               (VT.INT64, -9223372036854775808), (VT.FLOAT64, -2.718281828459045)]
    for t, v in scalars:
        add(w, "test.scalar." + NAMES[t], t, v)
    add(w, "test.bool_false", VT.BOOL, False)
    add(w, "test.u32_small", VT.UINT32, 7)
    add(w, "test.f32_int", VT.FLOAT32, 1e5)
    add(w, "test.string", VT.STRING, "kvlab reads GGUF: \u00e9\u00e8 \u2713 tab\there")
    add(w, "test.empty_string", VT.STRING, "")
    arrays = [(VT.UINT8, [0, 1, 255]), (VT.INT8, [-128, 0, 127]), (VT.UINT16, [0, 65535]),
              (VT.INT16, [-32768, 32767, 5]), (VT.UINT32, [1, 2, 4294967295]),
              (VT.INT32, [-1, 0, 1, 2147483647]), (VT.FLOAT32, [0.5, -1e-3, 65504.0, 1e30]),
              (VT.BOOL, [True, False, True]), (VT.UINT64, [0, 2**63, 2**64 - 1]),
              (VT.INT64, [-(2**63), 2**62]), (VT.FLOAT64, [1.0 / 3, -1e300]),
              (VT.STRING, ["a", "", "<|im_start|>", "\u0120the", "x" * 300])]
    for t, v in arrays:
        add(w, "test.array." + NAMES[t], VT.ARRAY, v, t)
    add(w, "test.array.long_i32", VT.ARRAY, list(range(1000)), VT.INT32)
    add(w, "test.nested.i32", VT.ARRAY, [[1, 2, 3], [4], [5, 6]], VT.ARRAY)
    add(w, "test.nested.strings", VT.ARRAY, [["a", "bc"], ["d"]], VT.ARRAY)
    add(w, "test.nested.deep", VT.ARRAY, [[[1], [2, 3]], [[4]]], VT.ARRAY)


def tensors(w, rng, shapes):
    """Tensors of the given (name, numpy shape, type); returns them for the expectations."""
    out = []
    for name, shape, qt in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        if qt == QT.F32:
            data = x
        elif qt == QT.F16:
            data = x.astype(np.float16)
        elif qt == QT.I8:
            data = (x * 40).astype(np.int8)
        elif qt == QT.I32:
            data = (x * 1e6).astype(np.int32)
        else:
            data = quantize(x, qt)
        w.add_tensor(name, data, raw_dtype=qt if data.dtype == np.uint8 else None)
        out.append(name)
    return out


def write(name, fill, version=3, arch="kvlab-test"):
    path = os.path.join(OUT, name)
    w = GGUFWriter(path, arch=arch)  # it writes general.architecture first
    start = len(lines)
    lines.append(None)  # the file line, once the reader has seen the file
    expect_kv("general.architecture", VT.STRING, arch)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if version != 3:  # the same layout under another version number
        with open(path, "r+b") as f:
            f.seek(4)
            f.write(version.to_bytes(4, "little"))
    r = GGUFReader(path)
    check_back(r, lines[start + 1:])
    align = int(r.fields["general.alignment"].contents()) if "general.alignment" in r.fields else 32
    lines[start] = "file %s %d %d %d %d" % (name, version, align, len(r.fields) - 3, len(r.tensors))
    describe_tensors(r)
    return r


def check_back(r, mine):
    """The package's reader agrees with what was handed to its writer."""
    for ln in mine:
        if ln is None or not ln.startswith("kv "):
            continue
        _, key, t = ln.split(" ", 3)[:3]
        f = r.fields[key]
        got = f.contents()
        want = ln.split(" ", 3)[3] if t != "array" else None
        if t == "string":
            assert (got.encode("utf-8").hex() or "-") == want, key
        elif t != "array":
            assert num(f.types[0], got) == want, (key, got, want)
        elif f.types[1] != VT.ARRAY:
            assert " ".join(num(f.types[1], x) for x in got) == ln.split(" ", 5)[5], key


def arch_keys(w, arch, c):
    """The llama.* keys the loader reads, and expected.txt's config line."""
    w.add_uint32(arch + ".block_count", c["L"])
    w.add_uint32(arch + ".context_length", c["seq"])
    w.add_uint32(arch + ".embedding_length", c["dim"])
    w.add_uint32(arch + ".feed_forward_length", c["hidden"])
    w.add_uint32(arch + ".attention.head_count", c["H"])
    w.add_uint32(arch + ".attention.head_count_kv", c["Hkv"])
    w.add_float32(arch + ".rope.freq_base", c["theta"])
    w.add_float32(arch + ".attention.layer_norm_rms_epsilon", c["eps"])
    w.add_uint32(arch + ".rope.dimension_count", c["dim"] // c["H"])
    w.add_uint32(arch + ".vocab_size", c["vocab"])


TINY = dict(dim=32, hidden=64, L=2, H=4, Hkv=2, vocab=40, seq=128, theta=500000.0, eps=1e-6)


def llama_rope(w, rng):
    arch_keys(w, "llama", TINY)
    w.add_string("llama.rope.scaling.type", "none")
    tensors(w, rng, [("rope_freqs.weight", (TINY["dim"] // TINY["H"] // 2,), QT.F32)])


def tiny_llama(w, rng):
    c = TINY
    arch_keys(w, "llama", c)
    kvd = c["dim"] // c["H"] * c["Hkv"]
    d, h, v = c["dim"], c["hidden"], c["vocab"]
    shapes = [("token_embd.weight", (v, d), QT.Q8_0)]
    for layer, (qa, qb) in enumerate([(QT.Q4_0, QT.Q4_1), (QT.Q5_0, QT.Q5_1)]):
        b = "blk.%d." % layer
        shapes += [(b + "attn_norm.weight", (d,), QT.F32), (b + "attn_q.weight", (d, d), qa),
                   (b + "attn_k.weight", (kvd, d), qb), (b + "attn_v.weight", (kvd, d), QT.Q8_0),
                   (b + "attn_output.weight", (d, d), QT.F16), (b + "ffn_norm.weight", (d,), QT.F32),
                   (b + "ffn_gate.weight", (h, d), qa), (b + "ffn_down.weight", (d, h), qb),
                   (b + "ffn_up.weight", (h, d), QT.BF16)]
    shapes += [("output_norm.weight", (d,), QT.F32), ("output.weight", (v, d), QT.Q4_1)]
    tensors(w, rng, shapes)
    lines.append("config %d %d %d %d %d %d %d %.17g %.17g %d %d" % (
        d, h, c["L"], c["H"], c["Hkv"], v, c["seq"], float(np.float32(c["theta"])),
        float(np.float32(c["eps"])), d // c["H"], 0))


def weights(r, only=None):
    """Sample dequantized weights and each tensor's sum, as the package computes them."""
    for t in r.tensors:
        if only is not None and t.name not in only:
            continue
        x = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        n = x.size
        for i in sorted({0, 1, n // 3, n // 2 + 1, n - 1}):
            lines.append("weight %s %d %.9g" % (t.name, i, float(x[i])))
        lines.append("sum %s %d %.17g" % (t.name, n, float(np.sum(x.astype(np.float64)))))


def describe_tensors(r):
    for t in r.tensors:
        raw = bytes(np.asarray(t.data).view(np.uint8).reshape(-1))
        ne = list(int(n) for n in t.shape) + [1] * (4 - len(t.shape))
        lines.append("tensor %s %d %d %d %d %d %d %d %d %d" % (
            t.name, int(t.tensor_type), len(t.shape), *ne, t.data_offset - r.data_offset,
            t.n_bytes, fnv1a64(raw)))


def real(path):
    """The real model as the package reads it: nothing here is typed in by hand."""
    r = GGUFReader(path)
    f = r.fields
    align = int(f["general.alignment"].contents()) if "general.alignment" in f else 32
    lines.append("file %s %d %d %d %d" % (os.path.basename(path), int(f["GGUF.version"].contents()),
                                          align, len(f) - 3, len(r.tensors)))
    for key, fld in f.items():
        if key.startswith("GGUF."):
            continue
        t = fld.types[0]
        if t != VT.ARRAY:
            expect_kv(key, t, fld.contents())
        elif len(fld.data) <= 64 and fld.types[1] != VT.ARRAY:
            expect_kv(key, t, fld.contents(), fld.types[1])
        else:
            h = 0xcbf29ce484222325
            for idx in fld.data:
                b = bytes(fld.parts[idx].tobytes())
                if fld.types[1] == VT.STRING:
                    b = len(b).to_bytes(8, "little") + b
                for x in b:
                    h = ((h ^ x) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
            lines.append("kvhash %s %s %d %d" % (key, NAMES[fld.types[1]], len(fld.data), h))
    describe_tensors(r)
    a = "llama."
    get = lambda k: f[a + k].contents()
    dim, heads = int(get("embedding_length")), int(get("attention.head_count"))
    tied = 0 if any(t.name == "output.weight" for t in r.tensors) else 1
    lines.append("config %d %d %d %d %d %d %d %.17g %.17g %d %d" % (
        dim, int(get("feed_forward_length")), int(get("block_count")), heads,
        int(get("attention.head_count_kv")), int(get("vocab_size")), int(get("context_length")),
        float(get("rope.freq_base")), float(get("attention.layer_norm_rms_epsilon")),
        int(get("rope.dimension_count")), tied))
    some = {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
            "blk.0.attn_norm.weight", "blk.15.ffn_up.weight", "blk.29.ffn_down.weight",
            "output_norm.weight"}
    weights(r, some)
    with open(os.path.join(OUT, "smollm2.txt"), "w") as out:
        out.write("# made by tools/gguf/make_test_files.py --real (the gguf package's GGUFReader "
                  "and dequantize)\n")
        out.write("\n".join(lines) + "\n")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--real":
        return real(sys.argv[2])
    if not os.path.isdir("tests"):
        sys.exit("run from the repository root")
    os.makedirs(OUT, exist_ok=True)
    rng = np.random.default_rng(20261207)
    shapes = [("f32.matrix", (5, 3), QT.F32), ("f16.vector", (7,), QT.F16),
              ("i8.cube", (2, 2, 2), QT.I8), ("i32.four", (3, 1, 2, 1), QT.I32),
              ("q8_0.rows", (2, 64), QT.Q8_0), ("q4_1.row", (32,), QT.Q4_1)]

    def types(w):
        every_type(w)
        tensors(w, rng, shapes)
    write("types_v3.gguf", types)
    rng = np.random.default_rng(20261207)  # the same tensors again
    write("types_v2.gguf", types, version=2)

    def align64(w):
        w.add_custom_alignment(64)
        expect_kv("general.alignment", VT.UINT32, 64)
        tensors(w, rng, [("a", (3,), QT.F32), ("b", (5, 3), QT.F16), ("c", (1, 32), QT.Q8_0)])
    write("align64.gguf", align64)
    weights(write("tiny_llama.gguf", lambda w: tiny_llama(w, rng), arch="llama"))
    write("not_llama.gguf", lambda w: None, arch="qwen2")
    write("llama_rope.gguf", lambda w: llama_rope(w, rng), arch="llama")
    with open(os.path.join(OUT, "expected.txt"), "w") as f:
        f.write("# made by tools/gguf/make_test_files.py (the gguf package's GGUFWriter)\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
