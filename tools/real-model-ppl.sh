#!/bin/sh
# real-model-ppl.sh: chapters 03, 04 and 06 on a real model (docs/real-model-ppl.md), every
# table and figure of that page from one command:
#   perplexity  kvlab eval ppl --caches ch04 --kl at 512 and 2048 tokens of context (and 8192
#               with --full): every storage format against the fp32 cache, KL and spread
#   sinks       kvlab eval mass (per layer, and per KV head) and the StreamingLLM stream: a
#               window alone, with 1 and 4 sinks (cache positions, the same slots in all
#               three), the dense cache and the recompute window, perplexity along the stream
#   keys        kvlab eval keys (|K| per channel before and after RoPE) and KIVI's ablation,
#               2-bit keys grouped per channel or per token (--kivi-keys)
#   GQA -> MQA  kvlab eval ppl --kv-heads 1 --kl: the 3 KV heads mean-pooled into one
# The default sizes fit a shared 2-core machine in about an hour (the page says which ran);
# --full runs the whole text, 8k windows and a 32k-token stream (hours on 2 cores).
# Usage: tools/real-model-ppl.sh [--full] [OUT]   (OUT default real-model-ppl/; KVLAB, MODEL
# and TEXT in the environment override build-cpu/kvlab, smollm2 and the KJV held-out text)
set -eu
KVLAB=${KVLAB:-build-cpu/kvlab}
MODEL=${MODEL:-smollm2}
TEXT=${TEXT:-datasets/models/kjv-heldout.txt}
full=0
if [ "${1:-}" = --full ]; then full=1; shift; fi
OUT=${1:-real-model-ppl}
mkdir -p "$OUT"
run() { # run NAME ARGS...: kvlab's stdout into OUT/NAME, progress on stderr
    name=$1; shift
    echo "real-model-ppl: kvlab $* > $OUT/$name" >&2
    "$KVLAB" "$@" > "$OUT/$name"
}
ev() { run "$@" --model "$MODEL" --text "$TEXT"; }

if [ $full = 1 ]; then
    tokens=0 stream=32768 win=1024 every=128 probe=2048
    sizes="512 2048 8192"
else
    tokens=1024 stream=4096 win=256 every=128 probe=512
    sizes="512 2048"
fi
# the selective-layer pair with the most to tell at 2 bits (ch04 has both ways for int4 too)
mid=$(seq -s, 3 26) ends=0,1,2,27,28,29

# ---- chapter 04: perplexity and KL of every cache variant ---------------------------------------
# (each CSV is named as its copy under docs/data/, which the page's tables quote)
for T in $sizes; do
    seg=$((T / 8))
    if [ $full = 0 ] && [ "$T" -gt 512 ]; then
        # one window of T: KIVI int2 and its selective layers, then the formats whose loss may
        # grow with the context (what a loaded 2-core machine finished)
        ev ppl-int2-$T.csv eval ppl --window "$T" --limit "$T" --segment "$seg" \
            --caches "int2 int2/l$mid int2/l$ends" --kl --csv -
        ev ppl-formats-$T.csv eval ppl --window "$T" --limit "$T" --segment "$seg" \
            --caches "int8 fp8-e4m3 int4-g32 int4" --kl --csv -
    else
        ev ppl-ch04-$T.csv eval ppl --window "$T" --limit "$tokens" --segment "$seg" \
            --caches ch04 --kl --csv -
        # int4-g32 joined ch04 after the page's 512-token run: scored alone on the same tokens
        [ $full = 1 ] || ev ppl-int4-g32-$T.csv eval ppl --window "$T" --limit "$tokens" \
            --segment "$seg" --caches int4-g32 --kl --csv -
    fi
done

# ---- chapter 04: outlier key channels and KIVI's ablation ----------------------------------------
ev keys.txt eval keys --tokens $probe
ev keys-$probe.csv eval keys --tokens $probe --csv -
for g in channel token; do
    ev ppl-kivi-keys-$g-512.csv eval ppl --window 512 --limit $tokens --segment 128 --kivi-keys $g --kl --csv -
done

# ---- chapter 03: GQA mean-pooled to MQA ------------------------------------------------------------
ev ppl-mqa-512.csv eval ppl --window 512 --limit $tokens --segment 128 --kv-heads 1 --kl --csv -

# ---- chapter 06: attention sinks and the stream ------------------------------------------------------
ev mass.txt eval mass --tokens $probe
ev mass-heads.txt eval mass --tokens $probe --heads
ev mass-heads.csv eval mass --tokens $probe --heads --csv -
s1=$((win - 1)) s4=$((win - 4))
ev stream-$stream.csv eval ppl --window 0 --limit $stream --segment $win --segments --csv - \
    --caches "fp32 window/w$win/cache window/w$s1/s1/cache window/w$s4/s4/cache"
ev stream-recompute-$stream.csv eval ppl --recompute --window $((win + 1)) --limit $stream \
    --every $every --segment $((win * 4)) --segments --csv -

# ---- the figures ----------------------------------------------------------------------------------
if command -v gnuplot >/dev/null; then
    cat > "$OUT/stream.gp" <<EOF
set terminal svg size 800,500 dynamic font 'sans,12'
set output '$OUT/real-model-stream.svg'
set datafile separator ','
set grid
set title 'SmolLM2-135M on a $stream-token stream of the KJV: $win cache slots' noenhanced
set xlabel 'tokens into the stream'
set ylabel 'perplexity of each $win-token segment'
set logscale y
set key top left
f = '$OUT/stream-$stream.csv'
sel(c) = strcol(4) eq c ? \$10 : NaN
plot f every ::1 using 7:(sel('fp32')) with linespoints lw 2 pt 7 ps 0.5 title 'dense fp32 cache', \\
     f every ::1 using 7:(sel('window/w$win/cache')) with linespoints lw 2 pt 5 ps 0.5 title 'window $win, no sink', \\
     f every ::1 using 7:(sel('window/w$s1/s1/cache')) with linespoints lw 2 pt 9 ps 0.5 title 'window $s1 + 1 sink', \\
     f every ::1 using 7:(sel('window/w$s4/s4/cache')) with linespoints lw 2 pt 11 ps 0.5 title 'window $s4 + 4 sinks', \\
     '$OUT/stream-recompute-$stream.csv' every ::1 using 7:10 with linespoints lw 2 dt 2 pt 13 ps 0.5 title 'recompute window: every $every-th token, few per point'
EOF
    gnuplot "$OUT/stream.gp"
    # position 0's mass as one row per layer: layer, then one column per KV head
    awk -F, 'NR > 1 && $3 == 0 { v[$1] = v[$1] "," $4; if ($1 > L) L = $1 }
             END { for (l = 0; l <= L; l++) print l v[l] }' "$OUT/mass-heads.csv" > "$OUT/mass-sink.csv"
    cat > "$OUT/mass.gp" <<EOF
set terminal svg size 800,500 dynamic font 'sans,12'
set output '$OUT/real-model-sink-mass.svg'
set datafile separator ','
set grid
set title 'SmolLM2-135M: attention on position 0 per layer and KV head ($probe tokens of the KJV)' noenhanced
set xlabel 'layer'
set ylabel 'share of attention on position 0'
set yrange [0:1]
set key top left
f = '$OUT/mass-sink.csv'
plot f using 1:2 with linespoints lw 2 pt 7 title 'KV head 0 (query heads 0-2)', \\
     f using 1:3 with linespoints lw 2 pt 5 title 'KV head 1 (query heads 3-5)', \\
     f using 1:4 with linespoints lw 2 pt 9 title 'KV head 2 (query heads 6-8)', \\
     (log($probe) + 0.5772) / $probe with lines dt 2 lc rgb 'gray' title 'even causal attention, (ln n + 0.58) / n'
EOF
    gnuplot "$OUT/mass.gp"
else
    echo "real-model-ppl: no gnuplot, no figures (apt-get install gnuplot-nox)" >&2
fi
echo "real-model-ppl: done, results in $OUT/" >&2
