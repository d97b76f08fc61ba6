/*
 * runtime.cpp: the CUDA runtime calls other than launches. Device memory is host memory;
 * every allocation is tracked so that a copy touching memory no allocation owns fails the way
 * a real runtime call fails (cudaErrorInvalidValue) instead of corrupting the host. Work
 * issued to a stream runs at once, so streams are always idle and events time host work.
 */
#include "kvemu_internal.h"

#include <chrono>
#include <map>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- errors ------------------------------------------------------------------------------ */

static thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t pending_error = cudaSuccess; /* a failed kernel, reported at the next sync */
static std::mutex err_mu;
static char last_message[768];

void kvemu_set_error(cudaError_t e) { last_error = e; }

void kvemu_set_kernel_error(cudaError_t e, const char *msg)
{
    last_error = e;
    std::lock_guard<std::mutex> lk(err_mu);
    snprintf(last_message, sizeof last_message, "%s", msg);
    if (e == cudaErrorLaunchFailure) pending_error = e;
}

static cudaError_t fail(cudaError_t e)
{
    last_error = e;
    return e;
}

/* What a synchronizing call returns: a kernel failure since the last report, once. */
static cudaError_t sync_status(void)
{
    std::lock_guard<std::mutex> lk(err_mu);
    cudaError_t e = pending_error;
    pending_error = cudaSuccess;
    if (e != cudaSuccess) last_error = e;
    return e;
}

extern "C" const char *kvemu_last_message(void)
{
    std::lock_guard<std::mutex> lk(err_mu);
    return last_message;
}

extern "C" cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    std::lock_guard<std::mutex> lk(err_mu);
    pending_error = cudaSuccess;
    return e;
}

extern "C" cudaError_t cudaPeekAtLastError(void) { return last_error; }

static const struct { cudaError_t e; const char *name, *text; } error_table[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch argument"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid device symbol"},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorNotYetImplemented, "cudaErrorNotYetImplemented", "function not yet implemented"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", "an illegal instruction was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

extern "C" const char *cudaGetErrorString(cudaError_t e)
{
    for (const auto &t : error_table)
        if (t.e == e) return t.text;
    return "unrecognized error code";
}

extern "C" const char *cudaGetErrorName(cudaError_t e)
{
    for (const auto &t : error_table)
        if (t.e == e) return t.name;
    return "cudaErrorUnknown";
}

/* ---- memory ------------------------------------------------------------------------------ */

enum { MEM_DEVICE, MEM_MANAGED, MEM_HOST, MEM_REGISTERED, MEM_SYMBOL };
struct allocation {
    size_t size;
    int kind;
};
static std::mutex mem_mu;
static std::map<uintptr_t, allocation> allocations; /* start -> allocation */
static size_t device_in_use = 0, mem_limit = 0;
static bool limit_loaded = false;
static long fail_countdown = 0; /* kvemu_fail_alloc(): allocations left until the failing one */
static int fail_fired = 0;

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'k' || *end == 'K') v *= 1024.0;
    else if (*end == 'm' || *end == 'M') v *= 1024.0 * 1024.0;
    else if (*end == 'g' || *end == 'G') v *= 1024.0 * 1024.0 * 1024.0;
    return v > 0 ? (size_t)v : 0;
}

static size_t host_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)16 << 30;
}

static void load_limit(void)
{
    if (limit_loaded) return;
    limit_loaded = true;
    const char *e = getenv("KVEMU_MEM_LIMIT");
    if (e && *e) mem_limit = parse_size(e);
}

extern "C" void kvemu_set_mem_limit(size_t bytes)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    limit_loaded = true;
    mem_limit = bytes;
}

extern "C" void kvemu_fail_alloc(long n)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    fail_countdown = n > 0 ? n : 0;
    fail_fired = 0;
}

extern "C" int kvemu_alloc_failed(void)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    return fail_fired;
}

extern "C" size_t kvemu_mem_in_use(void)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    return device_in_use;
}

static cudaError_t alloc(void **out, size_t size, int kind)
{
    if (!out) return fail(cudaErrorInvalidValue);
    *out = NULL;
    if (size == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lk(mem_mu);
    load_limit();
    if (fail_countdown > 0 && --fail_countdown == 0) {
        fail_fired = 1;
        return fail(cudaErrorMemoryAllocation);
    }
    bool counted = kind == MEM_DEVICE || kind == MEM_MANAGED;
    size_t total = mem_limit ? mem_limit : host_ram(); /* a device cannot give more than it has */
    if (counted && (size > total || device_in_use > total - size))
        return fail(cudaErrorMemoryAllocation);
    if (size > ((size_t)1 << 40)) return fail(cudaErrorMemoryAllocation);
    size_t rounded = (size + 255) / 256 * 256; /* cudaMalloc aligns to 256 bytes */
    void *p = aligned_alloc(256, rounded);
    if (!p) return fail(cudaErrorMemoryAllocation);
    /* Fresh device memory holds garbage on a GPU: all-ones bytes (NaN, -1) make a read of
     * memory never written show up in results instead of passing as zeros. */
    if (kind == MEM_DEVICE) memset(p, 0xff, rounded);
    allocations[(uintptr_t)p] = allocation{size, kind};
    if (counted) device_in_use += size;
    *out = p;
    return cudaSuccess;
}

static cudaError_t release(void *p, bool host_kind)
{
    if (!p) return cudaSuccess;
    std::lock_guard<std::mutex> lk(mem_mu);
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end() || (it->second.kind == MEM_HOST) != host_kind ||
        it->second.kind == MEM_REGISTERED || it->second.kind == MEM_SYMBOL)
        return fail(cudaErrorInvalidValue);
    if (it->second.kind == MEM_DEVICE || it->second.kind == MEM_MANAGED)
        device_in_use -= it->second.size;
    allocations.erase(it);
    free(p);
    return cudaSuccess;
}

/* True when [p, p+n) lies inside one tracked allocation (device, managed, pinned or symbol). */
static bool owned(const void *p, size_t n)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    auto it = allocations.upper_bound((uintptr_t)p);
    if (it == allocations.begin()) return false;
    --it;
    uintptr_t start = it->first, a = (uintptr_t)p;
    return a >= start && a - start <= it->second.size && n <= it->second.size - (a - start);
}

extern "C" cudaError_t cudaMalloc(void **p, size_t size) { return alloc(p, size, MEM_DEVICE); }
extern "C" cudaError_t cudaMallocManaged(void **p, size_t size, unsigned) { return alloc(p, size, MEM_MANAGED); }
extern "C" cudaError_t cudaFree(void *p) { return release(p, false); }
extern "C" cudaError_t cudaMallocHost(void **p, size_t size) { return alloc(p, size, MEM_HOST); }
extern "C" cudaError_t cudaHostAlloc(void **p, size_t size, unsigned) { return alloc(p, size, MEM_HOST); }
extern "C" cudaError_t cudaFreeHost(void *p) { return release(p, true); }

extern "C" cudaError_t cudaHostRegister(void *p, size_t size, unsigned)
{
    if (!p || !size) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lk(mem_mu);
    allocations[(uintptr_t)p] = allocation{size, MEM_REGISTERED};
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostUnregister(void *p)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    auto it = allocations.find((uintptr_t)p);
    if (it == allocations.end() || it->second.kind != MEM_REGISTERED) return fail(cudaErrorInvalidValue);
    allocations.erase(it);
    return cudaSuccess;
}

extern "C" cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned)
{
    if (!d || !owned(h, 1)) return fail(cudaErrorInvalidValue);
    *d = h;
    return cudaSuccess;
}

extern "C" cudaError_t kvemu_symbol_register(void *symbol, size_t size)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    allocations[(uintptr_t)symbol] = allocation{size, MEM_SYMBOL};
    return cudaSuccess;
}

extern "C" cudaError_t kvemu_symbol_copy(void *dst, const void *src, size_t count)
{
    if (!dst || (!src && count)) return fail(cudaErrorInvalidValue);
    memmove(dst, src, count);
    return cudaSuccess;
}

/* The device side of a copy must be memory the runtime handed out. */
static cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    if (n == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    switch (kind) {
    case cudaMemcpyHostToHost: return cudaSuccess;
    case cudaMemcpyHostToDevice: return owned(dst, n) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return owned(src, n) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice:
        return owned(dst, n) && owned(src, n) ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}

extern "C" cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                                       cudaStream_t)
{
    cudaError_t e = check_copy(dst, src, n, kind);
    if (e) return fail(e);
    if (n) memmove(dst, src, n);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    cudaError_t e = sync_status(); /* a synchronous copy reports an earlier kernel's failure */
    if (e) return e;
    return cudaMemcpyAsync(dst, src, n, kind, 0);
}

extern "C" cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                         size_t width, size_t height, cudaMemcpyKind kind,
                                         cudaStream_t)
{
    if (width > dpitch || width > spitch) return fail(cudaErrorInvalidPitchValue);
    if (!height || !width) return cudaSuccess;
    size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    if (check_copy(dst, src, 1, kind) || (kind == cudaMemcpyHostToDevice && !owned(dst, dspan)) ||
        (kind == cudaMemcpyDeviceToHost && !owned(src, sspan)) ||
        (kind == cudaMemcpyDeviceToDevice && (!owned(dst, dspan) || !owned(src, sspan))))
        return fail(cudaErrorInvalidValue);
    for (size_t r = 0; r < height; r++)
        memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                    size_t width, size_t height, cudaMemcpyKind kind)
{
    cudaError_t e = sync_status();
    if (e) return e;
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, 0);
}

extern "C" cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t)
{
    if (n == 0) return cudaSuccess;
    if (!owned(p, n)) return fail(cudaErrorInvalidValue);
    memset(p, value, n);
    return cudaSuccess;
}

extern "C" cudaError_t cudaMemset(void *p, int value, size_t n) { return cudaMemsetAsync(p, value, n, 0); }

extern "C" cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    std::lock_guard<std::mutex> lk(mem_mu);
    load_limit();
    size_t total = mem_limit ? mem_limit : host_ram();
    if (total_bytes) *total_bytes = total;
    if (free_bytes) *free_bytes = total > device_in_use ? total - device_in_use : 0;
    return cudaSuccess;
}

/* ---- device ------------------------------------------------------------------------------ */

extern "C" cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n) return fail(cudaErrorInvalidValue);
    *n = 1;
    return cudaSuccess;
}
extern "C" cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice); }
extern "C" cudaError_t cudaGetDevice(int *d)
{
    if (!d) return fail(cudaErrorInvalidValue);
    *d = 0;
    return cudaSuccess;
}
extern "C" cudaError_t cudaDeviceSynchronize(void) { return sync_status(); }
extern "C" cudaError_t cudaDeviceReset(void) { sync_status(); last_error = cudaSuccess; return cudaSuccess; }
extern "C" cudaError_t cudaDeviceSetCacheConfig(cudaFuncCache) { return cudaSuccess; }
extern "C" cudaError_t cudaDriverGetVersion(int *v) { if (v) *v = KVEMU_CUDART_VERSION; return cudaSuccess; }
extern "C" cudaError_t cudaRuntimeGetVersion(int *v) { if (v) *v = KVEMU_CUDART_VERSION; return cudaSuccess; }

/* The architecture the emulated device pretends to be: KVEMU_SM=75 (or 80, 86, 89, 90, 100,
 * 120), 90 when unset; anything else aborts (a typo must not test sm_90 silently). What it
 * changes: the compute capability the runtime reports (the host's plans read it), the opt-in
 * shared memory per block, and mma.sync, which faults below sm_80 (mma.cpp) as __trap() would. */
int kvemu_sm(void)
{
    const char *e = getenv("KVEMU_SM");
    if (!e || !*e) return 90;
    static const int known[] = {75, 80, 86, 87, 89, 90, 100, 120};
    const int v = atoi(e);
    for (int k : known)
        if (v == k) return v;
    fprintf(stderr, "kvemu: KVEMU_SM=%s is not an architecture the emulator knows (75, 80, 86, "
            "87, 89, 90, 100, 120)\n", e);
    abort();
}

/* cudaDevAttrMaxSharedMemoryPerBlockOptin of each architecture (the CUDA C++ Programming
 * Guide's table of compute capabilities). */
unsigned kvemu_smem_optin(void)
{
    switch (kvemu_sm()) {
    case 75: return 64u * 1024u;
    case 80: case 87: return 163u * 1024u;
    case 90: case 100: return KVEMU_SMEM_MAX;
    default: return 99u * 1024u; /* 86, 89, 120 */
    }
}

extern "C" cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int device)
{
    if (!p) return fail(cudaErrorInvalidValue);
    if (device != 0) return fail(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "kvlab emulation (CPU fibers)");
    size_t free_b, total;
    cudaMemGetInfo(&free_b, &total);
    p->totalGlobalMem = total;
    p->sharedMemPerBlock = KVEMU_SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = kvemu_smem_optin();
    p->sharedMemPerMultiprocessor = 228u * 1024u;
    p->reservedSharedMemPerBlock = 1024;
    p->regsPerBlock = p->regsPerMultiprocessor = 65536;
    p->warpSize = 32;
    p->memPitch = (size_t)1 << 31;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = kvemu_sm() / 10;
    p->minor = kvemu_sm() % 10;
    p->textureAlignment = 512;
    p->multiProcessorCount = kvemu_env_threads();
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->unifiedAddressing = 1;
    p->managedMemory = 1;
    p->memoryBusWidth = 64;
    p->l2CacheSize = 0;
    p->maxThreadsPerMultiProcessor = 2048;
    p->maxBlocksPerMultiProcessor = 32;
    return cudaSuccess;
}

extern "C" cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    if (!value) return fail(cudaErrorInvalidValue);
    if (device != 0) return fail(cudaErrorInvalidDevice);
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, 0);
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *value = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *value = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *value = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *value = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *value = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrTotalConstantMemory: *value = (int)p.totalConstMem; break;
    case cudaDevAttrWarpSize: *value = p.warpSize; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = p.regsPerBlock; break;
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrGlobalMemoryBusWidth: *value = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = (int)p.sharedMemPerBlockOptin; break;
    default: return fail(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

/* ---- streams and events ------------------------------------------------------------------ */

#define STREAM_MAGIC 0x6b767374u
#define EVENT_MAGIC 0x6b766576u
struct CUstream_st {
    unsigned magic, flags;
};
struct CUevent_st {
    unsigned magic, flags;
    int recorded;
    double t; /* seconds, steady clock */
};

static double now_s(void)
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static bool stream_ok(cudaStream_t s)
{
    return !s || s == cudaStreamLegacy || s == cudaStreamPerThread || s->magic == STREAM_MAGIC;
}

extern "C" cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    if (!s) return fail(cudaErrorInvalidValue);
    *s = new CUstream_st{STREAM_MAGIC, flags};
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
extern "C" cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread || s->magic != STREAM_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    s->magic = 0;
    delete s;
    return cudaSuccess;
}
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    return sync_status();
}
extern "C" cudaError_t cudaStreamQuery(cudaStream_t s)
{
    return stream_ok(s) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
extern "C" cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned)
{
    if (!stream_ok(s) || !e || e->magic != EVENT_MAGIC) return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}
extern "C" cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *data)
{
    if (!stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    if (!fn) return fail(cudaErrorInvalidValue);
    fn(data);
    return cudaSuccess;
}

extern "C" cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    if (!e) return fail(cudaErrorInvalidValue);
    *e = new CUevent_st{EVENT_MAGIC, flags, 0, 0.0};
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
extern "C" cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    if (!e || e->magic != EVENT_MAGIC) return fail(cudaErrorInvalidResourceHandle);
    e->magic = 0;
    delete e;
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e || e->magic != EVENT_MAGIC || !stream_ok(s)) return fail(cudaErrorInvalidResourceHandle);
    e->recorded = 1;
    e->t = now_s(); /* all earlier work on every stream has already run */
    return cudaSuccess;
}
extern "C" cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e || e->magic != EVENT_MAGIC) return fail(cudaErrorInvalidResourceHandle);
    return sync_status();
}
extern "C" cudaError_t cudaEventQuery(cudaEvent_t e)
{
    return e && e->magic == EVENT_MAGIC ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}
extern "C" cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    if (!ms) return fail(cudaErrorInvalidValue);
    if (!a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC ||
        (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming) ||
        !a->recorded || !b->recorded)
        return fail(cudaErrorInvalidResourceHandle);
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}
