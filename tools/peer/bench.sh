#!/bin/bash
# bench.sh: kvlab's engine against llama.cpp on the same GGUF file, same threads, alternated.
#
# Each pair runs llama.cpp's llama-bench, then kvlab, back to back, so both see the same load
# on the machine; the ratio is taken within a pair (kvlab tokens/s over llama.cpp tokens/s)
# and the script prints every pair and the medians. Two rows:
#   decode   N tokens one at a time after D tokens of context (llama-bench -p 0 -n N -d D;
#            kvlab bench engine --model FILE --weights native --cache fp16 --context D
#            --tokens N: the file's blocks and a 16-bit cache on both sides; D = 0 runs
#            kvlab at --context 1, one token of context)
#   prefill  a P-token prompt as one batch (llama-bench -p P -n 0; kvlab bench engine
#            --context P, whose prefill line is read)
# --llama-args may be given several times: each pair then runs llama-bench once per set (in the
# order given, a set that lists several values, -fa 0,1, giving one column per row it prints),
# then kvlab once, and every llama.cpp column gets its own same-pair ratio.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${KVLAB_PEER:-$HOME/.cache/kvlab/peer}
MODEL=${KVLAB_MODELS:-$HOME/.cache/kvlab/models}/SmolLM2-135M-Instruct.Q4_1.gguf
KVLAB=$ROOT/build-cpu/kvlab
PAIRS=5
REPS=1
THREADS=1
TOKENS=64
DEPTH=0
PROMPT=512
KV_FLAGS='--weights native --cache fp16 --threads {threads} --repeats {reps}'
KV_DECODE="{kvlab} bench engine --model {model} $KV_FLAGS --tokens {tokens} --context {context} | grep decode"
KV_PREFILL="{kvlab} bench engine --model {model} $KV_FLAGS --tokens 1 --context {prompt} | grep prefill"
LLAMA_SETS=()

usage() {
    cat <<USAGE
usage: tools/peer/bench.sh [options]

Alternates llama.cpp's llama-bench and kvlab on one GGUF file, PAIRS times, and prints each
pair's tokens/s, the same-pair ratio kvlab/llama.cpp, and the medians.

  --model FILE     GGUF file (default \${KVLAB_MODELS:-\$HOME/.cache/kvlab/models}/
                   SmolLM2-135M-Instruct.Q4_1.gguf)
  --work DIR       tools/peer/build-llama.sh's work folder
                   (default \${KVLAB_PEER:-\$HOME/.cache/kvlab/peer})
  --kvlab FILE     the kvlab binary (default build-cpu/kvlab)
  --pairs N        pairs per row (default $PAIRS)
  --threads N      threads for both (default $THREADS)
  --reps R         runs inside each process (default $REPS): llama-bench -r R (its mean, one
                   depth prefill reused), kvlab --repeats R (its median, one prefill reused);
                   R > 1 spends a long context's prefill once per process, not once per run
  --tokens N       decode row: tokens generated (default $TOKENS)
  --depth D        decode row: llama.cpp's context before them (default $DEPTH)
  --prompt P       prefill row: prompt tokens (default $PROMPT; 0 skips the row)
  --kvlab-decode 'CMD'   kvlab's decode command; {kvlab} {model} {threads} {tokens}
                   {context} (the depth, at least 1), {reps} are replaced; the last "N tokens/s" of
                   its first such line is read (default:
                   $KV_DECODE)
  --kvlab-prefill 'CMD'  kvlab's prefill command, with {prompt} too; '' runs llama.cpp alone
                   (default: $KV_PREFILL)
  --llama-args 'ARGS'    more llama-bench options (default none: its f16 cache and
                   automatic flash attention; llama-bench offers no f32 cache, whose cost
                   beside the weights is small at depth 0); repeatable: one llama-bench run
                   per set and pair, one column per row it prints (-fa 0,1: two columns,
                   the second reusing the first's depth prefill inside llama-bench)
  --help           this text
USAGE
}

while [ $# -gt 0 ]; do
    case $1 in
    --model) MODEL=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --kvlab) KVLAB=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --tokens) TOKENS=$2; shift 2 ;;
    --depth) DEPTH=$2; shift 2 ;;
    --prompt) PROMPT=$2; shift 2 ;;
    --kvlab-decode) KV_DECODE=$2; shift 2 ;;
    --kvlab-prefill) KV_PREFILL=$2; shift 2 ;;
    --llama-args) LLAMA_SETS+=("$2"); shift 2 ;;
    --help|-h) usage; exit 0 ;;
    *) echo "bench.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$PAIRS" "$REPS" "$THREADS" "$TOKENS" "$DEPTH" "$PROMPT"; do
    case $n in ''|*[!0-9]*) echo "bench.sh: '$n' is not a count" >&2; exit 2 ;; esac
done
[ "$PAIRS" -ge 1 ] && [ "$REPS" -ge 1 ] && [ "$THREADS" -ge 1 ] && [ "$TOKENS" -ge 1 ] ||
    { echo "bench.sh: --pairs, --reps, --threads and --tokens must be at least 1" >&2; exit 2; }
BENCH=$WORK/build/bin/llama-bench
die() { echo "bench.sh: $*" >&2; exit 1; }
[ -x "$BENCH" ] || die "no $BENCH: run tools/peer/build-llama.sh"
[ -f "$MODEL" ] || die "no model $MODEL: run tools/fetch-model.sh smollm2"
[ ${#LLAMA_SETS[@]} -gt 0 ] || LLAMA_SETS=("")

# llama-bench, REPS repetitions, CSV: per row it prints, "label avg_ts", the label being its
# K/V cache types and flash attention (f16/fa1)
llama_ts() {
    local set=$1
    shift
    # shellcheck disable=SC2086  # a set is several words on purpose
    "$BENCH" -m "$MODEL" -t "$THREADS" -r "$REPS" -o csv $set "$@" 2>/dev/null |
        awk -F, '{ gsub(/"/, "") }
                 NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
                 col["avg_ts"] { k = col["type_k"] ? $col["type_k"] : "?"
                                 f = col["flash_attn"] ? $col["flash_attn"] : "?"
                                 sub(/^(true|1)$/, "1", f); sub(/^(false|0)$/, "0", f)
                                 print k "/fa" f, $col["avg_ts"] }'
}

# kvlab: the template filled in, the first "N tokens/s" of its output ("" when it failed)
kvlab_ts() {
    local cmd=$1
    cmd=${cmd//\{kvlab\}/$KVLAB}
    cmd=${cmd//\{model\}/$MODEL}
    cmd=${cmd//\{threads\}/$THREADS}
    cmd=${cmd//\{tokens\}/$TOKENS}
    cmd=${cmd//\{reps\}/$REPS}
    cmd=${cmd//\{prompt\}/$PROMPT}
    cmd=${cmd//\{context\}/$((DEPTH > 0 ? DEPTH : 1))}
    OMP_NUM_THREADS=$THREADS sh -c "$cmd" 2>/dev/null |
        sed -n 's/.* \([0-9][0-9.]*\) tokens\/s.*/\1/p' | head -n 1 || true
}

median() {
    sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) print "-"; else if (NR % 2) printf "%.3f\n", v[(NR + 1) / 2];
              else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# one row: PAIRS alternated pairs (every llama-bench set, then kvlab), then the medians; the
# columns are llama.cpp's rows in order, then kvlab, then kvlab over each llama.cpp column
row() {
    local name=$1 kvcmd=$2 i j n set out k r labels="" cols=0
    shift 2
    local -a ls=() rs=()
    local ks=""
    for i in $(seq 1 "$PAIRS"); do
        out=""
        for set in "${LLAMA_SETS[@]}"; do
            r=$(llama_ts "$set" "$@")
            [ -n "$r" ] || { echo "bench.sh: llama-bench gave no result ($set $*)" >&2; exit 1; }
            out="$out$r"$'\n'
        done
        k=
        [ -z "$kvcmd" ] || k=$(kvlab_ts "$kvcmd")
        n=$(printf '%s' "$out" | grep -c .)
        if [ "$i" = 1 ]; then
            cols=$n
            labels=$(printf '%s' "$out" | awk '{ printf " %12s", $1 }')
            printf '%-8s %-6s%s %12s' row pair "$labels" kvlab
            printf '%s' "$out" | awk '{ printf " %12s", "kv/" $1 }'
            printf '\n'
        fi
        [ "$n" = "$cols" ] || { echo "bench.sh: llama-bench gave $n rows, not $cols" >&2; exit 1; }
        printf '%-8s %-6s' "$name" "$i"
        j=0
        while read -r _ l; do
            printf ' %12.2f' "$l"
            ls[j]="${ls[j]:-}$l"$'\n'
            j=$((j + 1))
        done <<<"${out%$'\n'}"
        printf ' %12s' "${k:-n/a}"
        [ -z "$k" ] || ks="$ks$k"$'\n'
        j=0
        while read -r _ l; do
            r=n/a
            if [ -n "$k" ]; then
                r=$(awk -v a="$k" -v b="$l" 'BEGIN { printf "%.3f", a / b }')
                rs[j]="${rs[j]:-}$r"$'\n'
            fi
            printf ' %12s' "$r"
            j=$((j + 1))
        done <<<"${out%$'\n'}"
        printf '\n'
    done
    printf '%-8s %-6s' "$name" median
    for ((j = 0; j < cols; j++)); do printf ' %12s' "$(printf '%s' "${ls[j]}" | median)"; done
    printf ' %12s' "$(printf '%s' "$ks" | median)"
    for ((j = 0; j < cols; j++)); do printf ' %12s' "$(printf '%s' "${rs[j]:-}" | median)"; done
    printf '\n\n'
}

VERSION=$(head -n 1 "$WORK/VERSION" 2>/dev/null || echo 'llama.cpp version unknown (no VERSION)')
echo "bench.sh: $VERSION"
echo "model $MODEL, $THREADS thread(s), $PAIRS pairs, tokens/s (llama-bench avg_ts, -r $REPS; kvlab median of $REPS)"
for set in "${LLAMA_SETS[@]}"; do echo "llama-bench ${set:-with its defaults (f16 KV cache)}"; done
echo "kvlab: $KVLAB"
echo "load before: $(uptime)"
echo
echo "decode: $TOKENS tokens at depth $DEPTH (llama-bench -p 0 -n $TOKENS -d $DEPTH)"
echo "  kvlab: ${KV_DECODE//\{kvlab\}/kvlab}"
row decode "$KV_DECODE" -p 0 -n "$TOKENS" -d "$DEPTH"
if [ "$PROMPT" -gt 0 ]; then
    echo "prefill: $PROMPT prompt tokens as one batch (llama-bench -p $PROMPT -n 0 -b $PROMPT)"
    row prefill "$KV_PREFILL" -p "$PROMPT" -n 0 -b "$PROMPT"
fi
echo "load after: $(uptime)"
echo "ratio > 1: kvlab faster; medians of the same-pair ratios, not ratios of medians"
