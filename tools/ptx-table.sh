#!/usr/bin/env bash
# ptx-table.sh: regenerate docs/ptx-table.md, the evidence a machine without a GPU can give of
# what each kernel of cuda/ costs per architecture: ptxas's registers and spill bytes, and
# from the machine code (cuobjdump -sass) the instruction count and the instructions that
# say which path a kernel takes (HMMA: tensor cores; LDGSTS: cp.async; BPT.TRAP: the trap an
# sm_80-only helper compiles to below sm_80, kvcu_mma.cuh).
#
# Then the decode kernels' main loop (attn_fast_kernel<F>, cuda/attention/kvcu_decode.cu, and
# attn_mma_kernel<F>, kvcu_decode_mma.cu): the
# machine instructions of one tile, all four warps, per byte of K and V the tile brings in, at
# one shape (d 128, G 4: H 32, H_kv 8; a contiguous cache, whole tiles). The kernel compiled
# with DEC_COUNT_* fixes that shape and one warp's thread index (dec_count_shape(), so every
# loop but the tile loop unrolls); the tile loop is the function's largest backward branch.
# --base REV counts commit REV's kernel too (a commit that has dec_count_shape()), the
# "before" column.
#
# Usage: tools/ptx-table.sh [--out FILE] [--archs "75 80 90"] [--work DIR (kept; reused)]
#                           [--count-arch 90] [--base REV] [--count-only (to stdout)]
#                           [--only "cuda/x/a.cu ..." (those files rebuilt, the other rows kept)]
# Needs nvcc (ptxas beside it). cuobjdump and nvdisasm: from the toolkit, or PyPI's
# nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (their bin/ on the PATH); without them the
# SASS columns say so. Each file is compiled once per architecture: minutes on 2 cores.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/docs/ptx-table.md
ARCHS="75 80 90"
WORK=
COUNT_ARCH=90
BASE=
COUNT_ONLY=0
ONLY=
while [ $# -gt 0 ]; do
    case "$1" in
    --out) OUT=$2; shift ;;
    --archs) ARCHS=$2; shift ;;
    --work) WORK=$2; shift ;;
    --count-arch) COUNT_ARCH=$2; shift ;;
    --base) BASE=$2; shift ;;
    --count-only) COUNT_ONLY=1 ;;
    --only) ONLY=$2; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ptx-table.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
command -v nvcc >/dev/null 2>&1 || { echo "ptx-table.sh: nvcc is not on the PATH" >&2; exit 2; }
HAVE_SASS=0
command -v cuobjdump >/dev/null 2>&1 && command -v nvdisasm >/dev/null 2>&1 && HAVE_SASS=1
[ -n "$WORK" ] || { WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; }
mkdir -p "$WORK" || exit 2
inc=""
for d in "$ROOT"/reference_cpu/* "$ROOT"/cuda/* "$ROOT"/cuda; do
    [ -d "$d" ] && [ "$(basename "$d")" != emu ] && inc="$inc -I$d"
done

# ---- the decode kernels' main loop: instructions per KV byte ----
COUNT_D=128
COUNT_G=4
# count_tree DIR TAG: DIR's decode kernels compiled once per warp (DEC_COUNT_*) for sm_COUNT_ARCH;
# appends "TAG K F warp instructions inner" per kernel K<F> (K fast: attn_fast_kernel of
# kvcu_decode.cu, mma: attn_mma_kernel of kvcu_decode_mma.cu) to $WORK/count.txt (inner: loops
# left inside the tile loop, 0 when it unrolled as meant)
count_tree() {
    cinc=""
    for d in "$1"/reference_cpu/* "$1"/cuda/* "$1"/cuda; do
        [ -d "$d" ] && [ "$(basename "$d")" != emu ] && cinc="$cinc -I$d"
    done
    for k in fast mma; do
        if [ $k = fast ]; then src=kvcu_decode.cu; sym=_Z16attn_fast_kernel; fmts="0 1 2 3 7 8"
        else src=kvcu_decode_mma.cu; sym=_Z15attn_mma_kernel; fmts="1 2 3 7 8"; fi
        for w in 0 1 2 3; do
            c="$WORK/count.$2.$k.$w.cubin"
            # a --work DIR kept from an earlier run: a cubin newer than every source is reused
            [ -s "$c" ] && [ -z "$(find "$1/cuda" "$1/reference_cpu" -newer "$c" \
                \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) | head -n 1)" ] ||
            # shellcheck disable=SC2086
            nvcc -arch=sm_$COUNT_ARCH -std=c++17 -O3 -cubin $cinc -DDEC_COUNT_D=$COUNT_D \
                -DDEC_COUNT_G=$COUNT_G -DDEC_COUNT_WARP=$w "$1/cuda/attention/$src" -o "$c" \
                >"$WORK/count.$2.$k.$w.log" 2>&1 ||
                { cat "$WORK/count.$2.$k.$w.log" >&2; echo "ptx-table.sh: the count build failed ($2, $src)" >&2; exit 1; }
            for f in $fmts; do
                # attn_mma_kernel<F, NS>: the instance of most stages (an older tree's <F> alone)
                fn=$(cuobjdump -sass "$c" | sed -n "s/.*Function : \(${sym}ILi${f}E[^ ]*\).*/\1/p" | sort | tail -n 1)
                cuobjdump -sass -fun "$fn" "$c" |
                awk -v tag="$2" -v k="$k" -v f="$f" -v w="$w" '
                    function hex(s,   i, v) { v = 0; s = tolower(s); sub(/^0x/, "", s)
                        for (i = 1; i <= length(s); i++) v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1
                        return v }
                    /^ +\/\*[0-9a-f]+\*\/ / { a = $1; gsub(/[\/*]/, "", a); n++; at[hex(a)] = n
                        if ($0 ~ / BRA /) { t = $0; sub(/.* BRA /, "", t); sub(/[ ;].*/, "", t)
                            if (hex(t) <= hex(a) && n > at[hex(t)]) { L++; lo[L] = at[hex(t)]; hi[L] = n } } }
                    END { b = 0; for (i = 1; i <= L; i++) if (!b || hi[i] - lo[i] > hi[b] - lo[b]) b = i
                          inner = 0; for (i = 1; i <= L; i++) if (i != b && lo[i] >= lo[b] && hi[i] <= hi[b]) inner++
                          print tag, k, f, w, b ? hi[b] - lo[b] + 1 : 0, inner }' >>"$WORK/count.txt"
            done
        done
    done
}

# the count's table: per kernel and format its tile (attn_fast: dec_plan()'s rule, rows doubling
# from 8 while two tiles of K stay within 8 KiB, at most 64; attn_mma: 64) and the K, V (and
# int8 scale) bytes of one tile
count_section() {
    : >"$WORK/count.txt"
    count_tree "$ROOT" now
    if [ -n "$BASE" ]; then
        b="$WORK/base"
        # extracted once per commit into a --work DIR (kept: its cubins are reused)
        if [ "$(cat "$b.rev" 2>/dev/null)" != "$(git -C "$ROOT" rev-parse "$BASE" 2>/dev/null)" ]; then
            rm -rf "$b" && mkdir -p "$b" && git -C "$ROOT" archive "$BASE" cuda reference_cpu | tar -x -C "$b" ||
                { echo "ptx-table.sh: no commit $BASE" >&2; exit 1; }
            git -C "$ROOT" rev-parse "$BASE" >"$b.rev"
        fi
        count_tree "$b" base
    fi
    echo ""
    echo "## The decode kernels' main loop: instructions per KV byte"
    echo ""
    echo "\`attn_fast_kernel<F>\` (cuda/attention/kvcu_decode.cu) and \`attn_mma_kernel<F>\`"
    echo "(kvcu_decode_mma.cu) compiled for sm_$COUNT_ARCH at one shape, d $COUNT_D and G $COUNT_G (H 32, H_kv 8),"
    echo "a contiguous cache, whole tiles (\`dec_count_shape()\`): the SASS instructions of the tile"
    echo "loop, summed over the block's four warps, per byte of K and V (and int8 scales) one tile"
    echo "brings in. A static count of what the loop issues; no GPU needed."
    [ -n "$BASE" ] && echo "base: the same count of commit $(git -C "$ROOT" rev-parse --short "$BASE")'s kernel."
    echo ""
    echo "| kernel | format | tile rows | KV bytes a tile | instructions a tile (warps 0, 1, 2, 3) | per KV byte |$( [ -n "$BASE" ] && printf ' base: per KV byte |')"
    echo "| --- | --- | --- | --- | --- | --- |$( [ -n "$BASE" ] && printf ' --- |')"
    awk -v d=$COUNT_D -v base="$BASE" '
        BEGIN { name[0] = "fp32"; name[1] = "fp16"; name[2] = "bf16"; name[3] = "int8 (per token)"
                name[7] = "fp8 E4M3"; name[8] = "fp8 E5M2"
                vec[0] = 4; vec[1] = vec[2] = 8; vec[3] = vec[7] = vec[8] = 16 }
        { key = $2 SUBSEP $3; n[$1, key] += $5; list[$1, key] = list[$1, key] ($4 ? ", " : "") $5
          in_[$1, key] += $6; seen[$1, key] = 1 }
        END { split("0 1 2 3 7 8", F, " ")
            for (kk = 1; kk <= 2; kk++) { k = kk == 1 ? "fast" : "mma"
            for (i = 1; i <= 6; i++) { f = F[i]; key = k SUBSEP f
                if (!(("now", key) in seen)) continue
                rb = 16 * d / vec[f]; t = 8
                if (k == "mma") t = 64; else while (t < 64 && 2 * t * rb <= 8192) t *= 2
                bytes = 2 * t * rb + (f == 3 ? 2 * t * 4 : 0)
                line = sprintf("| `attn_%s_kernel<%d>` | %s | %d | %d | %d (%s)%s | %.3f |", k, f, name[f], t, bytes,
                               n["now", key], list["now", key], in_["now", key] ? ", inner loops left" : "",
                               n["now", key] / bytes)
                if (base != "") line = line (("base", key) in seen ? sprintf(" %.3f%s |", n["base", key] / bytes,
                                                    in_["base", key] ? " (inner loops left)" : "") : " - |")
                print line } } }' "$WORK/count.txt"
}

if [ $COUNT_ONLY -eq 1 ]; then
    [ $HAVE_SASS -eq 1 ] || { echo "ptx-table.sh: the count needs cuobjdump" >&2; exit 2; }
    count_section
    exit 0
fi

# per arch and file: ptxas -v lines -> "arch kernel regs spill" rows; SASS -> "arch kernel n hmma ldgsts trap"
: >"$WORK/regs.txt"
: >"$WORK/sass.txt"
files=$(cd "$ROOT" && ls cuda/*/*.cu | grep -v '/kvcu_tp\.cu$')
[ -n "$ONLY" ] && files=$ONLY
for a in $ARCHS; do
    for f in $files; do
        n=$(basename "$f" .cu)
        # a --work DIR kept from an earlier run: a cubin newer than every source is reused
        if [ ! -s "$WORK/$n.$a.cubin" ] ||
           [ -n "$(find "$ROOT/cuda" "$ROOT/reference_cpu" -newer "$WORK/$n.$a.cubin" \
                   \( -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) | head -n 1)" ]; then
            # shellcheck disable=SC2086
            nvcc -arch=sm_$a -std=c++17 -O3 -cubin -Xptxas -v $inc "$ROOT/$f" \
                -o "$WORK/$n.$a.cubin" >"$WORK/$n.$a.log" 2>&1 ||
                { cat "$WORK/$n.$a.log" >&2; echo "ptx-table.sh: $f does not compile for sm_$a" >&2
                  rm -f "$WORK/$n.$a.cubin"; exit 1; }
        fi
        awk -v a="$a" '/Compiling entry function/ { k = $0; sub(/.*function .?/, "", k); sub(/.? for .*/, "", k); sp = "?" }
            /Function properties for/ { k = $NF } # (the only name ptxas gives some entries)
            /spill stores/ { sp = $5 + $9 }
            /Used [0-9]+ registers/ && k != "" { for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1)
                print a, k, r, sp; k = "" }' "$WORK/$n.$a.log" >>"$WORK/regs.txt"
        if [ $HAVE_SASS -eq 1 ]; then
            cuobjdump -sass "$WORK/$n.$a.cubin" | awk -v a="$a" '
                /Function :/ { if (k != "") print a, k, n, h, g, t; k = $3; n = h = g = t = 0; next }
                /^ +\/\*[0-9a-f][0-9a-f]*\*\/ / { n++; h += /HMMA/; g += /LDGSTS/; t += /BPT\.TRAP/ }
                END { if (k != "") print a, k, n, h, g, t }' >>"$WORK/sass.txt"
        fi
    done
done

# the table: one row per kernel (its name demangled when c++filt is there), per arch
demangle() { if command -v c++filt >/dev/null 2>&1; then c++filt; else cat; fi; }
{
    echo "# Kernels per architecture: registers, spills, machine code"
    echo ""
    echo "Generated by \`tools/ptx-table.sh\` (nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), -O3,"
    echo "each file of cuda/ compiled alone for sm_$(echo "$ARCHS" | sed 's/ /, sm_/g')); no GPU needed. regs: registers"
    echo "per thread (ptxas -v), spill: bytes of spill stores + loads. SASS: instructions of the"
    echo "kernel's machine code (cuobjdump -sass), then the HMMA (tensor-core mma), LDGSTS (cp.async)"
    echo "and BPT.TRAP among them: below sm_80 a tensor-core kernel is a trap the host never"
    echo "launches (cuda/README.md, \"Which GPUs\"), and cp.async becomes plain loads and stores."
    [ -n "$ONLY" ] && echo "This run rebuilt the rows of $(echo $ONLY | sed 's/ /, /g'); the other rows are an earlier full run's."
    echo ""
    printf '| kernel |'
    for a in $ARCHS; do printf ' sm_%s regs / spill | sm_%s SASS (HMMA, LDGSTS, trap) |' "$a" "$a"; done
    echo ""
    printf '| --- |'
    for a in $ARCHS; do printf ' --- | --- |'; done
    echo ""
    awk -v archs="$ARCHS" -v sass="$HAVE_SASS" '
        FNR == 1 { file++ }
        file == 1 { r[$1, $2] = $3 " / " $4; seen[$2] = 1; next }
        file == 2 { s[$1, $2] = $3 " (" $4 ", " $5 ", " $6 ")"; next }
        END {
            na = split(archs, A, " ")
            for (k in seen) {
                line = k "\t|"
                for (i = 1; i <= na; i++) {
                    line = line " " ((A[i], k) in r ? r[A[i], k] : "-") " |"
                    line = line " " (sass ? ((A[i], k) in s ? s[A[i], k] : "-") : "no cuobjdump") " |"
                }
                print line
            }
        }' "$WORK/regs.txt" "$WORK/sass.txt" | sort |
        while IFS="$(printf '\t')" read -r k rest; do
            printf '| `%s` %s\n' "$(echo "$k" | demangle | sed 's/|/\\|/g')" "$rest"
        done >"$WORK/rows.txt"
    # --only: the rows of kernels in files not rebuilt stay as the table had them. A kernel is
    # known by its name (`void ` and template arguments dropped): an old row goes when the
    # rebuilt files have a kernel of that name (its signature may have changed, the old row
    # would stay beside the new one) or when no file of cuda/ names it any more (removed)
    if [ -n "$ONLY" ] && [ -s "$OUT" ]; then
        kname() { sed -e 's/^| `//' -e 's/^void //' -e 's/[<(].*//'; }
        : >"$WORK/gone.txt"
        awk '/^## / { exit } /^\| `/' "$OUT" | kname | sort -u | while read -r k; do
            grep -rqw --include='*.cu' --include='*.cuh' -e "$k" "$ROOT/cuda" || echo "$k"
        done >"$WORK/gone.txt"
        kname <"$WORK/rows.txt" | sort -u >>"$WORK/gone.txt"
        awk -F'|' 'FNR == NR { drop[$1] = 1; next } FILENAME == ARGV[2] { print; next }
                   /^## / { stop = 1 }
                   !stop && /^\| `/ { k = $2; sub(/^ `/, "", k); sub(/^void /, "", k)
                                      sub(/[<(].*/, "", k); if (!(k in drop)) print }' \
            "$WORK/gone.txt" "$WORK/rows.txt" "$OUT" | sort
    else
        cat "$WORK/rows.txt"
    fi
    if [ $HAVE_SASS -eq 1 ]; then count_section; fi
} >"$OUT.tmp" && mv "$OUT.tmp" "$OUT"
echo "ptx-table.sh: $(grep -c '^| `' "$OUT") kernels in $OUT"
