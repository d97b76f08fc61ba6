#!/usr/bin/env python3
"""Write the two tiny tokenizer-only GGUF files of the tests (tests/data/vocab/):

    python3 tools/vocab/make_tiny_vocab.py tests/data/vocab

  tiny-bpe.gguf  tokenizer.ggml.model gpt2, pre smollm: the 256 byte characters of GPT-2's
                 byte-level BPE, 24 merges of common English pairs (rank = order below) and
                 their results, and the control tokens <|endoftext|> <|im_start|> <|im_end|>
                 (ids 0, 1, 2, as SmolLM2 has them)
  tiny-spm.gguf  tokenizer.ggml.model llama: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>,
                 then pieces with scores (a longer piece scores higher, as a trained vocabulary's)

No tensors: kvlab tokenize, test_vocab_cli and fuzz_vocab read only the tokenizer. Needs the
`gguf` Python package.
"""
import os
import sys

import gguf

MERGES = ["Ġ t", "h e", "Ġt he", "i n", "e r", "a n", "Ġ a", "o n", "r e", "Ġ s",
          "Ġ w", "o r", "e n", "in g", "Ġ h", "l l", "Ġ o", "Ġw or", "Ġwor l", "Ġworl d",
          "H e", "He ll", "Hell o", "Ġ 1"]


def byte_chars():
    """GPT-2's bytes_to_unicode(): printable bytes stand for themselves, the rest U+0100..."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return [chars[b] for b in range(256)]


def write(path, arch, fill):
    w = gguf.GGUFWriter(path, arch)
    fill(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def bpe(w):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + byte_chars()
    for m in MERGES:
        joined = m.replace(" ", "")
        if joined not in tokens:
            tokens.append(joined)
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)


def spm(w):
    pieces = ["▁", "e", "t", "a", "o", "h", "l", "r", "d", "w", "H", "▁t", "he", "▁the",
              "ll", "llo", "▁w", "or", "▁wor", "ld", "▁world", "He", "Hello", "▁Hello"]
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + pieces
    scores = [0.0] * 259 + [-100.0 + len(p) for p in pieces]
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] +
             [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(pieces))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/vocab"
    os.makedirs(out, exist_ok=True)
    write(os.path.join(out, "tiny-bpe.gguf"), "llama", bpe)
    write(os.path.join(out, "tiny-spm.gguf"), "llama", spm)


if __name__ == "__main__":
    main()
