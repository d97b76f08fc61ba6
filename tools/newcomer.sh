#!/usr/bin/env bash
# The README as a newcomer follows it: its shell blocks (```sh fences), taken from README.md as
# it is now (extracted, not copied), run in order, each checked for its exit status and against
# the time the README's times table states for it (the table's rows in order are the blocks'
# times in order; a block may take at most twice its row's time on the machine that runs it).
#
#   tools/newcomer.sh                 every block, in this checkout
#   tools/newcomer.sh 2               block 2 alone (CI runs 1, 2, 3 as stages of their own)
#   tools/newcomer.sh --clone DIR     clone this checkout's HEAD into DIR (a fresh clone: no
#                                     build folder, nothing untracked) and run there
#   tools/newcomer.sh --list          print the blocks and their stated times, run nothing
#
# CI (.ci/run) is itself a fresh clone: its README stages are this script, block by block, so
# the README's commands run once, not once for CI and again for this check. Exit status: the
# failing block's, 3 when a block ran past twice its time, 2 for bad usage or a README this
# script cannot read (a block without a row in the times table, a time it cannot parse).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

only="" clone="" list=0
while [ $# -gt 0 ]; do
  case "$1" in
    --clone) [ $# -ge 2 ] || { echo "newcomer.sh: --clone needs a folder" >&2; exit 2; }
             clone=$2; shift ;;
    --list) list=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9]*) only=$1 ;;
    *) echo "newcomer.sh: unknown argument '$1' (N, --clone DIR, --list or --help)" >&2; exit 2 ;;
  esac
  shift
done

root=$here
if [ -n "$clone" ]; then
  [ ! -e "$clone" ] || { echo "newcomer.sh: $clone exists; name a folder to create" >&2; exit 2; }
  git clone --quiet "$here" "$clone"
  root=$(cd "$clone" && pwd)
fi
cd "$root"

# the blocks: the lines between a ```sh fence and the next ```, one block per fence, joined
# with newlines; and the times table: the rows after the "| step | time |" header
mapfile -t blocks < <(awk '
  /^```sh[ \t]*$/ { inb = 1; b = ""; next }
  inb && /^```/   { inb = 0; gsub(/\n/, "\\n", b); print b; next }
  inb             { b = (b == "" ? $0 : b "\n" $0) }' README.md)
mapfile -t times < <(awk -F'|' '
  /^\| *step *\| *time *\|/ { t = 1; next }
  t && /^\|-/ { next }
  t && /^\|/  { gsub(/^ +| +$/, "", $3); print $3; next }
  t           { exit }' README.md)

[ ${#blocks[@]} -gt 0 ] || { echo "newcomer.sh: README.md has no \`\`\`sh block" >&2; exit 2; }
if [ ${#times[@]} -lt ${#blocks[@]} ]; then
  echo "newcomer.sh: README.md has ${#blocks[@]} command blocks but ${#times[@]} rows in its times table" >&2
  exit 2
fi

# "2.5 min", "40 s" -> seconds
seconds() {
  awk -v t="$1" 'BEGIN {
    if (match(t, /^[0-9.]+ *min$/)) { sub(/ *min$/, "", t); printf "%d\n", t * 60; exit 0 }
    if (match(t, /^[0-9.]+ *s$/))   { sub(/ *s$/, "", t);   printf "%d\n", t; exit 0 }
    exit 1 }'
}

rc=0
for i in "${!blocks[@]}"; do
  n=$((i + 1))
  [ -z "$only" ] || [ "$only" = "$n" ] || continue
  block=$(printf '%b' "${blocks[$i]}")
  stated=${times[$i]}
  limit=$(seconds "$stated") || { echo "newcomer.sh: block $n: cannot read the time '$stated' of the README's table" >&2; exit 2; }
  limit=$((limit * 2))
  printf '\n---- README block %d (stated %s, allowed %d s) ----\n%s\n' "$n" "$stated" "$limit" "$block"
  [ $list = 0 ] || continue
  t0=$(date +%s)
  status=0
  bash -e -o pipefail -c "$block" || status=$?
  took=$(( $(date +%s) - t0 ))
  if [ $status -ne 0 ]; then
    printf -- '---- README block %d: FAILED, exit %d after %d s ----\n' "$n" "$status" "$took"
    exit $status
  fi
  if [ $took -gt $limit ]; then
    printf -- '---- README block %d: took %d s, more than twice the README'"'"'s %s ----\n' "$n" "$took" "$stated"
    rc=3
  else
    printf -- '---- README block %d: ok, %d s (the README says %s) ----\n' "$n" "$took" "$stated"
  fi
done
if [ -n "$only" ] && { [ "$only" -lt 1 ] || [ "$only" -gt ${#blocks[@]} ]; }; then
  echo "newcomer.sh: README.md has blocks 1 to ${#blocks[@]}, not $only" >&2
  exit 2
fi
exit $rc
