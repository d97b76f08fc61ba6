/*
 * kvemu_internal.h: what the emulator's own files share (not installed).
 *
 * A worker is an OS thread that runs blocks. It owns a pool of fiber stacks, reused from block
 * to block; each stack hosts a coroutine that runs CUDA threads one after another, so starting
 * a thread costs one context switch and no allocation. The worker's scheduler (its own stack)
 * resumes fibers in the schedule's order; a fiber switches back to it at every barrier, warp
 * operation and exit.
 */
#ifndef KVEMU_INTERNAL_H
#define KVEMU_INTERNAL_H

#include "cuda_runtime.h"

#include <stdint.h>
#include <stddef.h>

#if defined(__SANITIZE_ADDRESS__)
#define KVEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVEMU_ASAN 1
#endif
#endif

#if !defined(__x86_64__) || defined(KVEMU_USE_UCONTEXT)
#define KVEMU_UCONTEXT 1
#include <ucontext.h>
#endif

enum { KVEMU_NEW, KVEMU_RUN, KVEMU_AT_BAR, KVEMU_AT_WARP, KVEMU_DONE };
enum { KVEMU_FORWARD, KVEMU_REVERSE, KVEMU_RANDOM };

struct kvemu_worker;

/** A stack and the coroutine living on it (one per concurrently suspended CUDA thread). */
struct kvemu_stack {
    char *base;           /* lowest usable address (a guard page lies below) */
    size_t size;
    void *sp;             /* saved stack pointer while switched out */
#ifdef KVEMU_UCONTEXT
    ucontext_t uc;
#endif
    void *asan_fake;      /* AddressSanitizer's fake-stack handle while switched out */
    kvemu_worker *worker;
    kvemu_stack *next;    /* free list */
};

/** One CUDA thread of the running block. */
struct kvemu_fiber {
    int state;
    uint3 tid;
    int warp, lane;
    kvemu_stack *stack;   /* while started and not done */
    /* parked at a barrier */
    const char *bar_file;
    int bar_line, bar_kind, bar_pred, bar_result;
    /* parked at a warp operation */
    int op, arg, width;
    unsigned mask;
    uint64_t value, result;
};

/** What a launch runs: shared read-only by all workers. */
struct kvemu_job {
    const char *name;
    void (*body)(const void *);
    const void *arg;
    dim3 grid, block;
    size_t smem;
    int order;
    uint64_t seed;
};

struct kvemu_worker {
    void *sched_sp;                /* scheduler context while a fiber runs */
#ifdef KVEMU_UCONTEXT
    ucontext_t sched_uc;
#endif
    void *sched_fake;              /* ASan: the scheduler's fake stack while switched out */
    const void *sched_bottom;      /* ASan: the scheduler stack's bounds */
    size_t sched_size;
    kvemu_fiber *fibers;           /* [1024] */
    int *order;                    /* [1024] permutation of one pass */
    kvemu_stack *free_stacks;
    kvemu_stack *all_stacks[1024]; /* every stack this worker made */
    int n_stacks;
    kvemu_fiber *cur;
    int pass_k, pass_ran;          /* position in the current pass, fibers run in it */
    uint64_t rng;                  /* random schedule state */
    kvemu_fiber *pending;          /* chosen by a finishing fiber for the scheduler to run */
    int has_pending;
    kvemu_stack *done_stack;       /* a finished fiber's stack, for the scheduler to free */
    const kvemu_job *job;
    uint3 block_idx;
    int n, n_done, n_bar;
    unsigned exists[32];           /* per warp: lanes that exist (a partial last warp) */
    unsigned arrived[32];          /* per warp: lanes parked at a warp operation */
    unsigned exited[32];           /* per warp: lanes that have exited */
    char *smem;                    /* dynamic shared memory, KVEMU_SMEM_MAX bytes */
    char fault[512];               /* set by a fiber: the block failed */
    uint64_t switches, threads;
};

#define KVEMU_SMEM_DEFAULT (48u * 1024u)
#define KVEMU_SMEM_MAX (227u * 1024u)

/* fiber.cpp */
kvemu_worker *kvemu_worker_self(void);
kvemu_stack *kvemu_stack_get(kvemu_worker *w);
void kvemu_stack_reset(kvemu_stack *s);
void kvemu_switch_in(kvemu_worker *w, kvemu_stack *s);
void kvemu_switch_out(kvemu_worker *w, kvemu_stack *s);
extern __thread kvemu_worker *kvemu_cur_worker KVEMU_TLS;
/* block.cpp */
int kvemu_run_block(kvemu_worker *w, const kvemu_job *job, uint64_t linear, char *msg, size_t n);
void kvemu_thread_main(kvemu_worker *w, kvemu_stack *s);
/* memops.cpp: the cp.async copies left in flight by the previous block are dropped */
void kvemu_cp_block_start(void);
/* runtime.cpp */
void kvemu_set_error(cudaError_t e);
void kvemu_set_kernel_error(cudaError_t e, const char *msg);
int kvemu_env_threads(void);
int kvemu_sm(void);               /* KVEMU_SM: the architecture pretended, 90 unset */
unsigned kvemu_smem_optin(void);  /* its opt-in shared memory per block (<= KVEMU_SMEM_MAX) */

#endif
