#!/bin/sh
# test_bench_prefill (emulation build): `kvlab bench prefill --device cuda --quick` end to end:
# exit 0 and every row of its table (the measured mma ceilings, v5 and v6 on fp16 and int8, the three GEMMs, the GEMV, the three
# time-to-first-token rows) with a number; --device cpu refused with exit 2.
# usage: check_bench_prefill.sh <kvlab>
kvlab=$1
out=$("$kvlab" bench prefill --device cuda --quick) || { echo "FAIL: exit $?"; echo "$out"; exit 1; }
echo "$out"
pass=0 fail=0
for row in "mma.sync fp16 (measured ceiling)" "mma.sync bf16 (measured ceiling)" \
           "v5 T 64 H 4/2 d 64 causal fp16" "v6 T 64 H 4/2 d 64 causal fp16" \
           "v5 T 64 H 4/2 d 64 causal int8" "v6 T 64 H 4/2 d 64 causal int8" \
           "gemm 32x128x128 bf16 (mma)" \
           "gemm 32x128x128 fp16 (mma)" "gemm 32x128x128 fp32 (simt)" \
           "gemv 1 row, bf16 weights (ld16)" \
           "simt prefill, fp32 weights" "mma prefill, fp32 weights" "mma prefill, bf16 weights"; do
    if echo "$out" | grep -F "$row" | grep -Eq '[0-9]+\.[0-9]+'; then pass=$((pass + 1))
    else echo "FAIL: no row '$row' with a number"; fail=$((fail + 1)); fi
done
"$kvlab" bench prefill --device cpu >/dev/null 2>&1
rc=$?
if [ "$rc" -eq 2 ]; then pass=$((pass + 1)); else echo "FAIL: --device cpu exit $rc, want 2"; fail=$((fail + 1)); fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
