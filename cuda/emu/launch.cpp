/*
 * launch.cpp: kernel launches. The configuration is checked as the device checks it, then the
 * blocks are handed out, one at a time through an atomic counter, to a pool of OS threads
 * (the launching thread works too). Each worker runs a block to completion before taking the
 * next, which is what makes `__shared__` (a thread_local) per-block storage.
 */
#include "kvemu_internal.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <thread>
#include <unordered_map>
#include <vector>

/* ---- schedule mode ---------------------------------------------------------------------- */

static std::mutex config_mu;
static int sched_order = KVEMU_FORWARD;
static uint64_t sched_seed = 0;
static char sched_spec[64] = "forward";
static bool sched_loaded = false;

static int parse_schedule(const char *spec, int *order, uint64_t *seed)
{
    if (!strcmp(spec, "forward")) { *order = KVEMU_FORWARD; *seed = 0; return 0; }
    if (!strcmp(spec, "reverse")) { *order = KVEMU_REVERSE; *seed = 0; return 0; }
    if (!strncmp(spec, "random:", 7) && spec[7]) {
        char *end;
        unsigned long long s = strtoull(spec + 7, &end, 10);
        if (*end) return -1;
        *order = KVEMU_RANDOM;
        *seed = s;
        return 0;
    }
    return -1;
}

static void load_schedule_env(void)
{
    if (sched_loaded) return;
    sched_loaded = true;
    const char *e = getenv("KVEMU_SCHEDULE");
    if (e && *e) {
        if (parse_schedule(e, &sched_order, &sched_seed) == 0)
            snprintf(sched_spec, sizeof sched_spec, "%s", e);
        else
            fprintf(stderr, "kvemu: ignoring KVEMU_SCHEDULE=%s (want forward, reverse or "
                    "random:<seed>)\n", e);
    }
}

extern "C" int kvemu_set_schedule(const char *spec)
{
    std::lock_guard<std::mutex> lk(config_mu);
    load_schedule_env();
    int order;
    uint64_t seed;
    if (!spec || parse_schedule(spec, &order, &seed)) return -1;
    sched_order = order;
    sched_seed = seed;
    snprintf(sched_spec, sizeof sched_spec, "%s", spec);
    return 0;
}

extern "C" const char *kvemu_get_schedule(void)
{
    std::lock_guard<std::mutex> lk(config_mu);
    load_schedule_env();
    return sched_spec;
}

/* ---- per-kernel attributes (cudaFuncSetAttribute) --------------------------------------- */

struct func_attr {
    int max_dynamic_smem = (int)KVEMU_SMEM_DEFAULT;
    int carveout = -1;
};
static std::unordered_map<const void *, func_attr> func_attrs;

static int max_dynamic_smem(const void *key)
{
    std::lock_guard<std::mutex> lk(config_mu);
    auto it = func_attrs.find(key);
    return it == func_attrs.end() ? (int)KVEMU_SMEM_DEFAULT : it->second.max_dynamic_smem;
}

extern "C" cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value)
{
    if (!func) { kvemu_set_error(cudaErrorInvalidDeviceFunction); return cudaErrorInvalidDeviceFunction; }
    std::lock_guard<std::mutex> lk(config_mu);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize && value >= 0 &&
        value <= (int)kvemu_smem_optin()) {
        func_attrs[func].max_dynamic_smem = value;
        return cudaSuccess;
    }
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout && value >= -1 && value <= 100) {
        func_attrs[func].carveout = value;
        return cudaSuccess;
    }
    kvemu_set_error(cudaErrorInvalidValue);
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, const void *func)
{
    if (!a || !func) { kvemu_set_error(cudaErrorInvalidValue); return cudaErrorInvalidValue; }
    memset(a, 0, sizeof *a);
    a->maxThreadsPerBlock = 1024;
    a->ptxVersion = a->binaryVersion = kvemu_sm();
    a->maxDynamicSharedSizeBytes = max_dynamic_smem(func);
    a->preferredShmemCarveout = -1;
    return cudaSuccess;
}

extern "C" cudaError_t cudaFuncSetCacheConfig(const void *, cudaFuncCache) { return cudaSuccess; }

extern "C" cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *func,
                                                                     int block, size_t smem)
{
    if (!n || block <= 0 || block > 1024) { kvemu_set_error(cudaErrorInvalidValue); return cudaErrorInvalidValue; }
    (void)func;
    int by_threads = 2048 / block, by_smem = smem ? (int)((228u * 1024u) / (smem + 1024)) : 32;
    int v = by_threads < by_smem ? by_threads : by_smem;
    *n = v < 32 ? v : 32;
    return cudaSuccess;
}

/* ---- the worker pool -------------------------------------------------------------------- */

struct pool {
    std::mutex mu;
    std::condition_variable wake, done;
    std::vector<std::thread> threads;
    uint64_t generation = 0;
    int want = 0;       /* pool threads taking part in this launch */
    int finished = 0;
    const kvemu_job *job = nullptr;
    uint64_t n_blocks = 0;
    std::atomic<uint64_t> next{0};
    std::atomic<bool> failed{false};
    char msg[768];
    std::mutex msg_mu;
    uint64_t switches = 0, threads_run = 0, blocks_run = 0;
};
static pool &P = *new pool; /* never destroyed: its threads wait on it until exit */
static std::mutex launch_mu; /* one launch at a time (streams are in order anyway) */
static int n_workers = 0;

static uint64_t stat_launches, stat_blocks, stat_threads, stat_switches;

int kvemu_env_threads(void)
{
    static int n = 0;
    if (!n) {
        const char *e = getenv("KVEMU_THREADS");
        n = e && atoi(e) > 0 ? atoi(e) : (int)std::thread::hardware_concurrency();
        if (n < 1) n = 1;
        if (n > 256) n = 256;
    }
    return n;
}

extern "C" int kvemu_num_workers(void) { return kvemu_env_threads(); }

/* Take blocks until none are left or one has failed. */
static void work(void)
{
    kvemu_worker *w = kvemu_worker_self();
    uint64_t sw0 = w->switches, th0 = w->threads, blocks = 0;
    char msg[768];
    for (;;) {
        if (P.failed.load(std::memory_order_relaxed)) break;
        uint64_t b = P.next.fetch_add(1);
        if (b >= P.n_blocks) break;
        blocks++;
        if (kvemu_run_block(w, P.job, b, msg, sizeof msg)) {
            std::lock_guard<std::mutex> lk(P.msg_mu);
            if (!P.failed.exchange(true)) snprintf(P.msg, sizeof P.msg, "%s", msg);
        }
    }
    std::lock_guard<std::mutex> lk(P.msg_mu);
    P.switches += w->switches - sw0;
    P.threads_run += w->threads - th0;
    P.blocks_run += blocks;
}

static void pool_thread(int index)
{
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lk(P.mu);
            P.wake.wait(lk, [&] { return P.generation != seen; });
            seen = P.generation;
            if (index >= P.want) continue;
        }
        work();
        std::lock_guard<std::mutex> lk(P.mu);
        if (++P.finished == P.want) P.done.notify_one();
    }
}

static void run_grid(const kvemu_job *job, uint64_t n_blocks)
{
    if (!n_workers) {
        n_workers = kvemu_env_threads();
        for (int i = 0; i < n_workers - 1; i++) {
            P.threads.emplace_back(pool_thread, i);
            P.threads.back().detach();
        }
    }
    P.job = job;
    P.n_blocks = n_blocks;
    P.next = 0;
    P.failed = false;
    P.msg[0] = 0;
    P.switches = P.threads_run = P.blocks_run = 0;
    uint64_t helpers = n_blocks - 1 < (uint64_t)(n_workers - 1) ? n_blocks - 1 : (uint64_t)(n_workers - 1);
    if (helpers) {
        std::lock_guard<std::mutex> lk(P.mu);
        P.want = (int)helpers;
        P.finished = 0;
        P.generation++;
        P.wake.notify_all();
    }
    work();
    if (helpers) {
        std::unique_lock<std::mutex> lk(P.mu);
        P.done.wait(lk, [] { return P.finished == P.want; });
    }
}

extern "C" void kvemu_stats_get(kvemu_stats *out)
{
    std::lock_guard<std::mutex> lk(launch_mu);
    out->launches = stat_launches;
    out->blocks = stat_blocks;
    out->threads = stat_threads;
    out->switches = stat_switches;
}

extern "C" void kvemu_stats_reset(void)
{
    std::lock_guard<std::mutex> lk(launch_mu);
    stat_launches = stat_blocks = stat_threads = stat_switches = 0;
}

/* ---- the launch ------------------------------------------------------------------------- */

extern "C" void kvemu_launch_raw(const char *name, const void *key, unsigned gx, unsigned gy,
                                 unsigned gz, unsigned bx, unsigned by, unsigned bz, size_t smem,
                                 struct CUstream_st *stream, void (*body)(const void *),
                                 const void *arg)
{
    (void)stream;
    char msg[768];
    /* The limits of an sm_90 device: cudaErrorInvalidConfiguration for the shape,
     * cudaErrorInvalidValue for shared memory beyond the kernel's limit. */
    uint64_t threads = (uint64_t)bx * by * bz;
    if (!bx || !by || !bz || !gx || !gy || !gz || threads > 1024 || bx > 1024 || by > 1024 ||
        bz > 64 || gx > 2147483647u || gy > 65535 || gz > 65535) {
        snprintf(msg, sizeof msg, "kernel '%s': invalid launch configuration: grid (%u,%u,%u), "
                 "block (%u,%u,%u) (at most 1024 threads, block (1024,1024,64), grid "
                 "(2^31-1,65535,65535), none zero)", name, gx, gy, gz, bx, by, bz);
        kvemu_set_kernel_error(cudaErrorInvalidConfiguration, msg);
        return;
    }
    int limit = max_dynamic_smem(key);
    if (smem > (size_t)limit) {
        snprintf(msg, sizeof msg, "kernel '%s': %zu bytes of dynamic shared memory requested, "
                 "limit %d (raise it with cudaFuncSetAttribute("
                 "cudaFuncAttributeMaxDynamicSharedMemorySize), at most %u on sm_%d)", name,
                 smem, limit, kvemu_smem_optin(), kvemu_sm());
        kvemu_set_kernel_error(cudaErrorInvalidValue, msg);
        return;
    }
    if (kvemu_cur_worker && kvemu_cur_worker->cur) {
        snprintf(msg, sizeof msg, "kernel '%s': launched from device code, which the emulator "
                 "does not support", name);
        kvemu_set_kernel_error(cudaErrorNotSupported, msg);
        return;
    }
    kvemu_job job;
    job.name = name;
    job.body = body;
    job.arg = arg;
    job.grid = dim3(gx, gy, gz);
    job.block = dim3(bx, by, bz);
    job.smem = smem;
    {
        std::lock_guard<std::mutex> lk(config_mu);
        load_schedule_env();
        job.order = sched_order;
        job.seed = sched_seed;
    }
    std::lock_guard<std::mutex> lk(launch_mu);
    run_grid(&job, (uint64_t)gx * gy * gz);
    stat_launches++;
    stat_blocks += P.blocks_run;
    stat_threads += P.threads_run;
    stat_switches += P.switches;
    if (P.failed) {
        fprintf(stderr, "kvemu: %s\n", P.msg);
        kvemu_set_kernel_error(cudaErrorLaunchFailure, P.msg);
    }
}
