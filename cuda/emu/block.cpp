/*
 * block.cpp: running one block, its threads as fibers.
 *
 * The scheduler makes passes over the block's threads in the schedule's order (forward,
 * reverse, or a fresh seeded permutation per pass), resuming each runnable fiber until it
 * parks at a barrier or warp operation, or exits. A barrier opens when every thread of the
 * block has arrived at the same one; a warp operation completes when every non-exited lane
 * named in its mask has arrived at the same operation with the same mask, and only then are
 * all results computed, so no lane can read an exchange slot that another has overwritten.
 * A pass in which nothing could run is a deadlock: the block fails with a report, never hangs.
 */
#include "kvemu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#ifdef KVEMU_ASAN
#include <sanitizer/asan_interface.h>
#endif

__thread uint3 threadIdx KVEMU_TLS;
__thread uint3 blockIdx KVEMU_TLS;
__thread uint3 blockDim KVEMU_TLS;
__thread uint3 gridDim KVEMU_TLS;

static const char *op_name[KVEMU_W_NOPS] = {
    "__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
    "__ballot_sync", "__any_sync", "__all_sync", "__reduce_add_sync", "__reduce_min_sync",
    "__reduce_max_sync", "__reduce_min_sync", "__reduce_max_sync", "__reduce_and_sync",
    "__reduce_or_sync", "__reduce_xor_sync"};
static const char *bar_name[4] = {"__syncthreads", "__syncthreads_count", "__syncthreads_and",
                                  "__syncthreads_or"};


static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fault(kvemu_worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fault(kvemu_worker *w, const char *fmt, ...)
{
    if (w->fault[0]) return; /* keep the first */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->fault, sizeof w->fault, fmt, ap);
    va_end(ap);
}

static kvemu_fiber *next_runnable(kvemu_worker *w);
static void after_exit(kvemu_worker *w, kvemu_fiber *f);

/**
 * The coroutine on a stack: runs CUDA threads one after another. When a thread ends and the
 * next one in the schedule has not started yet, it starts right here, with no switch at all;
 * so a kernel without barriers runs a whole block on one stack.
 */
void kvemu_thread_main(kvemu_worker *w, kvemu_stack *s)
{
    for (;;) {
        kvemu_fiber *f = w->cur;
        w->job->body(w->job->arg);
        f->state = KVEMU_DONE;
        f->stack = NULL;
        w->n_done++;
        w->threads++;
        after_exit(w, f);
        kvemu_fiber *g = w->fault[0] ? NULL : next_runnable(w);
        if (g && g->state == KVEMU_NEW) {
            g->stack = s;
            g->state = KVEMU_RUN;
            w->cur = g;
            threadIdx = g->tid;
            continue;
        }
        w->pending = g; /* a parked fiber, or NULL: the scheduler takes it from here */
        w->has_pending = 1;
        w->done_stack = s;
        kvemu_switch_out(w, s);
    }
}

/* ---- barriers -------------------------------------------------------------------------- */

static void open_barrier(kvemu_worker *w)
{
    kvemu_fiber *a = &w->fibers[0];
    int count = 0;
    for (int i = 0; i < w->n; i++) {
        kvemu_fiber *f = &w->fibers[i];
        if (f->bar_line != a->bar_line || f->bar_kind != a->bar_kind ||
            (f->bar_file != a->bar_file && strcmp(f->bar_file, a->bar_file))) {
            fault(w, "threads wait at different barriers: thread (%u,%u,%u) at %s (%s:%d), "
                  "thread (%u,%u,%u) at %s (%s:%d)", a->tid.x, a->tid.y, a->tid.z,
                  bar_name[a->bar_kind], a->bar_file, a->bar_line, f->tid.x, f->tid.y, f->tid.z,
                  bar_name[f->bar_kind], f->bar_file, f->bar_line);
            return;
        }
        count += f->bar_pred;
    }
    int result = a->bar_kind == KVEMU_BAR_COUNT ? count
               : a->bar_kind == KVEMU_BAR_AND   ? count == w->n
               : a->bar_kind == KVEMU_BAR_OR    ? count > 0 : 0;
    for (int i = 0; i < w->n; i++) {
        w->fibers[i].state = KVEMU_RUN;
        w->fibers[i].bar_result = result;
    }
    w->n_bar = 0;
}

extern "C" int kvemu_barrier(int kind, int pred, const char *file, int line)
{
    kvemu_worker *w = kvemu_cur_worker;
    if (!w || !w->cur) return pred; /* called outside a kernel */
    kvemu_fiber *f = w->cur;
    f->state = KVEMU_AT_BAR;
    f->bar_kind = kind;
    f->bar_pred = pred;
    f->bar_file = file;
    f->bar_line = line;
    if (++w->n_bar == w->n) open_barrier(w);
    kvemu_switch_out(w, f->stack);
    return f->bar_result;
}

/* ---- warp operations ------------------------------------------------------------------- */

/* Result of lane l of a shuffle, following PTX shfl.sync: the warp is cut into segments of
 * `width` lanes; a source outside the segment (or not participating) yields the lane's own value. */
static uint64_t shuffle(const kvemu_fiber *base, unsigned parts, int l)
{
    const kvemu_fiber *g = &base[l];
    int width = g->width, b = g->arg & 31;
    int segmask = (32 - width) & 31, lo = l & segmask, hi = lo | (31 & ~segmask), j, ok;
    switch (g->op) {
    case KVEMU_W_IDX: j = lo | (b & ~segmask); ok = j <= hi; break;
    case KVEMU_W_UP: j = l - b; ok = j >= lo; break;
    case KVEMU_W_DOWN: j = l + b; ok = j <= hi; break;
    default: j = l ^ b; ok = j <= hi; break;
    }
    if (!ok || !((parts >> j) & 1u)) j = l;
    return base[j].value;
}

static void try_warp(kvemu_worker *w, int warp, unsigned mask)
{
    kvemu_fiber *base = &w->fibers[warp * 32];
    unsigned eff = mask & w->exists[warp], parts = 0;
    int op = -1;
    for (int l = 0; l < 32; l++) {
        if (!((eff >> l) & 1u)) continue;
        kvemu_fiber *g = &base[l];
        if (g->state == KVEMU_DONE) continue;
        if (g->state != KVEMU_AT_WARP) return; /* not arrived yet */
        if (g->mask != mask || (op >= 0 && g->op != op)) {
            kvemu_fiber *a = &base[__builtin_ctz(parts ? parts : 1u << l)];
            fault(w, "warp %d: lane %d called %s with mask 0x%08x while lane %d called %s with "
                  "mask 0x%08x", warp, a->lane, op_name[a->op], a->mask, l, op_name[g->op], g->mask);
            return;
        }
        op = g->op;
        parts |= 1u << l;
    }
    if (!parts) return;
    uint64_t r = 0;
    uint32_t bits = 0, acc = 0;
    const int first = __builtin_ctz(parts);
    for (int l = 0; l < 32; l++) {
        if (!((parts >> l) & 1u)) continue;
        uint32_t v = (uint32_t)base[l].value;
        bits |= (uint32_t)(base[l].value != 0) << l;
        if (l == first) acc = v;
        else switch (op) {
        case KVEMU_W_ADD: acc += v; break;
        case KVEMU_W_MIN_U: acc = v < acc ? v : acc; break;
        case KVEMU_W_MAX_U: acc = v > acc ? v : acc; break;
        case KVEMU_W_MIN_I: acc = (int32_t)v < (int32_t)acc ? v : acc; break;
        case KVEMU_W_MAX_I: acc = (int32_t)v > (int32_t)acc ? v : acc; break;
        case KVEMU_W_AND: acc &= v; break;
        case KVEMU_W_OR: acc |= v; break;
        case KVEMU_W_XOR_R: acc ^= v; break;
        }
    }
    switch (op) {
    case KVEMU_W_BALLOT: r = bits; break;
    case KVEMU_W_ANY: r = bits != 0; break;
    case KVEMU_W_ALL: r = bits == parts; break;
    default: r = acc; break;
    }
    for (int l = 0; l < 32; l++) {
        if (!((parts >> l) & 1u)) continue;
        if (op >= KVEMU_W_IDX && op <= KVEMU_W_XOR) base[l].result = shuffle(base, parts, l);
        else base[l].result = r;
    }
    for (int l = 0; l < 32; l++)
        if ((parts >> l) & 1u) base[l].state = KVEMU_RUN;
    w->arrived[warp] &= ~parts;
}

extern "C" uint64_t kvemu_warp(int op, unsigned mask, uint64_t value, int arg, int width)
{
    kvemu_worker *w = kvemu_cur_worker;
    if (!w || !w->cur) return value;
    kvemu_fiber *f = w->cur;
    f->state = KVEMU_AT_WARP;
    f->op = op;
    f->mask = mask;
    f->value = value;
    f->arg = arg;
    f->width = (width >= 1 && width <= 32 && !(width & (width - 1))) ? width : 32;
    f->result = value;
    if (!((mask >> f->lane) & 1u))
        fault(w, "thread (%u,%u,%u), lane %d of warp %d, called %s with mask 0x%08x, which "
              "does not include its own lane", f->tid.x, f->tid.y, f->tid.z, f->lane, f->warp,
              op_name[op], mask);
    else {
        /* cheap test first: has every live lane of the mask arrived somewhere? */
        w->arrived[f->warp] |= 1u << f->lane;
        unsigned need = mask & w->exists[f->warp] & ~w->exited[f->warp];
        if (!(need & ~w->arrived[f->warp])) try_warp(w, f->warp, mask);
    }
    kvemu_switch_out(w, f->stack);
    return f->result;
}

extern "C" unsigned kvemu_activemask(void)
{
    kvemu_worker *w = kvemu_cur_worker;
    if (!w || !w->cur) return 1u;
    kvemu_fiber *base = &w->fibers[w->cur->warp * 32];
    unsigned m = 0;
    for (int l = 0; l < 32; l++)
        if (((w->exists[w->cur->warp] >> l) & 1u) && base[l].state != KVEMU_DONE) m |= 1u << l;
    return m;
}

extern "C" void *kvemu_dynamic_smem(void)
{
    kvemu_worker *w = kvemu_cur_worker;
    return w && w->cur ? w->smem : NULL;
}

/* ---- the scheduler --------------------------------------------------------------------- */

/* Describe who waits where, for a block in which nothing can run. */
static void describe_deadlock(kvemu_worker *w)
{
    int n_bar = 0, n_warp = 0, n_done = 0;
    kvemu_fiber *first_bar = NULL, *first_warp = NULL, *first_done = NULL;
    for (int i = 0; i < w->n; i++) {
        kvemu_fiber *f = &w->fibers[i];
        if (f->state == KVEMU_AT_BAR) { n_bar++; if (!first_bar) first_bar = f; }
        if (f->state == KVEMU_AT_WARP) { n_warp++; if (!first_warp) first_warp = f; }
        if (f->state == KVEMU_DONE) { n_done++; if (!first_done) first_done = f; }
    }
    char a[200] = "", b[200] = "", c[120] = "";
    if (n_bar)
        snprintf(a, sizeof a, "%d of %d threads wait at %s (%s:%d), e.g. thread (%u,%u,%u)",
                 n_bar, w->n, bar_name[first_bar->bar_kind], first_bar->bar_file,
                 first_bar->bar_line, first_bar->tid.x, first_bar->tid.y, first_bar->tid.z);
    if (n_warp)
        snprintf(b, sizeof b, "%s%d wait at a warp operation, e.g. lane %d of warp %d at %s "
                 "(mask 0x%08x)", n_bar ? "; " : "", n_warp, first_warp->lane, first_warp->warp,
                 op_name[first_warp->op], first_warp->mask);
    if (n_done)
        snprintf(c, sizeof c, "; %d have exited, e.g. thread (%u,%u,%u)", n_done, first_done->tid.x,
                 first_done->tid.y, first_done->tid.z);
    fault(w, "deadlock: %s%s%s", a, b, c);
}

static void fill_order(kvemu_worker *w)
{
    int n = w->n, *o = w->order;
    for (int i = 0; i < n; i++) o[i] = w->job->order == KVEMU_REVERSE ? n - 1 - i : i;
    if (w->job->order == KVEMU_RANDOM)
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(((splitmix(&w->rng) >> 32) * (uint64_t)(i + 1)) >> 32), t = o[i];
            o[i] = o[j];
            o[j] = t;
        }
}

/* Next fiber to run in the schedule's order, starting a new pass when one ends; NULL when the
 * block has finished or a whole pass found nothing runnable (a deadlock). */
static kvemu_fiber *next_runnable(kvemu_worker *w)
{
    for (;;) {
        while (w->pass_k < w->n) {
            kvemu_fiber *f = &w->fibers[w->order[w->pass_k++]];
            if (f->state == KVEMU_NEW || f->state == KVEMU_RUN) {
                w->pass_ran++;
                return f;
            }
        }
        if (!w->pass_ran || w->n_done == w->n) return NULL;
        fill_order(w);
        w->pass_k = 0;
        w->pass_ran = 0;
    }
}

/* A fiber exited: lanes of its warp waiting on it may now complete. */
static void after_exit(kvemu_worker *w, kvemu_fiber *f)
{
    kvemu_fiber *base = &w->fibers[f->warp * 32];
    w->exited[f->warp] |= 1u << f->lane;
    if (!w->arrived[f->warp]) return;
    for (int l = 0; l < 32 && !w->fault[0]; l++)
        if (((w->exists[f->warp] >> l) & 1u) && base[l].state == KVEMU_AT_WARP)
            try_warp(w, f->warp, base[l].mask);
}

/**
 * Run block number @p linear of @p job on this worker. Returns 0, or -1 with a message in
 * @p msg (deadlock, mismatched warp operation, out of memory for stacks).
 */
int kvemu_run_block(kvemu_worker *w, const kvemu_job *job, uint64_t linear, char *msg, size_t msg_n)
{
    const dim3 g = job->grid, b = job->block;
    const int n = (int)(b.x * b.y * b.z);
    blockIdx = uint3{(unsigned)(linear % g.x), (unsigned)(linear / g.x % g.y),
                     (unsigned)(linear / ((uint64_t)g.x * g.y))};
    blockDim = uint3{b.x, b.y, b.z};
    gridDim = uint3{g.x, g.y, g.z};
    w->job = job;
    w->block_idx = blockIdx;
    w->n = n;
    w->n_done = 0;
    w->n_bar = 0;
    w->fault[0] = 0;
    kvemu_cp_block_start(); /* no copy of an earlier block is still in flight */
    for (int t = 0; t < n; t++) {
        kvemu_fiber *f = &w->fibers[t];
        f->state = KVEMU_NEW;
        f->tid = uint3{t % b.x, t / b.x % b.y, t / (b.x * b.y)};
        f->warp = t >> 5;
        f->lane = t & 31;
        f->stack = NULL;
    }
    for (int k = 0; k < (n + 31) / 32; k++) {
        w->exists[k] = n - 32 * k >= 32 ? 0xffffffffu : (1u << (n - 32 * k)) - 1u;
        w->arrived[k] = w->exited[k] = 0;
    }
    /* Shared memory starts as garbage on a GPU; all-ones bytes (NaN, -1) make a read before
     * write visible. Under ASan the bytes past the requested size are poisoned. */
#ifdef KVEMU_ASAN
    __asan_unpoison_memory_region(w->smem, KVEMU_SMEM_MAX);
#endif
    memset(w->smem, 0xff, job->smem);
#ifdef KVEMU_ASAN
    __asan_poison_memory_region(w->smem + job->smem, KVEMU_SMEM_MAX - job->smem);
#endif
    w->rng = job->seed ^ (linear * 0xd1b54a32d192ed03ull);
    w->pass_k = n; /* the first call starts a pass */
    w->pass_ran = 1;
    w->has_pending = 0;
    w->done_stack = NULL;

    for (;;) {
        kvemu_fiber *f = w->has_pending ? w->pending : next_runnable(w);
        w->has_pending = 0;
        if (!f || w->fault[0]) break;
        if (!f->stack && !(f->stack = kvemu_stack_get(w))) {
            fault(w, "out of memory for fiber stacks");
            break;
        }
        f->state = KVEMU_RUN;
        w->cur = f;
        threadIdx = f->tid;
        kvemu_switch_in(w, f->stack);
        if (w->done_stack) {
            w->done_stack->next = w->free_stacks;
            w->free_stacks = w->done_stack;
            w->done_stack = NULL;
        }
    }
    if (w->n_done < n && !w->fault[0]) describe_deadlock(w);
    w->cur = NULL;
    if (!w->fault[0]) return 0;

    snprintf(msg, msg_n, "kernel '%s', block (%u,%u,%u) of grid (%u,%u,%u), block size "
             "(%u,%u,%u): %s", job->name, blockIdx.x, blockIdx.y, blockIdx.z, g.x, g.y, g.z,
             b.x, b.y, b.z, w->fault);
    /* Abandon the parked fibers: fresh frames on their stacks, back to the free list. */
    for (int t = 0; t < n; t++) {
        kvemu_fiber *f = &w->fibers[t];
        if (f->stack) {
            kvemu_stack_reset(f->stack);
            f->stack->next = w->free_stacks;
            w->free_stacks = f->stack;
            f->stack = NULL;
        }
    }
    return -1;
}
