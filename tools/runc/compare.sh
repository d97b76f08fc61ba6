#!/bin/sh
# kvlab generate against llama2.c's run.c on the same random checkpoints, greedy, runs
# alternated (run.c, kvlab, run.c, kvlab, ...), tokens compared, tokens/s as each reports it
# (both leave the first step out). docs/performance.md §12.4 has the results and what they mean.
#
# usage: tools/runc/compare.sh RUN_C KVLAB_BUILD [PAIRS] [WORK_DIR]
#   RUN_C        path to llama2.c's run.c (not part of kvlab: get it from llama2.c yourself)
#   KVLAB_BUILD  a kvlab CPU build folder (holds kvlab and reference_cpu/libkvlab_cpu.a)
#   PAIRS        alternated pairs per shape (default 5)
#   WORK_DIR     where the binaries and checkpoints go (default: a new temporary folder)
# env: THREADS (default: every CPU) is both programs' OpenMP team (OMP_NUM_THREADS, --threads);
#      ONLY (default: every shape) runs one shape by name (mha, gqa or mha8k).
set -eu
[ $# -ge 2 ] || { sed -n 2,13p "$0"; exit 2; }
RUNC_SRC=$1
BUILD=$(cd "$2" && pwd)
PAIRS=${3:-5}
WORK=${4:-$(mktemp -d)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
THREADS=${THREADS:-$(nproc)}
ONLY=${ONLY:-}
mkdir -p "$WORK"
cd "$WORK"

# run.c as its README builds it for speed
gcc -Ofast -fopenmp -march=native "$RUNC_SRC" -lm -o runc
INC=""
for d in "$ROOT"/reference_cpu/*/; do INC="$INC -I$d"; done
# shellcheck disable=SC2086
gcc -O2 -fopenmp $INC "$ROOT/tools/runc/make_model.c" "$BUILD/reference_cpu/libkvlab_cpu.a" \
    -lm -lpthread -o make_model

# name dim hidden layers heads kv_heads vocab seq_len steps: llama2.c's stories15M shape (tied
# classifier), a GQA variant, and the MHA shape with an 8192-token context
SHAPES="mha 288 768 6 6 6 32000 256 256
gqa 288 768 6 6 2 32000 256 256
mha8k 288 768 6 6 6 32000 8192 8192"

echo "$SHAPES" | while read -r name dim hidden layers heads kvh vocab seq steps; do
    [ -z "$ONLY" ] || [ "$ONLY" = "$name" ] || continue
    ./make_model "$name.bin" tok.bin "$dim" "$hidden" "$layers" "$heads" "$kvh" "$vocab" "$seq"
    # run.c: -n counts positions (the BOS included), so -n S chooses S tokens; kvlab --steps S
    # after the BOS chooses the same S (the last one is never fed back)
    echo "== $name: dim $dim hidden $hidden L $layers H $heads H_kv $kvh vocab $vocab seq $seq," \
         "$steps tokens, $THREADS threads, load: $(cut -d' ' -f1-4 /proc/loadavg)"
    i=0
    while [ "$i" -lt "$PAIRS" ]; do
        OMP_NUM_THREADS=$THREADS ./runc "$name.bin" -z tok.bin -t 0 -n "$steps" -i "" \
            >runc.out 2>runc.err
        "$BUILD/kvlab" generate --model "$name.bin" --tokenizer tok.bin --prompt "" \
            --steps "$steps" --threads "$THREADS" >kvlab.out 2>kvlab.err
        r=$(sed -n 's/achieved tok\/s: //p' runc.err)
        k=$(sed -n 's/.*(\([0-9.]*\) from the second token on, as run.c).*/\1/p' kvlab.err)
        same=$(cmp -s runc.out kvlab.out && echo identical || echo DIFFERENT)
        echo "pair $i: run.c $r tok/s, kvlab $k tok/s, ratio $(echo "$k / $r" | bc -l | cut -c1-5)," \
             "tokens $same, load $(cut -d' ' -f1 /proc/loadavg)"
        i=$((i + 1))
    done
done
