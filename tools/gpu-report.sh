#!/usr/bin/env bash
# gpu-report.sh: one Markdown report of what this project's CUDA half does on the GPU of this
# machine, in at most 8 minutes on one H100/H200, the build included (--budget scales it).
# Steps: configure and assert the build is a CUDA one (a CMake that finds no nvcc builds the
# CPU library alone, and `ctest -L gpu` would then pass with no test), build for this GPU,
# the GPU tests (ctest -L gpu), compute-sanitizer memcheck and racecheck over the decode and
# MLA tests, the device benches (kvlab bench attention, its MQA rows, engine and mla --device
# cuda), Nsight Compute metrics of attn_fast_kernel, attn_mma_kernel, flash_kernel_v5 and
# flash_kernel_v6, the engine's prefill on tensor cores (issue active, DRAM throughput,
# shared-memory bank conflicts, instructions executed: issue-bound or bandwidth-bound), and
# the real model (kvlab generate --model smollm2, and the pass-key grid at 1k-8k under five
# caches: keys found and tokens/s) when its file is there.
# Each step runs under a budget computed from the sizes it runs (the bytes a bench reads at a
# floor of FLOOR_GBPS, plus its set-up); a step that fails or runs out of time is reported as
# such and the next one runs.
#
# Dry mode (--dry-run, or no GPU found): the emulation build (CUDA kernels on CPU fibers), the
# emulator's own GPU tests only, the benches at their --quick sizes, sanitizer and ncu skipped
# with a note. It runs end to end on a CPU machine and is a CTest test (test_gpu_report_dry).
#
# Usage: tools/gpu-report.sh [--dry-run] [--out FILE] [--build-dir DIR] [--no-build]
#                            [--all-gpu-tests] [--budget SECONDS]
#   --out FILE        the report (default gpu-report.md in the current directory)
#   --build-dir DIR   the build to make or use (default build-gpu; dry mode: build-emu)
#   --no-build        use DIR as it is (it must hold kvlab and the tests)
#   --all-gpu-tests   dry mode: every gpu test of the emulation build, not only the emulator's
#   --budget SECONDS  the whole run's time (default 480); every step's budget scales with it
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 on a usage error.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=gpu-report.md
BUILD=
DRY=0
NO_BUILD=0
ALL_TESTS=0
BUDGET=480
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT=$2; shift ;;
    --build-dir) BUILD=$2; shift ;;
    --no-build) NO_BUILD=1 ;;
    --all-gpu-tests) ALL_TESTS=1 ;;
    --budget) BUDGET=$2; shift ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-report.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$BUDGET" in ''|*[!0-9]*) echo "gpu-report.sh: --budget takes whole seconds" >&2; exit 2 ;; esac
[ "$BUDGET" -ge 60 ] || { echo "gpu-report.sh: --budget of at least 60 s" >&2; exit 2; }

WHY_DRY="--dry-run given"
if [ $DRY -eq 0 ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
        DRY=1
        WHY_DRY="no GPU found (nvidia-smi -L failed or is missing)"
    fi
fi
[ -n "$BUILD" ] || { [ $DRY -eq 1 ] && BUILD=$ROOT/build-emu || BUILD=$ROOT/build-gpu; }
case "$BUILD" in /*) ;; *) BUILD=$(pwd)/$BUILD ;; esac
JOBS=$(nproc 2>/dev/null || echo 2)
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
FAILED=0
T_START=$(date +%s)

# ---- budgets ----------------------------------------------------------------------------------
# A bench reads KV bytes = B 2 H_kv N d b per kernel call; its budget is those bytes at a floor
# of FLOOR_GBPS (below any H100's or H200's measured decode rate), times the calls (a check,
# a warm-up and the repeats per kernel), plus writing the cache (4-byte inputs at WRITE_GBPS)
# and SETUP_S per case (allocation, the bandwidth kernels). Fixed steps (build, tests,
# sanitizer, ncu, the model) have budgets measured on an H100 with room. All scale by
# --budget / 480.
FLOOR_GBPS=500 WRITE_GBPS=20 SETUP_S=2
scale() { echo $(( ($1 * BUDGET + 479) / 480 )); }
# bench_budget CALLS_PER_CASE BYTES_PER_ELEMENT... -- B,B.. N,N.. H_kv d LAYOUTS
bench_budget() {
    awk -v calls="$1" -v bs="$2" -v bl="$3" -v nl="$4" -v hkv="$5" -v d="$6" -v lay="$7" \
        -v floor="$FLOOR_GBPS" -v wr="$WRITE_GBPS" -v setup="$SETUP_S" 'BEGIN {
        nb = split(bs, b_, ","); nB = split(bl, B_, ","); nN = split(nl, N_, ","); t = 5
        for (i = 1; i <= nb; i++) for (j = 1; j <= nB; j++) for (k = 1; k <= nN; k++) {
            rows = B_[j] * 2 * hkv * N_[k] * d
            t += lay * (setup + rows * b_[i] * calls / (floor * 1e9) + rows * 4 / (wr * 1e9))
        }
        printf "%d\n", t + 0.999 }'
}
B_BUILD=$(scale 150) B_TESTS=$(scale 70) B_SAN=$(scale 15) B_NCU=$(scale 15) B_MODEL=$(scale 20)
B_PASSKEY=$(scale 90)
# attention, B 1: N 4k/32k/128k, fp16/int8/fp8, two layouts, 7 kernels x (check + warm-up + 2
# repeats) at N <= 32k; at 128k attn v2 and the engine alone (--lean). Counted as 28 calls at
# 32k and below, 8 at 128k.
B_ATTN1=$(( $(scale $(bench_budget 28 2,1.03,1 1 4096,32768 8 128 2)) +
            $(scale $(bench_budget 8 2,1.03,1 1 131072 8 128 2)) ))
# attention, B 32: N 4k/32k, the engine's batched launch alone (--lean: no reference, sequence
# 0 alone against it), 2 + 2 + 2 calls
B_ATTN32=$(scale $(bench_budget 6 2,1.03,1 32 4096,32768 8 128 2))
# MQA: B 1, N 32k, fp16 and bf16, one KV head of 128, contiguous: 28 calls
B_MQA=$(scale $(bench_budget 28 2,2 1 32768 1 128 1))
B_ENGINE=$(scale 25) B_MLA=$(scale 15)
B_TOTAL=$(( B_BUILD + B_TESTS + 4 * B_SAN + B_ATTN1 + B_ATTN32 + B_MQA + B_ENGINE + B_MLA +
            4 * B_NCU + B_MODEL + B_PASSKEY ))

report() { printf '%s\n' "$*" >>"$OUT"; }

# run NAME BUDGET CMD...: the command under its budget, output in $LOGS/NAME.log; a status
# line in the report. Returns the command's status (124: out of time).
run() {
    local name=$1 budget=$2
    shift 2
    local t0=$(date +%s) rc
    timeout --kill-after=5 "$budget" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    local dt=$(( $(date +%s) - t0 ))
    if [ $rc -eq 0 ]; then
        report "*${name}: passed in ${dt} s (budget ${budget} s).*"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        report "*${name}: **out of time** after ${dt} s (budget ${budget} s); what it printed is below.*"
        FAILED=1
    else
        report "*${name}: **failed** (exit ${rc}) after ${dt} s.*"
        FAILED=1
    fi
    return $rc
}

# The last N lines of a step's log as a code block.
log_tail() {
    report ''
    report '```'
    tail -n "$2" "$LOGS/$1.log" >>"$OUT"
    report '```'
}

# CSV lines of a step's log (from the line starting with $2) as a Markdown table.
csv_table() {
    report ''
    awk -v head="$2" 'index($0, head) == 1 { on = 1 }
        on && /,/ { gsub(/,/, " | "); print "| " $0 " |"; if (!sep++) { n = split($0, f, "\\|");
                    s = "|"; for (i = 1; i <= n; i++) s = s " --- |"; print s } }' \
        "$LOGS/$1.log" >>"$OUT"
}

: >"$OUT" || { echo "gpu-report.sh: cannot write $OUT" >&2; exit 2; }
report "# kvlab GPU report"
report ''
report "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
report "- commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ $DRY -eq 1 ]; then
    report "- mode: **dry run** ($WHY_DRY): the emulation build, CUDA kernels on CPU fibers;"
    report "  timings say nothing about a GPU, compute-sanitizer and ncu are skipped"
else
    report "- GPU: $(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader | head -n 1)"
    report "- nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
fi
report "- build: \`$BUILD\`; $JOBS jobs"
report "- budget: $BUDGET s in all; per step: build $B_BUILD, tests $B_TESTS, sanitizer $B_SAN"
report "  per run (4 runs), attention B 1 $B_ATTN1 and B 32 $B_ATTN32, MQA $B_MQA, engine"
report "  $B_ENGINE, mla $B_MLA, ncu $B_NCU per kernel (4), model $B_MODEL, pass key $B_PASSKEY: $B_TOTAL s if each used all of it"

# ---- 1. build ---------------------------------------------------------------------------------
report ''
report '## Build'
report ''
if [ $DRY -eq 1 ]; then
    CFG=(-DCMAKE_BUILD_TYPE=Release -DKV_CUDA_EMULATION=ON)
    WANT_MODE=emulation
else
    CFG=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=native)
    WANT_MODE=cuda
fi
if [ $NO_BUILD -eq 1 ]; then
    report "*build: not run (--no-build): the build in \`$BUILD\` as it is.*"
else
    run build "$B_BUILD" bash -c "cmake -S '$ROOT' -B '$BUILD' ${CFG[*]} && cmake --build '$BUILD' -j $JOBS"
    log_tail build 5
fi
# the build's CUDA mode, before anything runs on it: nvcc not found means a CPU-only build
MODE=$(sed -n 's/^KV_CUDA_MODE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
[ -n "$MODE" ] || MODE=$(grep -o 'CUDA mode = [a-z]*' "$LOGS/build.log" 2>/dev/null | tail -n 1 | sed 's/.*= //')
KVLAB=$BUILD/kvlab
if [ -x "$KVLAB" ]; then
    MODE=$("$KVLAB" info 2>/dev/null | sed -n 's/^CUDA mode *//p' | head -n 1)
fi
if [ "$MODE" != "$WANT_MODE" ]; then
    report ''
    report "**The build in \`$BUILD\` is not of CUDA mode $WANT_MODE (its mode: ${MODE:-unknown}):"
    report "without nvcc CMake builds the CPU library alone, and \`ctest -L gpu\` would pass with"
    report "no test. Put nvcc on the PATH (or set CMAKE_CUDA_COMPILER) and run again.**"
    echo "gpu-report.sh: the build is not of CUDA mode $WANT_MODE (${MODE:-unknown}); report in $OUT" >&2
    exit 1
fi
report ''
report "CUDA mode: $MODE (kvlab info)."
if [ ! -x "$KVLAB" ]; then
    report ''
    report "**No kvlab in \`$BUILD\`: nothing else can run.**"
    echo "gpu-report.sh: no kvlab in $BUILD; report in $OUT" >&2
    exit 1
fi

# ---- 2. the GPU tests -------------------------------------------------------------------------
report ''
report '## GPU tests (ctest -L gpu)'
report ''
if [ $DRY -eq 1 ] && [ $ALL_TESTS -eq 0 ]; then
    report "*dry run: the emulator's own tests only (-R '^emu_'); the whole gpu suite runs in"
    report "the emulation CI, and here with --all-gpu-tests.*"
    run gpu_tests "$B_TESTS" ctest --test-dir "$BUILD" -L gpu -R '^emu_' -j "$JOBS" --output-on-failure
else
    run gpu_tests "$B_TESTS" ctest --test-dir "$BUILD" -L gpu -j 8 --output-on-failure
fi
report ''
report '```'
grep -E 'tests passed|tests failed|\(Failed\)|\*\*\*|Not Run|Timeout|No tests were found' "$LOGS/gpu_tests.log" >>"$OUT"
report '```'
if grep -q 'No tests were found' "$LOGS/gpu_tests.log"; then
    report '**No GPU test was found: the build holds none.**'
    FAILED=1
fi

# ---- 3. compute-sanitizer ---------------------------------------------------------------------
report ''
report '## compute-sanitizer'
report ''
SAN_TESTS="test_gpu_decode test_gpu_mla"
if [ $DRY -eq 1 ]; then
    report "*skipped: dry run (no GPU for compute-sanitizer).*"
elif ! command -v compute-sanitizer >/dev/null 2>&1; then
    report "*skipped: compute-sanitizer is not on the PATH (it ships with the CUDA toolkit).*"
else
    report "memcheck and racecheck over $SAN_TESTS, ${B_SAN} s each."
    report ''
    report '| tool | test | result |'
    report '| --- | --- | --- |'
    for tool in memcheck racecheck; do
        for t in $SAN_TESTS; do
            timeout --kill-after=5 "$B_SAN" compute-sanitizer --tool "$tool" --error-exitcode 99 \
                "$BUILD/tests/$t" >"$LOGS/san.log" 2>&1
            rc=$?
            summary=$(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$LOGS/san.log" | tail -n 1)
            case $rc in
            0) res="clean (${summary:-no summary})" ;;
            77) res="skipped by the test: $(grep -m 1 skipped "$LOGS/san.log")" ;;
            124|137) res="**out of time**"; FAILED=1 ;;
            99) res="**${summary:-errors}**"; FAILED=1; cp "$LOGS/san.log" "$LOGS/san-$tool-$t.log" ;;
            *) res="**test failed (exit $rc)** ${summary}"; FAILED=1 ;;
            esac
            report "| $tool | $t | $res |"
        done
    done
    for f in "$LOGS"/san-*.log; do
        [ -e "$f" ] || continue
        report ''
        report "$(basename "$f" .log), first errors:"
        report '```'
        grep -m 20 -E '=========' "$f" >>"$OUT"
        report '```'
    done
fi

# ---- 4. the benches ---------------------------------------------------------------------------
report ''
report '## bench attention --device cuda'
report ''
if [ $DRY -eq 1 ]; then
    run bench_attention "$B_ATTN1" "$KVLAB" bench attention --device cuda --csv - --quick \
        --lengths 64 --batch 1,2
    csv_table bench_attention layout,
else
    report 'B 1: every kernel to N 32k; at 128k attn v2 (the reference) and the engine alone.'
    run bench_attention "$B_ATTN1" "$KVLAB" bench attention --device cuda --csv - --lean \
        --batch 1 --lengths 4096,32768,131072 --repeats 2
    csv_table bench_attention layout,
    report ''
    report 'B 32: the engine'"'"'s batched launch alone, sequence 0 of it held bit for bit to that'
    report 'sequence decoded alone (no reference at B 32).'
    run bench_attention_b32 "$B_ATTN32" "$KVLAB" bench attention --device cuda --csv - --lean \
        --batch 32 --lengths 4096,32768 --repeats 2
    csv_table bench_attention_b32 layout,
fi
report ''
report 'ratio_to_bw: KV bytes read (B 2 H_kv N d b) / time / the device bandwidth measured in'
report 'the same run; above 1 the ceiling, not the kernel, is wrong.'

report ''
report '## bench attention --device cuda, MQA (fp16 and bf16 on tensor cores)'
report ''
if [ $DRY -eq 1 ]; then
    MQA=(--quick --heads 8 --lengths 64 --batch 1)
else
    MQA=(--lengths 32768 --batch 1 --repeats 2)
fi
run bench_attention_mqa "$B_MQA" "$KVLAB" bench attention --device cuda --csv - --kv-heads 1 \
    --dtypes fp16,bf16 --layouts contiguous "${MQA[@]}"
csv_table bench_attention_mqa layout,
report ''
report 'One KV head: version 4 runs the H query heads as the rows of mma.sync tiles for 16-bit'
report 'elements too (the sweep above, G = 4, does so only for int8 and fp8), on sm_80 and newer.'

report ''
report '## bench engine --device cuda'
report ''
if [ $DRY -eq 1 ]; then ENG=(--quick); else ENG=(--repeats 2); fi
run bench_engine "$B_ENGINE" "$KVLAB" bench engine --device cuda --csv - "${ENG[@]}"
csv_table bench_engine config,

report ''
report '## bench mla --device cuda'
report ''
if [ $DRY -eq 1 ]; then MLA=(--quick); else MLA=(--repeats 2); fi
run bench_mla "$B_MLA" "$KVLAB" bench mla --device cuda --csv - "${MLA[@]}"
csv_table bench_mla layout,
report ''
report 'The absorbed MLA decode (chapter 11): flop_per_byte = 2176 H / (576 b); of_mma: TFLOP/s over'
report 'the mma.sync throughput of the tile type (bf16 for bf16 rows, else fp16), of_bw: GB/s over'
report 'the read bandwidth, both measured in the same run.'

# ---- 5. Nsight Compute ------------------------------------------------------------------------
report ''
report '## ncu (Nsight Compute)'
report ''
METRICS=sm__inst_issued.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed
METRICS=$METRICS,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
METRICS=$METRICS,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,smsp__inst_executed.sum
METRICS=$METRICS,gpu__time_duration.sum
if [ $DRY -eq 1 ]; then
    report "*skipped: dry run (no GPU for ncu).*"
elif ! command -v ncu >/dev/null 2>&1; then
    report "*skipped: ncu is not on the PATH.*"
else
    report 'Per kernel, its first launch: issue slots busy (sm__inst_issued, % of peak while'
    report 'active), DRAM throughput (% of peak), shared-memory bank conflicts (loads, stores),'
    report 'instructions executed, time. Issue near 100% with DRAM well below: issue-bound (the'
    report 'arithmetic and conversions, not memory, set the time); DRAM near its peak: bandwidth-bound.'
    report ''
    report '| kernel | workload | metric | unit | value |'
    report '| --- | --- | --- | --- | --- |'
    ATT=(bench attention --device cuda --lengths 32768 --batch 1 --layouts contiguous --repeats 1 --lean)
    for spec in "attn_fast_kernel|fp16 G 4, N 32k|${ATT[*]} --dtypes fp16" \
                "attn_mma_kernel|int8 G 4, N 32k|${ATT[*]} --dtypes int8" \
                "flash_kernel_v5|bench prefill --quick|bench prefill --device cuda --quick" \
                "flash_kernel_v6|bench prefill --quick|bench prefill --device cuda --quick"; do
        IFS='|' read -r kname work args <<<"$spec"
        # shellcheck disable=SC2086
        timeout --kill-after=5 "$B_NCU" ncu --metrics "$METRICS" --kernel-name-base function \
            -k "regex:^$kname" --launch-count 1 --csv "$KVLAB" $args \
            >"$LOGS/ncu-$kname.log" 2>&1
        rc=$?
        if [ $rc -ne 0 ]; then
            report "| $kname | $work | **ncu exit $rc** | | |"
            FAILED=1
            continue
        fi
        awk -F'","' -v k="$kname" -v w="$work" '{ sub(/^"/, ""); sub(/"\r*$/, "") }
            /Metric Name/ && !h { for (i = 1; i <= NF; i++) col[$i] = i; h = 1; next }
            h && NF > 5 { print "| " k " | " w " | " $col["Metric Name"] " | " \
                          $col["Metric Unit"] " | " $col["Metric Value"] " |" }' \
            "$LOGS/ncu-$kname.log" >>"$OUT"
    done
fi

# ---- 6. the real model ------------------------------------------------------------------------
report ''
report '## The real model (SmolLM2-135M-Instruct, GGUF) on the GPU'
report ''
MODEL=${KVLAB_MODELS:-$HOME/.cache/kvlab/models}/SmolLM2-135M-Instruct.Q4_1.gguf
if [ $DRY -eq 1 ]; then
    report "*not run in a dry run: the model needs a GPU to be worth timing.*"
elif [ ! -f "$MODEL" ]; then
    report "*not run: no model at \`$MODEL\` (tools/fetch-model.sh smollm2 fetches it).*"
elif ! "$KVLAB" generate --help 2>&1 | grep -q -- '--model'; then
    report "*not run: this kvlab's generate takes no --model.*"
else
    run model "$B_MODEL" "$KVLAB" generate --model smollm2 --device cuda \
        --prompt "The key/value cache of a transformer" --steps 64 --no-stop
    log_tail model 12
    # the pass-key grid at 1k-8k (docs/real-model-tests.md): keys found per cache, and the
    # prompts' tokens per second of prefill and answer, from the CSV's seconds
    report ''
    report '### The pass-key grid (1k-8k tokens, 5 depths, 1 key a cell) on the GPU'
    report ''
    run passkey "$B_PASSKEY" "$KVLAB" passkey --model smollm2 --device cuda \
        --lengths 1024,2048,4096,8000 --depths 0,25,50,75,100 --keys 1 \
        --caches "fp32;fp16;int8;window/w512/s4;window/w512" --csv "$LOGS/passkey.csv"
    awk '/^summary/,0' "$LOGS/passkey.log" | sed 's/^/    /' >>"$OUT"
    if [ -f "$LOGS/passkey.csv" ]; then
        report ''
        awk -F, 'NR > 1 { t[$2] += $4; s[$2] += $NF; if (!(($2) in o)) o[$2] = ++n }
                 END { for (c in o) k[o[c]] = c;
                       for (i = 1; i <= n; i++)
                           printf "- %s: %.0f prompt tokens/s (prefill and answer)\n", k[i],
                                  s[k[i]] > 0 ? t[k[i]] / s[k[i]] : 0 }' \
            "$LOGS/passkey.csv" >>"$OUT"
    fi
fi

report ''
report "---"
report "Total $(( $(date +%s) - T_START )) s of a $BUDGET s budget; $([ $FAILED -eq 0 ] && echo 'every step that ran passed' || echo '**some step failed or ran out of time**')."
echo "gpu-report.sh: report in $OUT ($([ $FAILED -eq 0 ] && echo passed || echo 'some step failed'))"
exit $FAILED
