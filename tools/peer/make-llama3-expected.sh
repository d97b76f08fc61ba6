#!/bin/bash
# make-llama3-expected.sh: writes tests/data/llama3/ from llama.cpp, kvlab's outside reference,
# for tests/test_gguf_llama3.c: a tiny Llama 3.1-style model with RoPE frequency factors.
#
# Needs tools/peer/build-llama.sh to have run (same --work folder). Writes
#   tests/data/gguf/llama3_rope.gguf   tools/gguf/make_llama3_rope.py (fixed seed)
#   tests/data/llama3/logits.f32       dump_logits: the full logits (vocab 386, little-endian
#                                      float32) after each listed position of prompt.txt
#   tests/data/llama3/logits.txt       the command, llama.cpp's version, the positions, the
#                                      prompt's ids and a summary of each position's logits
# prompt.txt (committed) is the first 1400 bytes of datasets/models/kjv-heldout.txt.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${KVLAB_PEER:-$HOME/.cache/kvlab/peer}
OUT=$ROOT/tests/data/llama3
THREADS=1

case ${1:-} in
--help|-h)
    echo "usage: tools/peer/make-llama3-expected.sh [--work DIR]   (see the comment at its top)"
    exit 0 ;;
--work) WORK=$2 ;;
"") ;;
*) echo "make-llama3-expected.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac
BIN=$WORK/build/bin
[ -x "$BIN/dump_logits" ] || { echo "no $BIN/dump_logits: run tools/peer/build-llama.sh" >&2; exit 1; }
cd "$ROOT"
python3 tools/gguf/make_llama3_rope.py
MODEL=tests/data/gguf/llama3_rope.gguf
P=$OUT/prompt.txt
n=$("$BIN/dump_logits" -m "$MODEL" -f "$P" -n 0 -t $THREADS 2>/dev/null |
    awk '$1=="prompt_ids"{print $2}')
pos="0,64,256,512,768,$((n - 1))"
{
    echo "# dump_logits -m llama3_rope.gguf -f prompt.txt -n 0 -t $THREADS --logits-at $pos" \
        "--logits-out logits.f32"
    echo "# made by tools/peer/make-llama3-expected.sh with $(head -n 1 "$WORK/VERSION"), -t $THREADS"
    echo "# f32 weights, f32 KV cache, no flash attention; the prompt as one batch, BOS added"
    echo "# logits.f32: for each position below, 386 little-endian float32 logits"
    echo "positions: 6 ${pos//,/ }"
    "$BIN/dump_logits" -m "$MODEL" -f "$P" -n 0 -t $THREADS --logits-at "$pos" \
        --logits-out "$OUT/logits.f32" 2>/dev/null | grep '^prompt_ids'
} >"$OUT/logits.txt"
python3 - "$OUT/logits.f32" "$pos" >>"$OUT/logits.txt" <<'PY'
import struct, sys
data = open(sys.argv[1], 'rb').read()
V = 386
pos = sys.argv[2].split(',')
assert len(data) == 4 * V * len(pos), len(data)
for k, p in enumerate(pos):
    row = struct.unpack_from('<%df' % V, data, 4 * V * k)
    top = sorted(range(V), key=lambda i: -row[i])[:3]
    print('pos %s max %.6f min %.6f top3 %s' % (p, max(row), min(row),
          ' '.join('%d:%.6f' % (i, row[i]) for i in top)))
PY
echo "logits.f32: positions $pos"
