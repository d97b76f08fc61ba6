#!/usr/bin/env python3
"""The tokenizer: a small sentencepiece BPE trained on the train split, exported as llama2.c's
tokenizer.bin (what reference_cpu/model/kv_tokenizer.c reads), and encoding with kvlab's
semantics so the trainer sees exactly the ids `kvlab` will feed the model.

tokenizer.bin: int32 max_token_length, then per id: float32 score, int32 length, the bytes.
Ids 0..2 are <unk>, "\\n<s>\\n", "\\n</s>\\n" (llama2.c's strings), 3..258 the byte-fallback
tokens <0x00>..<0xFF>, then the BPE pieces with sentencepiece's U+2581 turned back into a space.

kvlab's encode (kv_tokenizer.c): one dummy-prefix space before the text, one token per
character (byte fallback otherwise), then greedy highest-score merges. sentencepiece's BPE
encoder merges the same way, and no piece contains a newline, so kvlab's ids for a text are:
sp(" " + line 0), <0x0A>, sp(line 1), <0x0A>, ... ; kvlab_encode() below is a direct port of
kv_tokenizer_encode, used to check that claim on the held-out text.
"""
import heapq
import os
import struct

import sentencepiece as spm

BOS, EOS = 1, 2
NEWLINE = 3 + 0x0A  # <0x0A>


def train(train_txt, prefix, vocab_size):
    """Train the BPE model (prefix.model, prefix.vocab); deterministic for one input."""
    spm.SentencePieceTrainer.train(
        input=train_txt, model_prefix=prefix, model_type="bpe", vocab_size=vocab_size,
        byte_fallback=True, character_coverage=1.0, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=False,  # kvlab adds the one dummy space itself, at the text's start
        max_sentence_length=100000, num_threads=1, minloglevel=2,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def export_bin(sp, path):
    """Write llama2.c's tokenizer.bin (the layout of llama2.c's tokenizer.py)."""
    tokens, scores = [], []
    for i in range(sp.get_piece_size()):
        t = sp.id_to_piece(i)
        if i == BOS:
            t = "\n<s>\n"
        elif i == EOS:
            t = "\n</s>\n"
        t = t.replace("\u2581", " ")
        tokens.append(t.encode("utf-8"))
        scores.append(sp.get_score(i))
    max_len = max(len(t) for t in tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("i", max_len))
        for b, s in zip(tokens, scores):
            f.write(struct.pack("fI", s, len(b)))
            f.write(b)
    return tokens, scores


def encode_lines(sp, lines, first_has_prefix=True):
    """Ids of "\\n".join(lines) as kvlab encodes it (without BOS): one list per line."""
    out = []
    for i, line in enumerate(lines):
        text = (" " + line) if (i == 0 and first_has_prefix) else line
        out.append(sp.encode(text) if text else [])
    return out


def encode(sp, text):
    """kvlab's ids for text (no BOS): lines joined by <0x0A>."""
    if not text:
        return []
    ids = []
    for i, piece in enumerate(encode_lines(sp, text.split("\n"))):
        if i:
            ids.append(NEWLINE)
        ids.extend(piece)
    return ids


def kvlab_encode(tokens, scores, text):
    """A direct port of kv_tokenizer_encode (no BOS/EOS), for checking encode()."""
    lookup = {}
    for i, t in enumerate(tokens):
        lookup.setdefault(t, i)
    data = text.encode("utf-8")
    ids = [lookup[b" "]] if data else []
    i = 0
    while i < len(data):  # one token per UTF-8 codepoint, else byte fallback
        n = 1
        while n < 4 and i + n < len(data) and (data[i + n] & 0xC0) == 0x80:
            n += 1
        cp = data[i:i + n]
        if cp in lookup:
            ids.append(lookup[cp])
        else:
            ids.extend(3 + b for b in cp)
        i += n

    def merged(a, b):
        m = lookup.get(tokens[a] + tokens[b], -1)
        return -1 if m < 3 or 3 <= m < 259 else m

    nxt = list(range(1, len(ids))) + [-1]
    prv = list(range(-1, len(ids) - 1))
    heap = []
    for p in range(len(ids) - 1):
        m = merged(ids[p], ids[p + 1])
        if m >= 0:
            heapq.heappush(heap, (-scores[m], p, ids[p], ids[p + 1], m))
    while heap:
        _, p, a, b, m = heapq.heappop(heap)
        r = nxt[p]
        if ids[p] != a or r < 0 or ids[r] != b:
            continue
        ids[p], ids[r] = m, -1
        nxt[p] = nxt[r]
        if nxt[r] >= 0:
            prv[nxt[r]] = p
        q, o = prv[p], nxt[p]
        if q >= 0 and (mm := merged(ids[q], ids[p])) >= 0:
            heapq.heappush(heap, (-scores[mm], q, ids[q], ids[p], mm))
        if o >= 0 and (mm := merged(ids[p], ids[o])) >= 0:
            heapq.heappush(heap, (-scores[mm], p, ids[p], ids[o], mm))
    out, p = [], 0
    while p >= 0:
        out.append(ids[p])
        p = nxt[p]
    return out


if __name__ == "__main__":
    import sys
    if len(sys.argv) != 4:
        sys.exit("usage: tokenizer.py TRAIN_TXT OUTDIR VOCAB_SIZE")
    sp = train(sys.argv[1], os.path.join(sys.argv[2], "tok"), int(sys.argv[3]))
    export_bin(sp, os.path.join(sys.argv[2], "tokenizer.bin"))
