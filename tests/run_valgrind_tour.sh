#!/usr/bin/env bash
# valgrind memcheck on `kvlab tour --quick`: a normal optimized CPU build with debug info,
# each chapter's demo run under memcheck at the quick sizes (the same code paths as the full
# tour, smaller contexts and one repeat: all ten chapters in a few minutes instead of over an
# hour); any invalid access, use of uninitialised memory or leak fails the script.
#
#   tests/run_valgrind_tour.sh [BUILD_DIR] [CHAPTER...]     (defaults: build-vg, every chapter)
#   KV_VG_FULL=1 tests/run_valgrind_tour.sh ...             the full-size demos (slow)
#
# Chapters run one by one so a report names its chapter. OpenMP threads: 2 (memcheck runs
# threads one at a time anyway; more only adds switching). Suppressions for libgomp's thread
# pool, which is alive at exit by design, are in tests/valgrind.supp.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-vg}
shift || true
jobs=$(nproc 2>/dev/null || echo 2)

if ! command -v valgrind >/dev/null; then
  echo "run_valgrind_tour.sh: valgrind not found (Debian: apt-get install valgrind)" >&2
  exit 2
fi
cmake -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKV_CUDA=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target kvlab

chapters=("$@")
if [ ${#chapters[@]} -eq 0 ]; then
  # every chapter the tour has: the two-digit numbers its --help lists
  mapfile -t chapters < <("$build/kvlab" tour --help | sed -n 's/^  \([0-9][0-9]\)  .*/\1/p')
fi
[ ${#chapters[@]} -gt 0 ] || { echo "no chapters found in 'kvlab tour --help'" >&2; exit 1; }

export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive
sizes=(--quick)
[ "${KV_VG_FULL:-0}" = 1 ] && sizes=()
failed=0
total_start=$(date +%s)
for ch in "${chapters[@]}"; do
  log="$build/valgrind-tour-$ch.log"
  start=$(date +%s)
  set +e
  valgrind --tool=memcheck --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible \
    --show-leak-kinds=definite,indirect,possible --track-origins=yes \
    --suppressions=tests/valgrind.supp --log-file="$log" \
    "$build/kvlab" tour "${sizes[@]}" --chapter "$ch" >/dev/null
  rc=$?
  set -e
  took=$(( $(date +%s) - start ))
  errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' "$log" | tail -n 1)
  if [ $rc -eq 0 ] && [ "${errors:-1}" = 0 ]; then
    echo "chapter $ch: memcheck clean (${took}s)"
  else
    failed=1
    echo "chapter $ch: memcheck FAILED (exit $rc, ${errors:-?} errors, ${took}s), log $log"
    grep -E '^==[0-9]+== (Invalid|Conditional|Use of|Mismatched|.*definitely|.*indirectly|.*possibly|   (at|by) )' "$log" | head -n 40 || true
  fi
done
echo "memcheck: ${#chapters[@]} chapters in $(( $(date +%s) - total_start ))s${sizes:+ (tour ${sizes[*]})}"
exit $failed
