/*
 * mma.cpp: mma.sync m16n8k16 and ldmatrix for the emulation build (include/kvemu_mma.h).
 *
 * A warp instruction is a rendezvous of its 32 lanes: each lane writes what it holds (its
 * fragment registers, or its row address) into the warp's staging slots, the warp meets at a
 * __syncwarp, each lane computes its own results from the slots, and the warp meets again
 * before any lane may overwrite them. A block runs on one worker thread, so the staging is
 * per worker thread: [warp][lane] for the 32 warps a block may have.
 *
 * Where each element sits follows the PTX ISA's figures for mma.m16n8k16 (.f16/.bf16 inputs,
 * .f32 accumulators), with groupID g = lane / 4 and t = lane % 4:
 *   A (16 x 16, row major), registers a0..a3, two elements each (lower column in the low half):
 *     a0: row g,     cols 2t, 2t+1       a1: row g + 8, cols 2t, 2t+1
 *     a2: row g,     cols 2t+8, 2t+9     a3: row g + 8, cols 2t+8, 2t+9
 *   B (16 x 8, "col"), registers b0, b1:  b0: rows 2t, 2t+1 of col g;  b1: rows 2t+8, 2t+9
 *   C, D (16 x 8, fp32): c0, c1: row g, cols 2t, 2t+1;  c2, c3: row g + 8, cols 2t, 2t+1
 * Products of 16-bit floats are exact in fp32; the sum runs over k in order from the
 * accumulator (the device's order inside the instruction is unspecified: tests use a bound).
 */
#include "kvemu_internal.h"
#include "kvemu_mma.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    uint32_t a[4], b[2];
    const void *row;
} mma_slot;

static __thread mma_slot stage[32][32]; /* [warp][lane] */

static float bf16_f(uint32_t h)
{
    uint32_t u = (h & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static float f16_f(uint32_t h)
{
    h &= 0xffffu;
    const int e = (int)((h >> 10) & 31), m = (int)(h & 1023);
    float v = e == 31 ? (m ? NAN : INFINITY)
                      : e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000u) ? -v : v;
}

/* Element `idx` (0: low half, 1: high) of 32-bit register `reg` of lane `lane`'s slot. */
static float elem(int bf16, uint32_t reg, int idx)
{
    const uint32_t h = idx ? reg >> 16 : reg;
    return bf16 ? bf16_f(h) : f16_f(h);
}

static void warp_fault(kvemu_worker *w, const char *what)
{
    if (w->fault[0]) return;
    snprintf(w->fault, sizeof w->fault, "warp %d: %s", w->cur->warp, what);
}

/* The calling lane's warp and lane; NULL worker outside a kernel. Faults unless the whole
 * warp (32 existing, live lanes) takes part, as the .aligned instructions require. */
static kvemu_worker *enter(int *warp, int *lane, const char *name)
{
    kvemu_worker *w = kvemu_cur_worker;
    if (!w || !w->cur) return NULL;
    *warp = w->cur->warp;
    *lane = w->cur->lane;
    if (w->exists[*warp] != 0xffffffffu || w->exited[*warp]) warp_fault(w, name);
    return w;
}

static void warp_meet(void) { kvemu_warp(KVEMU_W_SYNC, 0xffffffffu, 0, 0, 32); }

extern "C" void kvemu_mma_m16n8k16(int bf16, float d[4], const uint32_t a[4], const uint32_t b[2])
{
    int wi, l;
    kvemu_worker *w = enter(&wi, &l, "mma.sync needs all 32 lanes of the warp");
    if (!w) return;
    if (kvemu_sm() < 80) { /* a kernel built for the device traps there (kvcu_mma.cuh) */
        char what[96];
        snprintf(what, sizeof what, "mma.sync.m16n8k16 .f32 on an sm_%d device (it needs sm_80)",
                 kvemu_sm());
        warp_fault(w, what);
    }
    mma_slot *s = stage[wi];
    memcpy(s[l].a, a, sizeof s[l].a);
    memcpy(s[l].b, b, sizeof s[l].b);
    warp_meet();
    const int g = l / 4, t = l % 4;
    float out[4];
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i / 2), col = 2 * t + (i & 1);
        float acc = d[i];
        for (int k = 0; k < 16; k++) {
            /* A[row][k]: lane (row % 8)·4 + (k % 8) / 2, register (row / 8) + 2·(k / 8) */
            const int la = (row % 8) * 4 + (k % 8) / 2, ra = row / 8 + 2 * (k / 8);
            /* B[k][col]: lane col·4 + (k % 8) / 2, register k / 8 */
            const int lb = col * 4 + (k % 8) / 2, rb = k / 8;
            acc += elem(bf16, s[la].a[ra], k & 1) * elem(bf16, s[lb].b[rb], k & 1);
        }
        out[i] = acc;
    }
    warp_meet(); /* every lane has read the slots */
    memcpy(d, out, sizeof out);
}

extern "C" void kvemu_ldmatrix(int n, int trans, uint32_t *r, const void *row)
{
    int wi, l;
    kvemu_worker *w = enter(&wi, &l, "ldmatrix needs all 32 lanes of the warp");
    if (!w) return;
    mma_slot *s = stage[wi];
    s[l].row = row;
    if (l < 8 * n && ((uintptr_t)row & 15u)) {
        char msg[160];
        snprintf(msg, sizeof msg, "ldmatrix: lane %d's row address %p is not 16-byte aligned",
                 l, row);
        warp_fault(w, msg);
    }
    warp_meet();
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < n; i++) {
        uint16_t e[2];
        for (int j = 0; j < 2; j++) {
            /* element (g, 2t + j) of matrix i, or of its transpose: (2t + j, g) */
            const int rr = trans ? 2 * t + j : g, cc = trans ? g : 2 * t + j;
            const uint16_t *p = (const uint16_t *)s[8 * i + rr].row;
            e[j] = w->fault[0] ? 0xffffu : p[cc];
        }
        r[i] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    warp_meet();
}
