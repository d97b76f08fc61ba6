#!/bin/bash
# make-expected.sh: writes tests/data/smollm2/ from llama.cpp, kvlab's outside reference.
#
# Needs tools/peer/build-llama.sh to have run (same --work folder) and the SmolLM2 GGUF file.
# Every file it writes is described in tests/data/smollm2/README.md, with the commands.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${KVLAB_PEER:-$HOME/.cache/kvlab/peer}
MODEL=${KVLAB_MODELS:-$HOME/.cache/kvlab/models}/SmolLM2-135M-Instruct.Q4_1.gguf
OUT=$ROOT/tests/data/smollm2
THREADS=1
CHUNKS=8
STEPS=64

usage() {
    cat <<USAGE
usage: tools/peer/make-expected.sh [--work DIR] [--model FILE] [--out DIR] [--only PART]

Runs llama.cpp's tools (built by tools/peer/build-llama.sh) on SmolLM2-135M-Instruct and
writes the expected data kvlab's real-model tests compare against:
  tokenize.txt          llama-tokenize on each case of tools/peer/tokenize-cases.txt
  greedy-NAME.txt       dump_logits: $STEPS greedy tokens and top-2 margins per prompt
  logits-plain.f32/.txt dump_logits: full logits at 4 positions of prompt-plain.txt
  perplexity.txt        llama-perplexity on datasets/models/kjv-heldout.txt, -c 512
  perplexity-tokens.txt the ids of its chunks (llama-tokenize on the same file)
All with -t $THREADS.

  --work DIR    build-llama.sh's work folder (default \${KVLAB_PEER:-\$HOME/.cache/kvlab/peer})
  --model FILE  the GGUF file (default \${KVLAB_MODELS:-\$HOME/.cache/kvlab/models}/
                SmolLM2-135M-Instruct.Q4_1.gguf)
  --out DIR     where to write (default tests/data/smollm2)
  --only PART   tokenize, greedy, logits or perplexity (default: all four)
  --help        this text
USAGE
}

ONLY=all
while [ $# -gt 0 ]; do
    case $1 in
    --work) WORK=$2; shift 2 ;;
    --model) MODEL=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "make-expected.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case $ONLY in all|tokenize|greedy|logits|perplexity) ;;
*) echo "make-expected.sh: --only takes tokenize, greedy, logits or perplexity" >&2; exit 2 ;;
esac

die() { echo "make-expected.sh: $*" >&2; exit 1; }
BIN=$WORK/build/bin
for tool in llama-tokenize llama-perplexity dump_logits; do
    [ -x "$BIN/$tool" ] || die "no $BIN/$tool: run tools/peer/build-llama.sh"
done
[ -f "$MODEL" ] || die "no model $MODEL: run tools/fetch-model.sh smollm2"
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
VERSION=$(head -n 1 "$WORK/VERSION")

# The escaped form of the files: one line per input, C escapes \n \t \r \\ and \xHH (two hex
# digits) for any other byte below 0x20, for 0x7f, and for a space at either end of the line;
# all other bytes (UTF-8 included) as they are. decode: bash's printf %b reads exactly these.
decode() { printf '%b' "$1"; }

header() {
    echo "# $*"
    echo "# made by tools/peer/make-expected.sh with $VERSION, -t $THREADS"
}

# tokenize.txt: every case with special-token parsing on (llama-tokenize's default) and off
# (--no-parse-special); no --no-bos, so BOS only where the vocabulary asks (SmolLM2 does not).
make_tokenize() {
    local f=$OUT/tokenize.txt line n=0
    {
        header "llama-tokenize -f INPUT --no-escape --ids [--no-parse-special]"
        echo "# blocks: input:<escaped bytes> / flags: special=S add_bos=1 / ids: N id..."
        while IFS= read -r line || [ -n "$line" ]; do
            case $line in '#'*|'') continue ;; esac
            decode "$line" >"$TMP/in"
            for special in 1 0; do
                local opt=
                [ $special = 1 ] || opt=--no-parse-special
                local ids
                ids=$("$BIN/llama-tokenize" -m "$MODEL" -f "$TMP/in" --no-escape --ids \
                    $opt --log-disable 2>/dev/null | tr -d '[],')
                set -- $ids
                echo
                echo "input:$line"
                echo "flags: special=$special add_bos=1"
                echo "ids: $# $ids"
                n=$((n + 1))
            done
        done <"$HERE/tokenize-cases.txt"
    } >"$f"
    echo "tokenize.txt: $n cases"
}

# greedy-NAME.txt: the prompt (escaped), then dump_logits' lines.
make_greedy() {
    local name
    for name in plain chat code; do
        local p=$OUT/prompt-$name.txt
        {
            header "dump_logits -m MODEL -f prompt-$name.txt -n $STEPS -t $THREADS"
            echo "# f32 KV cache, no flash attention; prompt as one batch, then one token a step"
            echo "input:$(escape_file "$p")"
            echo "flags: special=1 add_bos=1"
            "$BIN/dump_logits" -m "$MODEL" -f "$p" -n $STEPS -t $THREADS
        } >"$OUT/greedy-$name.txt"
        local g=$OUT/greedy-$name.txt
        echo "greedy-$name.txt: $(grep -c '^step' "$g") steps," \
            "smallest margin $(awk '$1=="step"{print $6}' "$g" | sort -g | head -n 1)"
    done
}

# escape a file's bytes into the one-line form above
escape_file() {
    od -An -v -tu1 "$1" | tr -s ' \n' '\n\n' | sed '/^$/d' | LC_ALL=C awk '
        BEGIN { n = 0 } { b[n++] = $1 }
        END {
            for (i = 0; i < n; i++) {
                c = b[i]
                if (c == 10) printf "\\n"; else if (c == 9) printf "\\t";
                else if (c == 13) printf "\\r"; else if (c == 92) printf "\\\\";
                else if (c < 32 || c == 127 || (c == 32 && (i == 0 || i == n - 1)))
                    printf "\\x%02x", c;
                else printf "%c", c
            }
        }'
}

# logits-plain.f32: the full logits after 4 positions of the plain prompt
make_logits() {
    local p=$OUT/prompt-plain.txt n pos
    n=$("$BIN/dump_logits" -m "$MODEL" -f "$p" -n 0 -t $THREADS | awk '$1=="prompt_ids"{print $2}')
    pos="0,$((n / 3)),$((2 * n / 3)),$((n - 1))"
    {
        header "dump_logits -m MODEL -f prompt-plain.txt -n 0 -t $THREADS" \
            "--logits-at $pos --logits-out logits-plain.f32"
        echo "# logits-plain.f32: for each position below, 49152 little-endian float32 logits"
        echo "positions: 4 ${pos//,/ }"
        "$BIN/dump_logits" -m "$MODEL" -f "$p" -n 0 -t $THREADS --logits-at "$pos" \
            --logits-out "$OUT/logits-plain.f32" | grep '^prompt_ids'
    } >"$OUT/logits-plain.txt"
    python3 - "$OUT/logits-plain.f32" "$pos" >>"$OUT/logits-plain.txt" <<'PY'
import struct, sys, math
data = open(sys.argv[1], 'rb').read()
V = 49152
assert len(data) == 4 * V * 4, len(data)
for k, p in enumerate(sys.argv[2].split(',')):
    row = struct.unpack_from('<%df' % V, data, 4 * V * k)
    top = sorted(range(V), key=lambda i: -row[i])[:5]
    mean = sum(row) / V
    print('pos %s max %.6f min %.6f mean %.6f top5 %s' % (p, max(row), min(row), mean,
          ' '.join('%d:%.6f' % (i, row[i]) for i in top)))
PY
    echo "logits-plain.f32: positions $pos"
}

# perplexity.txt: llama-perplexity's per-chunk running values and final estimate
make_perplexity() {
    local args="-c 512 -b 512 --chunks $CHUNKS -t $THREADS -ctk f32 -ctv f32 -fa off"
    "$BIN/llama-perplexity" -m "$MODEL" -f "$ROOT/datasets/models/kjv-heldout.txt" $args \
        >"$TMP/ppl.out" 2>"$TMP/ppl.err" || { cat "$TMP/ppl.err" >&2; exit 1; }
    {
        header "llama-perplexity -f kjv-heldout.txt $args"
        echo "# chunk K: the running PPL over chunks 1..K, as llama-perplexity prints [K]value"
        echo "# each chunk: 512 tokens from a fresh cache, scored on its last 255 predictions"
        grep -o 'calculating perplexity over.*' "$TMP/ppl.err" | sed 's/^/# /' || true
        echo "n_ctx: 512"
        echo "chunks: $CHUNKS"
        tr ',' '\n' <"$TMP/ppl.out" | sed -n 's/^\[\([0-9]*\)\]\([0-9.]*\)$/chunk \1 \2/p'
        sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/final \1 \2/p' \
            "$TMP/ppl.err" "$TMP/ppl.out"
    } >"$OUT/perplexity.txt"
    grep '^final' "$OUT/perplexity.txt"
    # the chunks' tokens, so a test can score the same chunks without its own tokenizer:
    # llama-tokenize on the whole file (llama-perplexity tokenizes it the same way, special
    # parsing on, no BOS for this vocabulary), the first CHUNKS * 512 ids, 16 to a line
    "$BIN/llama-tokenize" -m "$MODEL" -f "$ROOT/datasets/models/kjv-heldout.txt" --no-escape \
        --ids --log-disable 2>/dev/null | tr -d '[],' | tr ' ' '\n' | sed '/^$/d' >"$TMP/ids"
    {
        header "llama-tokenize -f kjv-heldout.txt --no-escape --ids:" \
            "the first $((CHUNKS * 512)) of $(wc -l <"$TMP/ids") ids"
        echo "tokens: $((CHUNKS * 512))"
        head -n $((CHUNKS * 512)) "$TMP/ids" | paste -d' ' - - - - - - - - - - - - - - - -
    } >"$OUT/perplexity-tokens.txt"
}

case $ONLY in all|tokenize) make_tokenize ;; esac
case $ONLY in all|greedy) make_greedy ;; esac
case $ONLY in all|logits) make_logits ;; esac
case $ONLY in all|perplexity) make_perplexity ;; esac
