#!/usr/bin/env bash
# gpu-report.sh: one Markdown report of what this project's CUDA half does on the GPU of this
# machine. Builds for the local architecture, runs the GPU tests (ctest -L gpu), the four
# compute-sanitizer tools over the core GPU tests, the device benches (kvlab bench attention,
# its MQA rows, engine and mla --device cuda) and Nsight Compute's sections on a 32k decode
# when ncu is there. Every step runs under its own time budget (timeout); a step that fails
# or runs out of time is reported as such and the next one runs. The budgets add up to about
# 10 minutes on one H200.
#
# Dry mode (--dry-run, or no GPU found): the emulation build (CUDA kernels on CPU fibers),
# the emulator's own GPU tests only, the benches at their --quick sizes, sanitizer and ncu
# skipped with a note. It runs end to end on a CPU machine in seconds and is a CTest test
# (test_gpu_report_dry), so the script cannot rot where no GPU is.
#
# Usage: tools/gpu-report.sh [--dry-run] [--out FILE] [--build-dir DIR] [--no-build]
#                            [--all-gpu-tests]
#   --out FILE       the report (default gpu-report.md in the current directory)
#   --build-dir DIR  the build to make or use (default build-gpu; dry mode: build-emu)
#   --no-build       use DIR as it is (it must hold kvlab and the tests): a second run after
#                    a build that ran out of its budget
#   --all-gpu-tests  dry mode: every gpu test of the emulation build, not only the emulator's
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 on a usage error.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=gpu-report.md
BUILD=
DRY=0
NO_BUILD=0
ALL_TESTS=0
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT=$2; shift ;;
    --build-dir) BUILD=$2; shift ;;
    --no-build) NO_BUILD=1 ;;
    --all-gpu-tests) ALL_TESTS=1 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-report.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

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

# Budgets in seconds (a GPU run; dry mode runs at the benches' --quick sizes).
B_BUILD=170 B_TESTS=120 B_SAN=25 B_ATTN=85 B_MQA=20 B_ENGINE=60 B_MLA=25 B_NCU=35

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
    report "- GPU: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -n 1)"
    report "- nvcc: $(nvcc --version 2>/dev/null | tail -n 1)"
fi
report "- build: \`$BUILD\`; $JOBS jobs"

# ---- 1. build ---------------------------------------------------------------------------------
report ''
report '## Build'
report ''
if [ $NO_BUILD -eq 1 ]; then
    report "*build: not run (--no-build): the build in \`$BUILD\` as it is.*"
else
    if [ $DRY -eq 1 ]; then
        CFG=(-DCMAKE_BUILD_TYPE=Release -DKV_CUDA_EMULATION=ON)
    else
        CFG=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=native)
    fi
    run build "$B_BUILD" bash -c "cmake -S '$ROOT' -B '$BUILD' ${CFG[*]} && cmake --build '$BUILD' -j $JOBS"
    log_tail build 5
fi
KVLAB=$BUILD/kvlab
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
    run gpu_tests "$B_TESTS" ctest --test-dir "$BUILD" -L gpu -j 4 --output-on-failure
fi
report ''
report '```'
grep -E 'tests passed|tests failed|\(Failed\)|\*\*\*|Not Run|Timeout' "$LOGS/gpu_tests.log" >>"$OUT"
report '```'

# ---- 3. compute-sanitizer ---------------------------------------------------------------------
report ''
report '## compute-sanitizer'
report ''
SAN_TESTS="test_gpu_ops test_gpu_gqa test_gpu_quant test_gpu_paged test_gpu_flash"
if [ $DRY -eq 1 ]; then
    report "*skipped: dry run (no GPU for compute-sanitizer).*"
elif ! command -v compute-sanitizer >/dev/null 2>&1; then
    report "*skipped: compute-sanitizer is not on the PATH (it ships with the CUDA toolkit).*"
else
    report "Tools over: $SAN_TESTS (each tool ${B_SAN} s; a test binary the budget does not reach is listed as not run)."
    report ''
    report '| tool | test | result |'
    report '| --- | --- | --- |'
    for tool in memcheck racecheck synccheck initcheck; do
        t_end=$(( $(date +%s) + B_SAN ))
        for t in $SAN_TESTS; do
            left=$(( t_end - $(date +%s) ))
            if [ $left -le 1 ]; then report "| $tool | $t | not run (budget) |"; continue; fi
            timeout --kill-after=5 "$left" compute-sanitizer --tool "$tool" --error-exitcode 99 \
                "$BUILD/tests/$t" >"$LOGS/san.log" 2>&1
            rc=$?
            summary=$(grep -o 'ERROR SUMMARY: [0-9]* error[s]*' "$LOGS/san.log" | tail -n 1)
            case $rc in
            0) res="clean (${summary:-no summary})" ;;
            77) res="skipped by the test" ;;
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
    ATTN=(--quick --lengths 64 --batch 1,2)
else
    ATTN=(--repeats 3)
fi
run bench_attention "$B_ATTN" "$KVLAB" bench attention --device cuda --csv "${ATTN[@]}"
csv_table bench_attention layout,
report ''
report 'ratio_to_bw: KV bytes read (B 2 H_kv N d b) / time / the device bandwidth measured in'
report 'the same run; above 1 the ceiling, not the kernel, is wrong.'

report ''
report '## bench attention --device cuda, MQA (fp16 and bf16 on tensor cores)'
report ''
if [ $DRY -eq 1 ]; then
    MQA=(--quick --heads 8 --lengths 64 --batch 1)
else
    MQA=(--lengths 32768 --batch 1,32 --repeats 3)
fi
run bench_attention_mqa "$B_MQA" "$KVLAB" bench attention --device cuda --csv --kv-heads 1 \
    --dtypes fp16,bf16 --layouts contiguous "${MQA[@]}"
csv_table bench_attention_mqa layout,
report ''
report 'One KV head: version 4 runs the H query heads as the rows of mma.sync tiles for 16-bit'
report 'elements too (the sweep above, G = 4, does so only for int8 and fp8).'

report ''
report '## bench engine --device cuda'
report ''
if [ $DRY -eq 1 ]; then ENG=(--quick); else ENG=(--repeats 3); fi
run bench_engine "$B_ENGINE" "$KVLAB" bench engine --device cuda --csv "${ENG[@]}"
csv_table bench_engine config,

report ''
report '## bench mla --device cuda'
report ''
if [ $DRY -eq 1 ]; then MLA=(--quick); else MLA=(--repeats 3); fi
run bench_mla "$B_MLA" "$KVLAB" bench mla --device cuda --csv "${MLA[@]}"
csv_table bench_mla layout,
report ''
report 'The absorbed MLA decode (chapter 11): flop_per_byte = 2176 H / (576 b); of_mma: TFLOP/s over'
report 'the mma.sync throughput of the tile type (bf16 for bf16 rows, else fp16), of_bw: GB/s over'
report 'the read bandwidth, both measured in the same run.'

# ---- 5. Nsight Compute ------------------------------------------------------------------------
report ''
report '## ncu (Nsight Compute)'
report ''
if [ $DRY -eq 1 ]; then
    report "*skipped: dry run (no GPU for ncu).*"
elif ! command -v ncu >/dev/null 2>&1; then
    report "*skipped: ncu is not on the PATH.*"
else
    report "Speed of light and memory workload of the decode kernels, fp16, B 1, N 32768, contiguous:"
    run ncu "$B_NCU" ncu --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --kernel-name-base function -k 'regex:attn|flash' --launch-count 6 \
        "$KVLAB" bench attention --device cuda --lengths 32768 --batch 1 --dtypes fp16 \
        --layouts contiguous --repeats 1
    log_tail ncu 120
fi

report ''
report "---"
report "Total $(( $(date +%s) - T_START )) s; $([ $FAILED -eq 0 ] && echo 'every step that ran passed' || echo '**some step failed or ran out of time**')."
echo "gpu-report.sh: report in $OUT ($([ $FAILED -eq 0 ] && echo passed || echo 'some step failed'))"
exit $FAILED
