/**
 * @file kvemu_mma.h
 * Warp-level matrix instructions for the emulation build (cuda/emu/mma.cpp): mma.sync
 * m16n8k16 with 16-bit inputs and fp32 accumulators, and ldmatrix m8n8 (.x1/.x2/.x4, .trans).
 * Kernels do not call these: they call the helpers of cuda/core/kvcu_mma.cuh, which are
 * inline PTX in a real CUDA build and these functions here.
 *
 * Both are warp-wide, as on the GPU: every lane of a full warp must call them together. Each
 * lane hands in only the fragment registers it holds, laid out as the PTX ISA documents
 * ("Matrix Fragments for mma.m16n8k16"), and gets back only its own; a rendezvous of the warp
 * (as __syncwarp) lets each lane read the others' registers. So a kernel that puts an element
 * into the wrong register gets the wrong product here, as it would on the device.
 */
#ifndef KVEMU_MMA_H
#define KVEMU_MMA_H

#include <stdint.h>

/** d[0..3] += A·B for the warp's 16x8x16 tile; a[4], b[2] are pairs of fp16 (bf16 != 0: bf16)
 * elements, the lower index in the low 16 bits. */
extern "C" void kvemu_mma_m16n8k16(int bf16, float d[4], const uint32_t a[4], const uint32_t b[2]);

/** ldmatrix.sync.aligned.m8n8.x<n>[.trans].shared.b16: lanes 8i .. 8i + 7 give the addresses
 * of the 8 rows (16 bytes each, 16-byte aligned) of matrix i < n; lane l receives in r[i]
 * row l / 4, elements 2(l % 4) and 2(l % 4) + 1 of matrix i (.trans: of its transpose). */
extern "C" void kvemu_ldmatrix(int n, int trans, uint32_t *r, const void *row);

#endif
