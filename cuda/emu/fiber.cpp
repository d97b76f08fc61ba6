/*
 * fiber.cpp: stacks and context switches for the emulator's fibers.
 *
 * On x86-64 a switch saves the six callee-saved registers on the old stack, swaps stack
 * pointers and pops the new ones: no system call (swapcontext saves the signal mask with one).
 * Elsewhere, or with -DKVEMU_USE_UCONTEXT, ucontext is the portable fallback. Under
 * AddressSanitizer every switch is announced with __sanitizer_{start,finish}_switch_fiber so
 * that ASan knows which stack is live.
 */
#include "kvemu_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifdef KVEMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

__thread kvemu_worker *kvemu_cur_worker KVEMU_TLS;

/* Every worker ever made, so that leak checkers see them as reachable. */
static kvemu_worker *all_workers[4096];
static int n_workers_made;

#ifndef KVEMU_UCONTEXT
extern "C" void kvemu_ctx_switch(void **save_sp, void *load_sp);
extern "C" void kvemu_ctx_start(void);
/* kvemu_ctx_switch(save, load): push callee-saved registers, store rsp to *save, load rsp from
 * load, pop, return into the other context. kvemu_ctx_start: the first return into a fresh
 * stack lands here, with the entry function in r12 and its argument in r13. */
asm(R"(
    .text
    .globl kvemu_ctx_switch
    .hidden kvemu_ctx_switch
    .type kvemu_ctx_switch, @function
kvemu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size kvemu_ctx_switch, .-kvemu_ctx_switch

    .globl kvemu_ctx_start
    .hidden kvemu_ctx_start
    .type kvemu_ctx_start, @function
kvemu_ctx_start:
    movq %r13, %rdi
    callq *%r12
    ud2
    .size kvemu_ctx_start, .-kvemu_ctx_start
)");
#endif

static size_t stack_bytes(void)
{
#ifdef KVEMU_ASAN
    size_t kb = 512; /* instrumented frames carry redzones */
#else
    size_t kb = 64;
#endif
    const char *e = getenv("KVEMU_STACK_KB");
    if (e && atoi(e) >= 16) kb = (size_t)atoi(e);
    return kb * 1024;
}

kvemu_worker *kvemu_worker_self(void)
{
    if (kvemu_cur_worker) return kvemu_cur_worker;
    kvemu_worker *w = (kvemu_worker *)calloc(1, sizeof(kvemu_worker));
    w->fibers = (kvemu_fiber *)calloc(1024, sizeof(kvemu_fiber));
    w->order = (int *)calloc(1024, sizeof(int));
    w->smem = (char *)aligned_alloc(128, KVEMU_SMEM_MAX);
    int slot = __atomic_fetch_add(&n_workers_made, 1, __ATOMIC_SEQ_CST);
    if (slot < 4096) all_workers[slot] = w;
    kvemu_cur_worker = w;
    return w;
}

static void stack_entry(void *p)
{
    kvemu_stack *s = (kvemu_stack *)p;
    kvemu_worker *w = s->worker;
#ifdef KVEMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &w->sched_bottom, &w->sched_size);
#endif
    kvemu_thread_main(w, s); /* never returns */
}

#ifdef KVEMU_UCONTEXT
static void uc_entry(unsigned lo, unsigned hi)
{
    stack_entry((void *)(((uintptr_t)hi << 32) | lo));
}
#endif

/** Put a fresh coroutine frame on @p s: the next switch into it starts stack_entry(s). */
void kvemu_stack_reset(kvemu_stack *s)
{
#ifdef KVEMU_ASAN
    __asan_unpoison_memory_region(s->base, s->size); /* an abandoned fiber may leave poison */
#endif
    s->asan_fake = NULL;
#ifdef KVEMU_UCONTEXT
    getcontext(&s->uc);
    s->uc.uc_stack.ss_sp = s->base;
    s->uc.uc_stack.ss_size = s->size;
    s->uc.uc_link = NULL;
    uintptr_t p = (uintptr_t)s;
    makecontext(&s->uc, (void (*)(void))uc_entry, 2, (unsigned)(p & 0xffffffffu), (unsigned)(p >> 32));
#else
    uintptr_t top = ((uintptr_t)s->base + s->size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    sp[-1] = (uint64_t)(uintptr_t)kvemu_ctx_start; /* return address of the first switch */
    sp[-2] = 0;                                    /* rbp: ends backtraces */
    sp[-3] = 0;                                    /* rbx */
    sp[-4] = (uint64_t)(uintptr_t)stack_entry;     /* r12 */
    sp[-5] = (uint64_t)(uintptr_t)s;               /* r13 */
    sp[-6] = 0;                                    /* r14 */
    sp[-7] = 0;                                    /* r15 */
    s->sp = &sp[-7];
#endif
}

/** A stack for a fiber about to start: from the worker's free list, else a new mapping. */
kvemu_stack *kvemu_stack_get(kvemu_worker *w)
{
    kvemu_stack *s = w->free_stacks;
    if (s) {
        w->free_stacks = s->next;
        return s;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE), size = (stack_bytes() + page - 1) / page * page;
    char *m = (char *)mmap(NULL, size + page, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) return NULL;
    mprotect(m, page, PROT_NONE); /* guard page: an overflow faults instead of corrupting */
    s = (kvemu_stack *)calloc(1, sizeof(kvemu_stack));
    s->base = m + page;
    s->size = size;
    s->worker = w;
    w->all_stacks[w->n_stacks++] = s;
    kvemu_stack_reset(s);
    return s;
}

/** Scheduler -> fiber: run the coroutine on @p s until it switches back. */
void kvemu_switch_in(kvemu_worker *w, kvemu_stack *s)
{
#ifdef KVEMU_ASAN
    __sanitizer_start_switch_fiber(&w->sched_fake, s->base, s->size);
#endif
#ifdef KVEMU_UCONTEXT
    swapcontext(&w->sched_uc, &s->uc);
#else
    kvemu_ctx_switch(&w->sched_sp, s->sp);
#endif
#ifdef KVEMU_ASAN
    __sanitizer_finish_switch_fiber(w->sched_fake, NULL, NULL);
#endif
    w->switches += 2;
}

/** Fiber -> scheduler; returns when the scheduler resumes this fiber. */
void kvemu_switch_out(kvemu_worker *w, kvemu_stack *s)
{
#ifdef KVEMU_ASAN
    __sanitizer_start_switch_fiber(&s->asan_fake, w->sched_bottom, w->sched_size);
#endif
#ifdef KVEMU_UCONTEXT
    swapcontext(&s->uc, &w->sched_uc);
#else
    kvemu_ctx_switch(&s->sp, w->sched_sp);
#endif
#ifdef KVEMU_ASAN
    __sanitizer_finish_switch_fiber(s->asan_fake, &w->sched_bottom, &w->sched_size);
#endif
}
