#!/usr/bin/env python3
"""A tiny Llama 3.1-style GGUF file with RoPE frequency factors, for tests/test_gguf_llama3.c.

Writes tests/data/gguf/llama3_rope.gguf with the `gguf` Python package (GGUFWriter): arch
llama, 3 layers, dim 32, 2 query heads over 1 KV head (GQA, G = 2, head dim 16: 8 RoPE pairs),
SwiGLU 64, theta 500000, RMSNorm eps 1e-5, tied classifier, every tensor F32 (so llama.cpp's
matmuls are fp32 too), weights drawn from numpy with a fixed seed. Its tokenizer is Llama 3's
(gpt2 byte-level BPE, pre-tokenizer llama-bpe) cut to its first VOCAB_KEEP tokens (the 256
byte tokens and the first merges) and the merges among them, then <|begin_of_text|> and
<|end_of_text|> as control tokens, copied from llama.cpp's ggml-vocab-llama-bpe.gguf.

The tensor rope_freqs.weight holds Llama 3.1's factors as llama.cpp's converter computes them
(conversion/llama.py, rope_type "llama3"): for pair i of frequency f_i = theta^(-2i/d) and
wavelength w_i = 2 pi / f_i, with factor 8, low_freq_factor 1, high_freq_factor 4 and an
original context of 8192 tokens,
    w_i < 8192 / 4  -> 1            (fast pairs: unchanged)
    w_i > 8192 / 1  -> 8            (slow pairs: 8 times slower)
    else            -> 1 / ((1 - s) / 8 + s),  s = (8192 / w_i - 1) / (4 - 1)
At theta 500000 and d 16 the wavelengths run from 6 to 6e5 tokens: pairs 0-3 keep factor 1,
pair 4 is smoothed, pairs 5-7 get 8.

Beside it, tests/data/gguf/llama_linear.gguf: the same llama.* keys with the older linear
RoPE scaling (rope.scaling.type linear, rope.scaling.factor 4: every pair 4 times slower, as
llama.cpp's freq_scale 1/4) and no tensors, for the config alone.

Then tools/peer/make-llama3-expected.sh runs llama.cpp's dump_logits on llama3_rope.gguf.

Run from the repository root:
  python3 tools/gguf/make_llama3_rope.py [--vocab ~/.cache/kvlab/models/ggml-vocab-llama-bpe.gguf]
Deterministic (fixed seed): a rerun writes the same bytes.
"""
import math
import os
import sys

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGMLQuantizationType as QT, TokenType

OUT = "tests/data/gguf/llama3_rope.gguf"
OUT_LINEAR = "tests/data/gguf/llama_linear.gguf"
SEED = 3101
VOCAB_KEEP = 384
C = dict(L=3, dim=32, H=2, Hkv=1, hidden=64, seq=8192, theta=500000.0, eps=1e-5)
LLAMA31 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original=8192)


def llama31_factors(theta, d, p):
    """conversion/llama.py's rule, in float32 frequencies as it computes them"""
    freqs = 1.0 / (np.float32(theta) ** (np.arange(0, d, 2, dtype=np.float32) / np.float32(d)))
    low_wavelen = p["original"] / p["low_freq_factor"]
    high_wavelen = p["original"] / p["high_freq_factor"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / float(f)
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(p["factor"])
        else:
            s = (p["original"] / wavelen - p["low_freq_factor"]) / (
                p["high_freq_factor"] - p["low_freq_factor"])
            out.append(1 / ((1 - s) / p["factor"] + s))
    return np.array(out, dtype=np.float32)


def strings(r, key):
    f = r.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def cut_vocab(path):
    """the first VOCAB_KEEP tokens, the merges whose parts and result are among them, BOS, EOS"""
    r = GGUFReader(path)
    tokens = strings(r, "tokenizer.ggml.tokens")[:VOCAB_KEEP]
    keep = set(tokens)
    merges = []
    for m in strings(r, "tokenizer.ggml.merges"):
        a, b = m.split(" ", 1)
        if a in keep and b in keep and a + b in keep:
            merges.append(m)
    types = [TokenType.NORMAL] * len(tokens)
    tokens += ["<|begin_of_text|>", "<|end_of_text|>"]
    types += [TokenType.CONTROL, TokenType.CONTROL]
    return tokens, types, merges


def llama_keys(w, d, n_vocab):
    w.add_uint32("llama.block_count", C["L"])
    w.add_uint32("llama.context_length", C["seq"])
    w.add_uint32("llama.embedding_length", C["dim"])
    w.add_uint32("llama.feed_forward_length", C["hidden"])
    w.add_uint32("llama.attention.head_count", C["H"])
    w.add_uint32("llama.attention.head_count_kv", C["Hkv"])
    w.add_float32("llama.rope.freq_base", C["theta"])
    w.add_float32("llama.attention.layer_norm_rms_epsilon", C["eps"])
    w.add_uint32("llama.rope.dimension_count", d)
    w.add_uint32("llama.vocab_size", n_vocab)


def write_linear(d, n_vocab):
    w = GGUFWriter(OUT_LINEAR, arch="llama")
    llama_keys(w, d, n_vocab)
    w.add_string("llama.rope.scaling.type", "linear")
    w.add_float32("llama.rope.scaling.factor", 4.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    vocab = os.path.expanduser("~/.cache/kvlab/models/ggml-vocab-llama-bpe.gguf")
    if len(sys.argv) == 3 and sys.argv[1] == "--vocab":
        vocab = sys.argv[2]
    elif len(sys.argv) != 1:
        sys.exit("usage: make_llama3_rope.py [--vocab ggml-vocab-llama-bpe.gguf]")
    tokens, types, merges = cut_vocab(vocab)
    n_vocab = len(tokens)
    d = C["dim"] // C["H"]
    factors = llama31_factors(C["theta"], d, LLAMA31)

    w = GGUFWriter(OUT, arch="llama")
    w.add_name("kvlab-llama3-rope-test")
    llama_keys(w, d, n_vocab)
    w.add_uint32("general.file_type", 0)  # all F32
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(n_vocab - 2)
    w.add_eos_token_id(n_vocab - 1)
    w.add_add_bos_token(True)

    rng = np.random.default_rng(SEED)
    dim, hid, kvd = C["dim"], C["hidden"], d * C["Hkv"]

    def mat(rows, cols, scale):  # [rows][cols]: GGUF ne = [cols, rows]
        return (rng.standard_normal((rows, cols)) * scale / math.sqrt(cols)).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(dim)).astype(np.float32)

    w.add_tensor("token_embd.weight", (rng.standard_normal((n_vocab, dim))).astype(np.float32))
    w.add_tensor("rope_freqs.weight", factors)
    for layer in range(C["L"]):
        b = f"blk.{layer}."
        w.add_tensor(b + "attn_norm.weight", norm())
        # queries and keys 3x the unit scale: scores of a few units, attention that picks
        # positions, so a change in the slow pairs' angles moves the output
        w.add_tensor(b + "attn_q.weight", mat(dim, dim, 3.0))
        w.add_tensor(b + "attn_k.weight", mat(kvd, dim, 3.0))
        w.add_tensor(b + "attn_v.weight", mat(kvd, dim, 1.0))
        w.add_tensor(b + "attn_output.weight", mat(dim, dim, 1.0))
        w.add_tensor(b + "ffn_norm.weight", norm())
        w.add_tensor(b + "ffn_gate.weight", mat(hid, dim, 1.0))
        w.add_tensor(b + "ffn_up.weight", mat(hid, dim, 1.0))
        w.add_tensor(b + "ffn_down.weight", mat(dim, hid, 1.0))
    w.add_tensor("output_norm.weight", norm())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    write_linear(d, n_vocab)
    print(f"{OUT}: {os.path.getsize(OUT)} bytes, vocab {n_vocab} ({len(merges)} merges), "
          f"rope factors {' '.join(f'{x:.6g}' for x in factors)}")


if __name__ == "__main__":
    main()
