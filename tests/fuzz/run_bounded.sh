#!/usr/bin/env bash
# Build the fuzz preset and run every fuzz target for a bounded time; fail on any crash,
# sanitizer report, leak, timeout or broken property. CI calls it; README.md has the long run.
#
#   tests/fuzz/run_bounded.sh [SECONDS_PER_TARGET] [BUILD_DIR]      (defaults: 30, build-fuzz)
#   KV_FUZZ_TARGETS="fuzz_args fuzz_needle" tests/fuzz/run_bounded.sh 10     (a subset)
#
# The committed seeds (tests/fuzz/corpus/<target>/ and the datasets) are copied into
# BUILD_DIR/fuzz-corpus/, so a run never changes the repository. A failing input is saved as
# BUILD_DIR/fuzz-artifacts/<target>-crash-*: copy it into tests/fuzz/regressions/<target>/ so
# that the replay test in every build keeps it, then fix the code.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-30}
build=${2:-build-fuzz}
jobs=${KV_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
targets=${KV_FUZZ_TARGETS:-"fuzz_checkpoint fuzz_tokenizer fuzz_encode fuzz_args fuzz_needle fuzz_dialogue fuzz_trace fuzz_sampler fuzz_cache_spec fuzz_vocab fuzz_gguf"}

if ! command -v clang >/dev/null; then
  echo "run_bounded.sh: clang not found (Debian: apt-get install clang libclang-rt-14-dev libomp-14-dev)" >&2
  exit 2
fi
cmake --preset fuzz -B "$build" >/dev/null
# shellcheck disable=SC2086
cmake --build "$build" -j "$jobs" --target $targets

seeds_of() { # extra read-only seed folders per target
  case "$1" in
    fuzz_needle) echo datasets/needle ;;
    fuzz_dialogue) echo datasets/dialogues ;;
    fuzz_trace) echo datasets/traces ;;
    fuzz_gguf) echo tests/data/gguf ;;
  esac
}

mkdir -p "$build/fuzz-artifacts" "$build/fuzz-logs"
export OMP_NUM_THREADS=1 # one model step per input: threads only add start-up cost
failed=0
printf '\n%-16s %8s %10s  %s\n' target seconds runs result
for t in $targets; do
  name=${t#fuzz_}
  work="$build/fuzz-corpus/$name"
  mkdir -p "$work"
  log="$build/fuzz-logs/$t.log"
  seeds=(tests/fuzz/corpus/"$name")
  [ -d "tests/fuzz/regressions/$name" ] && seeds+=(tests/fuzz/regressions/"$name")
  for s in $(seeds_of "$t"); do seeds+=("$s"); done
  start=$(date +%s)
  set +e
  # -close_fd_mask=1: the CLI parser's help on stdout is noise; stderr keeps the reports
  "$build/tests/fuzz/$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -close_fd_mask=1 -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$t-" \
    "$work" "${seeds[@]}" >"$log" 2>&1
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  if [ $rc -eq 0 ]; then
    printf '%-16s %8s %10s  %s\n' "$t" "$took" "${runs:-?}" ok
  else
    failed=1
    printf '%-16s %8s %10s  %s\n' "$t" "$took" "${runs:-?}" "FAILED (exit $rc), log $log"
    grep -E 'ERROR|runtime error|fuzz property|SUMMARY|Test unit written' "$log" | head -n 20 || true
  fi
done
if [ $failed -ne 0 ]; then
  echo "fuzz: failures above; inputs in $build/fuzz-artifacts/ (save them under tests/fuzz/regressions/)" >&2
  exit 1
fi
echo "fuzz: every target ran ${secs}s without a failure"
