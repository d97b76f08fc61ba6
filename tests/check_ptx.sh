#!/bin/sh
# check_ptx.sh NVCC ROOT WORKDIR: the engine's decode kernels (cuda/attention/kvcu_decode.cu,
# and the tensor-core one of kvcu_decode_mma.cu: mma.sync, ldmatrix, cp.async and the
# conversion to 16 bits in each format's body) compiled to PTX for sm_90 and assembled by
# ptxas, no GPU needed. Fails when a kernel's body
# lacks the instructions its design promises (16-byte cp.async copies of the rows, the wait,
# 16-byte shared loads; per format its conversion: cvt.f32.f16 pairs, the bf16 shift, fp8x2
# cvt on sm_90, PRMT for int8), when it loads rows byte by byte from global memory, or when
# ptxas reports spills. Prints registers and spills per kernel. Exit 77 (skipped) without nvcc.
nvcc="$1"
root="$2"
work="$3"
if [ -z "$nvcc" ] || ! command -v "$nvcc" >/dev/null 2>&1; then
    echo "nvcc not found: skipped"
    exit 77
fi
ptxas="$(dirname "$(command -v "$nvcc")")/ptxas"
mkdir -p "$work" || exit 1
inc=""
for d in "$root"/reference_cpu/* "$root"/cuda/core "$root"/cuda/cache "$root"/cuda/attention "$root"/cuda; do
    [ -d "$d" ] && inc="$inc -I$d"
done
bad=0

# compile SRC (a file under cuda/attention) to PTX and assemble it: $work/NAME.ptx, NAME.txt
compile() {
    # shellcheck disable=SC2086
    "$nvcc" -arch=sm_90 -std=c++17 -O3 -ptx $inc "$root/cuda/attention/$1.cu" -o "$work/$1.ptx" ||
        { echo "FAIL: nvcc could not compile $1.cu"; exit 1; }
    "$ptxas" -arch=sm_90 -v "$work/$1.ptx" -o "$work/$1.cubin" > "$work/$1.txt" 2>&1 ||
        { cat "$work/$1.txt"; echo "FAIL: ptxas ($1.cu)"; exit 1; }
}

# check NAME LABEL ENTRY BYTELOADS WANT...: kernel ENTRY (a mangled-name prefix) of NAME's PTX
# holds every WANT, no byte or 16-bit row loads when BYTELOADS is 0, and no spills in ptxas's
# report; prints its registers and spills
check() {
    src=$1 label=$2 entry=$3 loads=$4
    shift 4
    body="$work/body_$label.ptx"
    # (to the next entry: an inline asm's own braces, cuda_fp16.h's __hsub2, also close at
    # column 0)
    awk -v e="$entry" 'index($0, ".entry " e) {f = 1; print; next} f && /\.entry / {exit} f {print}' \
        "$work/$src.ptx" > "$body"
    if [ ! -s "$body" ]; then
        echo "FAIL $label: no kernel $entry in the PTX"
        bad=$((bad + 1))
        return
    fi
    for want in "$@"; do
        if ! grep -q -e "$want" "$body"; then
            echo "FAIL $label: the kernel has no $want"
            bad=$((bad + 1))
        fi
    done
    if [ "$loads" = 0 ] &&
       grep -Eq "ld(\.global)?(\.nc)?\.(u8|s8|b8)[^0-9]|ld\.shared(\.v[24])?\.(u8|s8|u16|b16)[^0-9]" "$body"; then
        echo "FAIL $label: byte or 16-bit loads of rows (they come 16 bytes at a time)"
        bad=$((bad + 1))
    fi
    # ptxas -v: the "Function properties" line (spills) and the "Used" line after the entry
    stats=$(awk -v e="$entry" '
        index($0, "Compiling entry function") && index($0, e) {f = 1; next}
        f && /spill stores/ {st = $5; ld = $9}
        f && /Used [0-9]+ registers/ {for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1); print r, st, ld; exit}
    ' "$work/$src.txt")
    set -- $stats
    echo "$label: ${1:-?} registers, ${2:-?} bytes spill stores, ${3:-?} bytes spill loads"
    if [ -z "$1" ] || [ "${2:-1}" != 0 ] || [ "${3:-1}" != 0 ]; then
        echo "FAIL: spills or no ptxas report"
        bad=$((bad + 1))
    fi
}

# the CUDA-core decode: format index (kv_qformat) -> name and the conversion its body must hold
compile kvcu_decode
for f in "0 fp32 ld.shared.v4" "1 fp16 cvt.f32.f16" "2 bf16 -65536" "3 int8 prmt.b32" \
         "7 fp8-e4m3 cvt.rn.f16x2.e4m3x2" "8 fp8-e5m2 cvt.rn.f16x2.e5m2x2"; do
    set -- $f
    check kvcu_decode "attn_fast_kernel<$2>" "_Z16attn_fast_kernelILi$1EE" 0 \
        "cp.async.cg.shared.global" "cp.async.wait_group" "ld.shared.v4" "$3"
done

# the tensor-core decode (kvcu_decode_mma.cu): per format and stage count (3, and the 2 of a
# GPU where 3 do not fit) its body holds mma.sync m16n8k16 (of its 16-bit type), the ldmatrix
# of S's operands and the .trans of P·V's, the rows' cp.async copies, and the one-byte formats
# their conversion to 16 bits: int8 the magic number's sub.f16x2, fp8 E4M3 its cvt, E5M2 PRMT
compile kvcu_decode_mma
for f in "1 fp16 mma.sync.aligned.m16n8k16.row.col.f32.f16" \
         "2 bf16 mma.sync.aligned.m16n8k16.row.col.f32.bf16" \
         "3 int8 sub.f16x2" "7 fp8-e4m3 cvt.rn.f16x2.e4m3x2" "8 fp8-e5m2 prmt.b32"; do
    set -- $f
    for ns in 3 2; do
        check kvcu_decode_mma "attn_mma_kernel<$2,$ns>" "_Z15attn_mma_kernelILi$1ELi${ns}EE" 1 \
            "mma.sync.aligned.m16n8k16" "ldmatrix.sync.aligned.m8n8.x4.shared" \
            "ldmatrix.sync.aligned.m8n8.x4.trans" "cp.async.cg.shared.global" "$3"
    done
done
if [ "$bad" -ne 0 ]; then
    echo "$bad failed"
    exit 1
fi
echo "16 kernels checked, 0 failed"
