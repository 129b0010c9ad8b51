/* libcuda.so.1 for machines without a GPU: "device" memory lives on the host.
 *
 * Return codes follow docs/cuda-facts.md. Memory is limited by GPUSHIM_SIM_MEMORY
 * (bytes, default 16 GiB: past it allocations fail with CUDA_ERROR_OUT_OF_MEMORY), each
 * allocating or freeing call sleeps GPUSHIM_SIM_LATENCY_US microseconds (default 0), and
 * GPUSHIM_SIM_DEVICES sets the device count (default 1). VMM physical memory is a memfd, so a
 * mapping really aliases the memory it maps.
 *
 * Test-only entry points: simCallCount(name) counts calls per function, simRealAddress(name)
 * gives this library's own address of a function whatever any interposer answers.
 *
 * GPU work is modelled in time: simLaunch(stream, ptr, size, usec) enqueues a "kernel" that
 * uses [ptr, ptr+size) for usec microseconds after the earlier work it is ordered behind
 * (its stream; the legacy stream orders with every blocking stream, non-blocking streams with
 * nothing else). Events complete when the work before them did; synchronizations sleep until
 * then. simInUse(ptr, size) says whether unfinished work still uses a range: the check a
 * caching allocator must never fail when it hands memory out. */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_ALREADY_MAPPED = 208,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
    CUDA_ERROR_CAPTURED_EVENT = 907,
};

enum { KIND_DEVICE = 1, KIND_HOST = 2, KIND_MANAGED = 3, KIND_IPC = 4 };

/* free_at: a stream-ordered free waits for the work before it; the memory stays taken until
 * then (as CUDA's own pool behaves), and is released at the next allocation after. */
/* graph: allocated by a stream-ordered call on a capturing stream (a graph memory node): the
 * graph owns it, a stream-ordered free captured into a graph does not release it, and CUDA
 * never hands its address out again while the graph exists (docs/cuda-facts.md, "Contexts,
 * resets and captures on other threads"); here graphs live as long as the process. */
struct block { uint64_t base, size; int kind; int device; int mmapped; uint64_t free_at; int shared; int64_t origin_pid; uint64_t origin_base; int graph; };
struct phys { int fd; size_t size; int device; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct block *blocks;
static size_t nblocks, cap_blocks;
static uint64_t used_bytes;
static uint64_t limit_bytes;
static unsigned latency_us;
static int ndevices = 1;
static __thread int current_device = 0;
static int configured;

/* CUDA cannot be used in a child forked after the parent initialized it: every call there fails
 * with CUDA_ERROR_NOT_INITIALIZED. The lock may have been held by another parent thread. */
static int forked_child;
static pthread_mutex_t work_mu; /* defined with the GPU-work model below */
static void in_child(void) {
    pthread_mutex_init(&mu, NULL);
    pthread_mutex_init(&work_mu, NULL);
    forked_child = 1;
}

static void configure_locked(void) {
    if (configured) return;
    configured = 1;
    pthread_atfork(NULL, NULL, in_child);
    const char *m = getenv("GPUSHIM_SIM_MEMORY");
    limit_bytes = m ? strtoull(m, NULL, 0) : (16ull << 30);
    const char *l = getenv("GPUSHIM_SIM_LATENCY_US");
    latency_us = l ? (unsigned)strtoul(l, NULL, 0) : 0;
    const char *d = getenv("GPUSHIM_SIM_DEVICES");
    ndevices = d ? atoi(d) : 1;
    if (ndevices < 1) ndevices = 1;
}

static void configure(void) {
    pthread_mutex_lock(&mu);
    configure_locked();
    pthread_mutex_unlock(&mu);
}

static void delay(void) {
    if (latency_us) {
        struct timespec ts = { latency_us / 1000000, (long)(latency_us % 1000000) * 1000 };
        nanosleep(&ts, NULL);
    }
}

/* ---- call counting ---- */
#define MAX_COUNTED 64
static struct { const char *name; atomic_long n; } counts[MAX_COUNTED];
static atomic_int ncounts;

static void count_call(const char *name) {
    int n = atomic_load(&ncounts);
    for (int i = 0; i < n; i++)
        if (counts[i].name == name) { atomic_fetch_add(&counts[i].n, 1); return; }
    pthread_mutex_lock(&mu);
    n = atomic_load(&ncounts);
    for (int i = 0; i < n; i++)
        if (counts[i].name == name) { pthread_mutex_unlock(&mu); atomic_fetch_add(&counts[i].n, 1); return; }
    if (n < MAX_COUNTED) {
        counts[n].name = name;
        atomic_store(&counts[n].n, 1);
        atomic_store(&ncounts, n + 1);
    }
    pthread_mutex_unlock(&mu);
}
#define COUNT() count_call(__func__)

EXPORT long simCallCount(const char *name) {
    int n = atomic_load(&ncounts);
    for (int i = 0; i < n; i++)
        if (strcmp(counts[i].name, name) == 0) return atomic_load(&counts[i].n);
    return 0;
}

/* Mapped ranges made accessible (cuMemSetAccess), so memory operations can tell device memory
 * from memory no longer the device's. */
struct access_range { uint64_t base, size; int device; };
#define MAX_ACCESS 4096
static struct access_range access_ranges[MAX_ACCESS];
static size_t naccess;
/* Forgets the accessible ranges inside [p, p + size) (of `device`, or any with -1), making them
 * inaccessible when `revoke` (a device reset takes the mappings away). */
static void forget_ranges(uint64_t p, uint64_t size, int device, int revoke) {
    pthread_mutex_lock(&mu);
    size_t j = 0;
    for (size_t i = 0; i < naccess; i++) {
        struct access_range r = access_ranges[i];
        int inside = r.base >= p && r.base + r.size <= p + size && (device < 0 || r.device == device);
        if (!inside) { access_ranges[j++] = r; continue; }
        if (revoke) mprotect((void *)(uintptr_t)r.base, r.size, PROT_NONE);
    }
    naccess = j;
    pthread_mutex_unlock(&mu);
}
static void forget_access(uint64_t p, uint64_t size, int device) { forget_ranges(p, size, device, 0); }

/* ---- the block table ---- */
static struct block *find_exact(uint64_t p) {
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i].base == p) return &blocks[i];
    return NULL;
}

static uint64_t now_ns(void);
static uint64_t stream_horizon(CUstream s);
static CUresult free_block(uint64_t p, int kind_a, int kind_b);

/* Releases the blocks whose stream-ordered frees have come due. */
static void reap(void) {
    uint64_t now = now_ns();
    for (;;) {
        uint64_t p = 0;
        pthread_mutex_lock(&mu);
        for (size_t i = 0; i < nblocks && !p; i++)
            if (blocks[i].free_at && blocks[i].free_at <= now) { p = blocks[i].base; blocks[i].free_at = 0; }
        pthread_mutex_unlock(&mu);
        if (!p) return;
        free_block(p, KIND_DEVICE, KIND_MANAGED);
    }
}

/* The shared-memory object an exported allocation lives in, so a peer process can map it. */
static void ipc_name(char *name, size_t n, long pid, uint64_t base) {
    snprintf(name, n, "/cudasim-%ld-%llx", pid, (unsigned long long)base);
}

static CUresult alloc_block(CUdeviceptr *out, size_t size, int kind) {
    configure();
    if (forked_child) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
    delay();
    reap();
    pthread_mutex_lock(&mu);
    if (size > limit_bytes || used_bytes + size > limit_bytes) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    size_t rounded = (size + 255) & ~(size_t)255;
    void *p = NULL;
    int mmapped = rounded >= (64u << 10); /* page-aligned: IPC can share it */
    if (mmapped) {
        p = mmap(NULL, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) p = NULL;
    } else if (posix_memalign(&p, 256, rounded) != 0) {
        p = NULL;
    }
    if (!p) { pthread_mutex_unlock(&mu); return CUDA_ERROR_OUT_OF_MEMORY; }
    if (nblocks == cap_blocks) {
        cap_blocks = cap_blocks ? cap_blocks * 2 : 256;
        blocks = realloc(blocks, cap_blocks * sizeof *blocks);
    }
    blocks[nblocks++] = (struct block){ (uint64_t)(uintptr_t)p, rounded, kind, current_device, mmapped, 0 };
    used_bytes += kind == KIND_HOST ? 0 : rounded;
    pthread_mutex_unlock(&mu);
    *out = (uint64_t)(uintptr_t)p;
    return CUDA_SUCCESS;
}

/* Frees a block of one of the accepted kinds; anything else (null handled by callers, unknown,
 * interior, already freed, wrong kind) is CUDA_ERROR_INVALID_VALUE. */
static CUresult free_block(uint64_t p, int kind_a, int kind_b) {
    if (forked_child) return 3;
    delay();
    pthread_mutex_lock(&mu);
    struct block *b = find_exact(p);
    if (!b || b->free_at || (b->kind != kind_a && b->kind != kind_b)) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct block copy = *b;
    *b = blocks[--nblocks];
    used_bytes -= copy.kind == KIND_HOST ? 0 : copy.size;
    pthread_mutex_unlock(&mu);
    if (copy.shared) {
        char name[64];
        ipc_name(name, sizeof name, getpid(), copy.base);
        shm_unlink(name);
    }
    if (copy.mmapped) munmap((void *)(uintptr_t)copy.base, copy.size);
    else free((void *)(uintptr_t)copy.base);
    return CUDA_SUCCESS;
}

/* ---- context, device, stream ---- */
EXPORT CUresult cuInit(unsigned int flags) { (void)flags; configure(); return CUDA_SUCCESS; }
EXPORT CUresult cuDriverGetVersion(int *v) { if (!v) return CUDA_ERROR_INVALID_VALUE; *v = 13000; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGetCount(int *n) { configure(); if (!n) return CUDA_ERROR_INVALID_VALUE; *n = ndevices; return CUDA_SUCCESS; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    configure();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
static int context_made;
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d) {
    configure();
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    context_made = 1;
    *ctx = (CUcontext)(uintptr_t)(d + 1);
    return CUDA_SUCCESS;
}
/* Primary contexts are always there in the simulator: active, and never destroyed. */
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
    configure();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = 1;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    return d < 0 || d >= ndevices ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}
static __thread CUcontext current_ctx;
static __thread CUcontext ctx_stack[8];
static __thread int ctx_depth;
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    current_ctx = ctx;
    current_device = ctx ? (int)(uintptr_t)ctx - 1 : 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx) { if (!ctx) return CUDA_ERROR_INVALID_VALUE; *ctx = current_ctx; return CUDA_SUCCESS; }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    if (!ctx || ctx_depth == 8) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = current_ctx;
    return cuCtxSetCurrent(ctx);
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *out) {
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (out) *out = current_ctx;
    return cuCtxSetCurrent(ctx_stack[--ctx_depth]);
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { if (!d) return CUDA_ERROR_INVALID_VALUE; *d = current_device; return CUDA_SUCCESS; }
/* cuDevicePrimaryCtxReset: every allocation of the device is freed (CUDA frees them all) and
 * the primary context keeps its handle, so a pointer from before the reset is no longer
 * memory of the device (docs/cuda-facts.md). Streams, events and captures stay as they are
 * here: the clients that reset make no use of them afterwards. */
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
    COUNT();
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    for (;;) {
        uint64_t p = 0;
        int kind = 0;
        pthread_mutex_lock(&mu);
        for (size_t i = 0; i < nblocks && !p; i++)
            if (blocks[i].device == d && (blocks[i].kind == KIND_DEVICE || blocks[i].kind == KIND_MANAGED)) {
                p = blocks[i].base;
                kind = blocks[i].kind;
                blocks[i].free_at = 0;
            }
        pthread_mutex_unlock(&mu);
        if (!p) break;
        free_block(p, kind, kind);
    }
    /* Mapped memory goes too. */
    forget_ranges(0, UINT64_MAX, d, 1);
    return CUDA_SUCCESS;
}

/* ---- GPU work in time ---- */
struct sim_stream {
    unsigned flags;
    uint64_t busy_until;
    /* Stream capture (docs/cuda-facts.md, "During a stream capture"): whether one is
     * under way, its mode (0 global, 1 thread-local, 2 relaxed), the thread that began it, and
     * whether a refused call invalidated it. */
    int capturing, cap_mode, invalidated;
    pthread_t cap_owner;
    unsigned long long cap_id;
};
static struct sim_stream legacy_stream, per_thread_stream;
#define MAX_STREAMS 1024
static struct sim_stream *streams[MAX_STREAMS];
static size_t nstreams;
#define MAX_WORK 8192
static struct { uint64_t ptr, size, end; } work[MAX_WORK];
static size_t nwork;
static pthread_mutex_t work_mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
/* Time callers spent waiting for simulated GPU work, in all (simBlockedNs). */
static _Atomic uint64_t blocked_ns;
static void sleep_until(uint64_t t) {
    uint64_t start = now_ns();
    if (start >= t) return;
    for (uint64_t n = start; n < t; n = now_ns()) {
        struct timespec ts = { (time_t)((t - n) / 1000000000ull), (long)((t - n) % 1000000000ull) };
        nanosleep(&ts, NULL);
    }
    atomic_fetch_add(&blocked_ns, now_ns() - start);
}
static struct sim_stream *sim_stream(CUstream s) {
    if (s == NULL || s == (CUstream)1) return &legacy_stream;
    if (s == (CUstream)2) return &per_thread_stream;
    return (struct sim_stream *)s;
}
/* When all work that new work on `st` is ordered behind has finished. Lock held. */
static uint64_t horizon(struct sim_stream *st) {
    uint64_t t = st->busy_until;
    if (st == &legacy_stream) {
        if (per_thread_stream.busy_until > t) t = per_thread_stream.busy_until;
        for (size_t i = 0; i < nstreams; i++)
            if (!(streams[i]->flags & 1) && streams[i]->busy_until > t) t = streams[i]->busy_until;
    } else if (!(st->flags & 1) && legacy_stream.busy_until > t) {
        t = legacy_stream.busy_until;
    }
    return t;
}
static uint64_t stream_horizon(CUstream s) {
    pthread_mutex_lock(&work_mu);
    uint64_t t = horizon(sim_stream(s));
    pthread_mutex_unlock(&work_mu);
    return t;
}
static uint64_t device_horizon(void) {
    pthread_mutex_lock(&work_mu);
    uint64_t t = horizon(&legacy_stream);
    for (size_t i = 0; i < nstreams; i++)
        if (streams[i]->busy_until > t) t = streams[i]->busy_until;
    pthread_mutex_unlock(&work_mu);
    return t;
}
EXPORT CUresult simLaunch(CUstream s, CUdeviceptr p, size_t size, unsigned usec) {
    pthread_mutex_lock(&work_mu);
    struct sim_stream *st = sim_stream(s);
    uint64_t now = now_ns(), start = horizon(st);
    if (start < now) start = now;
    st->busy_until = start + (uint64_t)usec * 1000;
    size_t j = 0;
    for (size_t i = 0; i < nwork; i++)
        if (work[i].end > now) work[j++] = work[i];
    nwork = j;
    if (nwork < MAX_WORK) {
        work[nwork].ptr = p; work[nwork].size = size; work[nwork].end = st->busy_until;
        nwork++;
    }
    pthread_mutex_unlock(&work_mu);
    return CUDA_SUCCESS;
}
EXPORT int simInUse(CUdeviceptr p, size_t size) {
    pthread_mutex_lock(&work_mu);
    uint64_t now = now_ns();
    int busy = 0;
    for (size_t i = 0; i < nwork; i++)
        if (work[i].end > now && work[i].ptr < p + size && p < work[i].ptr + work[i].size) busy = 1;
    pthread_mutex_unlock(&work_mu);
    return busy;
}
/* ---- stream capture ---- */
/* The calling thread's capture interaction mode (cuThreadExchangeStreamCaptureMode): global
 * unless the thread changed it. */
static __thread int thread_capture_mode;
static unsigned long long next_capture_id = 1;

#define FOR_EACH_STREAM(st) \
    for (size_t i_ = 0, n_ = nstreams + 2; i_ < n_; i_++) \
        for (struct sim_stream *st = i_ == 0 ? &legacy_stream : i_ == 1 ? &per_thread_stream : streams[i_ - 2]; st; st = NULL)

/* A "potentially unsafe" call (an allocation or free, an event query or wait): refused with
 * 900 when the calling thread is not in relaxed mode and either has a non-relaxed capture of
 * its own or, in global mode, another thread captures in global mode; the captures that made
 * it refused are invalidated. Measured on the GPU (scripts/gpu/capture_probe.cu). */
static CUresult unsafe_call(void) {
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&work_mu);
    if (thread_capture_mode != 2) {
        FOR_EACH_STREAM(st) {
            if (!st->capturing) continue;
            int mine = pthread_equal(st->cap_owner, pthread_self());
            if ((mine && st->cap_mode != 2) || (!mine && thread_capture_mode == 0 && st->cap_mode == 0)) {
                st->invalidated = 1;
                rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
            }
        }
    }
    pthread_mutex_unlock(&work_mu);
    return rc;
}

/* A device synchronization is refused during any capture, in every mode. */
static CUresult device_sync_call(void) {
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&work_mu);
    FOR_EACH_STREAM(st) {
        if (st->capturing) { st->invalidated = 1; rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; }
    }
    pthread_mutex_unlock(&work_mu);
    return rc;
}

EXPORT CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    COUNT();
    if (!mode || *mode < 0 || *mode > 2) return CUDA_ERROR_INVALID_VALUE;
    int old = thread_capture_mode;
    thread_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) {
    COUNT();
    CUresult rc = device_sync_call();
    if (rc) return rc;
    sleep_until(device_horizon());
    return CUDA_SUCCESS;
}
static CUresult stream_create(CUstream *s, unsigned int flags) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *st = calloc(1, sizeof *st);
    st->flags = flags;
    pthread_mutex_lock(&work_mu);
    if (nstreams < MAX_STREAMS) streams[nstreams++] = st;
    pthread_mutex_unlock(&work_mu);
    *s = st;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) { COUNT(); return stream_create(s, flags); }
EXPORT CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) {
    COUNT(); (void)priority;
    return stream_create(s, flags);
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
    COUNT();
    pthread_mutex_lock(&work_mu);
    for (size_t i = 0; i < nstreams; i++)
        if (streams[i] == (struct sim_stream *)s) { streams[i] = streams[--nstreams]; break; }
    pthread_mutex_unlock(&work_mu);
    /* Work already enqueued still runs to its end; the handle (and the memory) may be reused. */
    free(s);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    pthread_mutex_lock(&work_mu);
    uint64_t t = horizon(sim_stream(s));
    pthread_mutex_unlock(&work_mu);
    sleep_until(t);
    return CUDA_SUCCESS;
}
/* Whether everything issued to the stream finished: 0, else 600 (CUDA_ERROR_NOT_READY). Asked
 * of a capturing stream: 900 and the capture invalidated, as for the other queries (assumed,
 * not measured on the GPU; the pool never asks during a capture). */
EXPORT CUresult cuStreamQuery(CUstream s) {
    COUNT();
    pthread_mutex_lock(&work_mu);
    struct sim_stream *st = sim_stream(s);
    CUresult rc;
    if (st->capturing) {
        st->invalidated = 1;
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    } else {
        rc = now_ns() >= horizon(st) ? CUDA_SUCCESS : 600;
    }
    pthread_mutex_unlock(&work_mu);
    return rc;
}
/* CU_STREAM_CAPTURE_STATUS_NONE = 0, _ACTIVE = 1, _INVALIDATED = 2. */
EXPORT CUresult cuStreamIsCapturing(CUstream s, int *status) {
    COUNT();
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&work_mu);
    struct sim_stream *st = sim_stream(s);
    *status = st->capturing ? (st->invalidated ? 2 : 1) : 0;
    pthread_mutex_unlock(&work_mu);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamGetCaptureInfo_v3(CUstream s, int *status, unsigned long long *id, void **graph,
                                          const void **deps, const void **edges, size_t *ndeps) {
    COUNT();
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&work_mu);
    struct sim_stream *st = sim_stream(s);
    *status = st->capturing ? (st->invalidated ? 2 : 1) : 0;
    if (id) *id = st->capturing ? st->cap_id : 0;
    pthread_mutex_unlock(&work_mu);
    if (graph) *graph = NULL;
    if (deps) *deps = NULL;
    if (edges) *edges = NULL;
    if (ndeps) *ndeps = 0;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
    COUNT();
    /* The legacy stream cannot be captured. */
    if (!s || s == (CUstream)1) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&work_mu);
    struct sim_stream *st = sim_stream(s);
    CUresult rc = CUDA_SUCCESS;
    if (st->capturing) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        st->capturing = 1;
        st->cap_mode = mode;
        st->invalidated = 0;
        st->cap_owner = pthread_self();
        st->cap_id = next_capture_id++;
    }
    pthread_mutex_unlock(&work_mu);
    return rc;
}
/* The CUDA 10.0 ABI, with no mode argument: a global-mode capture. */
EXPORT CUresult cuStreamBeginCapture(CUstream s) { return cuStreamBeginCapture_v2(s, 0); }
static char sim_graph_token;
EXPORT CUresult cuStreamEndCapture(CUstream s, void **graph) {
    COUNT();
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    *graph = NULL;
    pthread_mutex_lock(&work_mu);
    struct sim_stream *st = sim_stream(s);
    CUresult rc;
    if (!s || s == (CUstream)1 || !st->capturing) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else {
        rc = st->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
        st->capturing = 0;
        st->invalidated = 0;
        if (rc == CUDA_SUCCESS) *graph = &sim_graph_token;
    }
    pthread_mutex_unlock(&work_mu);
    return rc;
}
/* An event: when the work before its record finishes, or the capture it was recorded into
 * (then it is a node of that graph, and querying it is CUDA_ERROR_CAPTURED_EVENT). */
struct sim_event { uint64_t done; struct sim_stream *captured; unsigned long long capture_id; };
EXPORT CUresult cuEventCreate(void **ev, unsigned int flags) {
    COUNT(); (void)flags;
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    *ev = calloc(1, sizeof(struct sim_event));
    return CUDA_SUCCESS;
}
EXPORT CUresult cuEventRecord(void *ev, CUstream s) {
    COUNT();
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *e = ev;
    pthread_mutex_lock(&work_mu);
    struct sim_stream *st = sim_stream(s);
    if (st->capturing) {
        e->captured = st;
        e->capture_id = st->cap_id;
    } else {
        e->captured = NULL;
        e->done = horizon(st);
    }
    pthread_mutex_unlock(&work_mu);
    return CUDA_SUCCESS;
}
/* Everything issued to the context so far, every stream's, in one event (CUDA 12.5): measured
 * on the GPU (scripts/gpu/ctx_event_probe.cu) to cover non-blocking streams and the legacy
 * stream alike. With a capture under way on any stream of the context: 900, and each such
 * capture invalidated (the driver's documented answer). CUDA_SIM_NO_CTX_EVENT=1 plays a driver
 * older than 12.5, which has no such function (801, not supported). */
EXPORT CUresult cuCtxRecordEvent(void *ctx, void *ev) {
    COUNT(); (void)ctx;
    static int absent = -1;
    if (absent < 0) absent = getenv("CUDA_SIM_NO_CTX_EVENT") != NULL;
    if (absent) return 801;
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *e = ev;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&work_mu);
    FOR_EACH_STREAM(st) {
        if (st->capturing) {
            st->invalidated = 1;
            rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    if (rc == CUDA_SUCCESS) {
        uint64_t t = horizon(&legacy_stream);
        for (size_t i = 0; i < nstreams; i++)
            if (streams[i]->busy_until > t) t = streams[i]->busy_until;
        e->captured = NULL;
        e->done = t;
    }
    pthread_mutex_unlock(&work_mu);
    return rc;
}
/* Querying or waiting for an event recorded into a capture still under way: 907, and the
 * capture is invalidated (every mode, any thread). */
static CUresult captured_event(struct sim_event *e) {
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&work_mu);
    if (e->captured && e->captured->capturing && e->captured->cap_id == e->capture_id) {
        e->captured->invalidated = 1;
        rc = CUDA_ERROR_CAPTURED_EVENT;
    }
    pthread_mutex_unlock(&work_mu);
    return rc;
}
EXPORT CUresult cuEventQuery(void *ev) {
    COUNT();
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = captured_event(ev);
    if (!rc) rc = unsafe_call();
    if (rc) return rc;
    return now_ns() >= ((struct sim_event *)ev)->done ? CUDA_SUCCESS : 600 /* CUDA_ERROR_NOT_READY */;
}
EXPORT CUresult cuEventSynchronize(void *ev) {
    COUNT();
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = captured_event(ev);
    if (!rc) rc = unsafe_call();
    if (rc) return rc;
    sleep_until(((struct sim_event *)ev)->done);
    return CUDA_SUCCESS;
}
/* A capturing stream may wait only for events recorded into the same capture: 905 and the
 * capture invalidated otherwise. */
EXPORT CUresult cuStreamWaitEvent(CUstream s, void *ev, unsigned flags) {
    COUNT(); (void)flags;
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    struct sim_event *e = ev;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&work_mu);
    struct sim_stream *st = sim_stream(s);
    if (st->capturing) {
        if (!(e->captured == st && e->capture_id == st->cap_id)) {
            st->invalidated = 1;
            rc = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        }
    } else if (!e->captured && e->done > st->busy_until) {
        st->busy_until = e->done;
    }
    pthread_mutex_unlock(&work_mu);
    return rc;
}
EXPORT CUresult cuEventDestroy_v2(void *ev) { free(ev); return CUDA_SUCCESS; }
static int default_pool;
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    (void)d;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    *pool = &default_pool;
    return CUDA_SUCCESS;
}

/* ---- memory ---- */
/* The CUDA 3.1 ABI: 32-bit sizes and pointers. Only handed out for versions before 3.2. */
EXPORT CUresult cuMemAlloc(unsigned int *p, unsigned int size) {
    COUNT();
    (void)p; (void)size;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size) {
    COUNT();
    /* A thread with no current context is answered 201 before any capture rule applies: a
     * capture under way elsewhere is not touched (measured on the GPU). */
    if (!current_ctx) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult cap = unsafe_call();
    if (cap) return cap;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    *p = 0;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_block(p, size, KIND_DEVICE);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    COUNT();
    /* The call's latency comes before its capture check: a capture another thread begins while
     * a free is on its way still refuses it (on the GPU a pool's free raced a capture so). */
    if (p) delay();
    CUresult cap = unsafe_call();
    if (cap) return cap;
    if (p == 0) return CUDA_SUCCESS;
    sleep_until(device_horizon()); /* like the real one, it waits for the device */
    return free_block(p, KIND_DEVICE, KIND_MANAGED);
}

/* The stream a stream-ordered call names: 0 from a per-thread-default-stream (_ptsz) entry
 * point is the calling thread's default stream. */
static CUstream ordered_stream(CUstream s, int ptsz) { return ptsz && s == NULL ? (CUstream)2 : s; }
static int stream_capturing(CUstream s) {
    pthread_mutex_lock(&work_mu);
    int c = sim_stream(s)->capturing;
    pthread_mutex_unlock(&work_mu);
    return c;
}
/* On a capturing stream the allocation becomes a graph memory node: the graph owns the block. */
static CUresult alloc_async(CUdeviceptr *p, size_t size, CUstream s) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    *p = 0;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = alloc_block(p, size, KIND_DEVICE);
    if (rc == CUDA_SUCCESS && stream_capturing(s)) {
        pthread_mutex_lock(&mu);
        struct block *b = find_exact(*p);
        if (b) b->graph = 1;
        pthread_mutex_unlock(&mu);
    }
    return rc;
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s) { COUNT(); return alloc_async(p, size, s); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s) { COUNT(); return alloc_async(p, size, ordered_stream(s, 1)); }
static CUresult free_async(CUdeviceptr p, CUstream s) {
    if (p == 0) return CUDA_ERROR_INVALID_VALUE;
    if (stream_capturing(s)) {
        /* A free node of the graph: the memory stays the graph's. */
        pthread_mutex_lock(&mu);
        struct block *b = find_exact(p);
        CUresult rc = b && b->graph ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
        pthread_mutex_unlock(&mu);
        return rc;
    }
    uint64_t t = stream_horizon(s);
    if (t <= now_ns()) return free_block(p, KIND_DEVICE, KIND_MANAGED);
    pthread_mutex_lock(&mu);
    struct block *b = find_exact(p);
    CUresult rc = !b || b->free_at || (b->kind != KIND_DEVICE && b->kind != KIND_MANAGED) ? CUDA_ERROR_INVALID_VALUE
                                                                                         : CUDA_SUCCESS;
    if (rc == CUDA_SUCCESS) b->free_at = t;
    pthread_mutex_unlock(&mu);
    return rc;
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { COUNT(); return free_async(p, s); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { COUNT(); return free_async(p, ordered_stream(s, 1)); }
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    COUNT();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(p, size, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    COUNT();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(p, size, ordered_stream(s, 1));
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    COUNT();
    if (!p || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pt = (width + 511) & ~(size_t)511;
    CUresult rc = alloc_block(p, pt * height, KIND_DEVICE);
    if (rc == CUDA_SUCCESS) *pitch = pt;
    return rc;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags) {
    COUNT(); (void)flags;
    if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_block(p, size, KIND_MANAGED);
}

EXPORT CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags) {
    COUNT(); (void)flags;
    CUresult cap = unsafe_call();
    if (cap) return cap;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    sleep_until(device_horizon()); /* pinning waits for the device, as measured */
    CUdeviceptr out = 0;
    CUresult rc = alloc_block(&out, size ? size : 1, KIND_HOST);
    *p = rc == CUDA_SUCCESS ? (void *)(uintptr_t)out : NULL;
    return rc;
}

EXPORT CUresult cuMemFreeHost(void *p) {
    COUNT();
    CUresult cap = unsafe_call();
    if (cap) return cap;
    sleep_until(device_horizon());
    return free_block((uint64_t)(uintptr_t)p, KIND_HOST, KIND_HOST);
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    COUNT();
    configure();
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *total_bytes = limit_bytes;
    *free_bytes = limit_bytes - used_bytes;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* Simulator only: device memory in use, as NVML would show it (the shim never sees this call). */
/* Test-only: nanoseconds any caller spent blocked waiting for simulated GPU work. */
EXPORT uint64_t simBlockedNs(void) { return atomic_load(&blocked_ns); }

/* Simulator only, for its NVML: whether this process made a context, and the device's size. */
EXPORT int simContextMade(void) { return context_made; }
EXPORT size_t simLimitBytes(void) { configure(); return limit_bytes; }

EXPORT size_t simUsedBytes(void) {
    configure();
    pthread_mutex_lock(&mu);
    size_t u = used_bytes;
    pthread_mutex_unlock(&mu);
    return u;
}

static struct block *find_containing(uint64_t p) {
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i].base <= p && p < blocks[i].base + blocks[i].size) return &blocks[i];
    return NULL;
}
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    COUNT();
    pthread_mutex_lock(&mu);
    struct block *b = find_containing(p);
    CUresult rc = b && b->kind != KIND_HOST ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
    if (b && base) *base = b->base;
    if (b && size) *size = b->size;
    pthread_mutex_unlock(&mu);
    return rc;
}
enum { ATTR_CONTEXT = 1, ATTR_MEMORY_TYPE = 2, ATTR_DEVICE_POINTER = 3, ATTR_RANGE_START = 11, ATTR_RANGE_SIZE = 12,
       ATTR_DEVICE_ORDINAL = 16 };
static CUresult attribute(void *data, int attr, CUdeviceptr p) {
    struct block *b = find_containing(p);
    if (!b) return CUDA_ERROR_INVALID_VALUE;
    switch (attr) {
    case ATTR_CONTEXT: *(CUcontext *)data = (CUcontext)(uintptr_t)(b->device + 1); return CUDA_SUCCESS;
    case ATTR_MEMORY_TYPE: *(unsigned *)data = b->kind == KIND_HOST ? 1 : 2; return CUDA_SUCCESS;
    case ATTR_DEVICE_POINTER: *(CUdeviceptr *)data = p; return CUDA_SUCCESS;
    case ATTR_RANGE_START: *(CUdeviceptr *)data = b->base; return CUDA_SUCCESS;
    case ATTR_RANGE_SIZE: *(size_t *)data = b->size; return CUDA_SUCCESS;
    case ATTR_DEVICE_ORDINAL: *(int *)data = b->device; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}
EXPORT CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    COUNT();
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult rc = attribute(data, attr, p);
    pthread_mutex_unlock(&mu);
    return rc;
}
EXPORT CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
    COUNT();
    if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult rc = CUDA_SUCCESS;
    for (unsigned i = 0; i < n && rc == CUDA_SUCCESS; i++) rc = attribute(data[i], attrs[i], p);
    pthread_mutex_unlock(&mu);
    return rc;
}
/* Legacy IPC across processes. A handle names the allocation (its base), whatever address
 * inside it was given, as the real one does. Exporting moves the allocation's pages into a
 * shared-memory object (same address, same contents) that the peer maps. Only allocations of
 * 1 MiB and more (the mmapped ones) can be exported. Handles that are not the simulator's are
 * rejected with CUDA_ERROR_INVALID_VALUE, and a handle already open in the process with
 * CUDA_ERROR_ALREADY_MAPPED (strict: callers must open each allocation once). */
#define IPC_MAGIC 0x6d69736164756325ull /* "%cudasim" */
struct ipc_handle { uint64_t magic; int64_t pid; uint64_t base, size; uint8_t pad[32]; };

static int share(struct block *b) {
    if (b->shared) return 0;
    char name[64];
    ipc_name(name, sizeof name, getpid(), b->base);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return -1;
    void *tmp = MAP_FAILED;
    if (ftruncate(fd, (off_t)b->size) == 0)
        tmp = mmap(NULL, b->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (tmp == MAP_FAILED) { close(fd); shm_unlink(name); return -1; }
    memcpy(tmp, (void *)(uintptr_t)b->base, b->size);
    munmap(tmp, b->size);
    void *v = mmap((void *)(uintptr_t)b->base, b->size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    close(fd);
    if (v == MAP_FAILED) { shm_unlink(name); return -1; }
    b->shared = 1;
    return 0;
}

EXPORT CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr p) {
    COUNT();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct block *b = find_containing(p);
    CUresult rc = b && b->kind == KIND_DEVICE && b->mmapped && share(b) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    struct ipc_handle h = { IPC_MAGIC, getpid(), b ? b->base : 0, b ? b->size : 0, {0} };
    pthread_mutex_unlock(&mu);
    if (rc == CUDA_SUCCESS) memcpy(handle, &h, sizeof h);
    return rc;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *out, cudaIpcMemHandle_t handle, unsigned flags) {
    COUNT();
    (void)flags;
    struct ipc_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (!out || h.magic != IPC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
    char name[64];
    ipc_name(name, sizeof name, (long)h.pid, h.base);
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nblocks; i++)
        if (blocks[i].kind == KIND_IPC && blocks[i].origin_pid == h.pid && blocks[i].origin_base == h.base) {
            pthread_mutex_unlock(&mu);
            return CUDA_ERROR_ALREADY_MAPPED;
        }
    pthread_mutex_unlock(&mu);
    int fd = shm_open(name, O_RDWR, 0);
    /* A well-formed handle of memory the exporter has freed: CUDA_ERROR_NOT_PERMITTED, as
     * measured (docs/cuda-facts.md, IPC). */
    if (fd < 0) return CUDA_ERROR_NOT_PERMITTED;
    void *v = mmap(NULL, h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (v == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&mu);
    if (nblocks == cap_blocks) {
        cap_blocks = cap_blocks ? cap_blocks * 2 : 256;
        blocks = realloc(blocks, cap_blocks * sizeof *blocks);
    }
    blocks[nblocks++] = (struct block){ (uint64_t)(uintptr_t)v, h.size, KIND_IPC, current_device, 1, 0, 0,
                                        h.pid, h.base };
    pthread_mutex_unlock(&mu);
    *out = (CUdeviceptr)(uintptr_t)v;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    COUNT();
    pthread_mutex_lock(&mu);
    struct block *b = find_exact(p);
    if (!b || b->kind != KIND_IPC) { pthread_mutex_unlock(&mu); return CUDA_ERROR_INVALID_VALUE; }
    struct block copy = *b;
    *b = blocks[--nblocks];
    pthread_mutex_unlock(&mu);
    munmap((void *)(uintptr_t)copy.base, copy.size);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { memcpy((void *)(uintptr_t)dst, src, n); return CUDA_SUCCESS; }
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (void *)(uintptr_t)src, n); return CUDA_SUCCESS; }
/* A range no live allocation holds (freed, or freed by a device reset) is refused, as CUDA
 * refuses it, instead of writing host memory that is no longer the device's. */
static int live_range(CUdeviceptr p, size_t n) {
    pthread_mutex_lock(&mu);
    struct block *b = find_containing(p);
    int ok = b && b->kind != KIND_HOST && p + n <= b->base + b->size;
    for (size_t i = 0; i < naccess && !ok; i++)
        ok = access_ranges[i].base <= p && p + n <= access_ranges[i].base + access_ranges[i].size;
    pthread_mutex_unlock(&mu);
    return ok;
}
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
    if (n && !live_range(p, n)) return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)p, v, n);
    return CUDA_SUCCESS;
}

/* ---- virtual memory management ---- */
#define GRANULARITY (2u << 20)

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    COUNT(); (void)flags;
    configure();
    if (!h || !prop || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    delay();
    pthread_mutex_lock(&mu);
    if (used_bytes + size > limit_bytes) { pthread_mutex_unlock(&mu); return CUDA_ERROR_OUT_OF_MEMORY; }
    used_bytes += size;
    pthread_mutex_unlock(&mu);
    int fd = memfd_create("gpushim-sim-phys", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) close(fd);
        pthread_mutex_lock(&mu); used_bytes -= size; pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct phys *ph = malloc(sizeof *ph);
    *ph = (struct phys){ fd, size, prop->location.id };
    *h = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    COUNT();
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    struct phys *ph = (struct phys *)(uintptr_t)h;
    pthread_mutex_lock(&mu); used_bytes -= ph->size; pthread_mutex_unlock(&mu);
    close(ph->fd); /* existing mappings keep the memory alive, as in CUDA */
    free(ph);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
    COUNT(); (void)align; (void)addr; (void)flags;
    if (!p || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    void *v = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (v == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)v;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    COUNT();
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    return munmap((void *)(uintptr_t)p, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    COUNT(); (void)flags;
    if (!p || !h || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    struct phys *ph = (struct phys *)(uintptr_t)h;
    if (offset + size > ph->size) return CUDA_ERROR_INVALID_VALUE;
    void *v = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, (off_t)offset);
    return v == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    COUNT();
    if (!p || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    void *v = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (v == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
    forget_access(p, size, -1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) {
    COUNT();
    if (!p || !desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
    if (mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (naccess < MAX_ACCESS) access_ranges[naccess++] = (struct access_range){ p, size, desc->location.id };
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}

/* ---- entry points ---- */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags);

struct entry { const char *name; int since; void *legacy; void *per_thread; };

#define PTDS 2u
static const struct entry entries[] = {
    /* For each name, newest ABI first. */
    { "cuMemAlloc", 3020, (void *)cuMemAlloc_v2, NULL },
    { "cuMemAlloc", 2000, (void *)cuMemAlloc, NULL },
    { "cuMemFree", 3020, (void *)cuMemFree_v2, NULL },
    { "cuMemAllocPitch", 3020, (void *)cuMemAllocPitch_v2, NULL },
    { "cuMemGetInfo", 3020, (void *)cuMemGetInfo_v2, NULL },
    { "cuMemAllocManaged", 6000, (void *)cuMemAllocManaged, NULL },
    { "cuMemHostAlloc", 2020, (void *)cuMemHostAlloc, NULL },
    { "cuMemFreeHost", 2000, (void *)cuMemFreeHost, NULL },
    { "cuMemAllocAsync", 11020, (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz },
    { "cuMemFreeAsync", 11020, (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz },
    { "cuMemAllocFromPoolAsync", 11020, (void *)cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync_ptsz },
    { "cuMemCreate", 10020, (void *)cuMemCreate, NULL },
    { "cuMemRelease", 10020, (void *)cuMemRelease, NULL },
    { "cuMemMap", 10020, (void *)cuMemMap, NULL },
    { "cuMemUnmap", 10020, (void *)cuMemUnmap, NULL },
    { "cuMemAddressReserve", 10020, (void *)cuMemAddressReserve, NULL },
    { "cuMemAddressFree", 10020, (void *)cuMemAddressFree, NULL },
    { "cuMemSetAccess", 10020, (void *)cuMemSetAccess, NULL },
    { "cuMemGetAllocationGranularity", 10020, (void *)cuMemGetAllocationGranularity, NULL },
    { "cuGetProcAddress", 12000, (void *)cuGetProcAddress_v2, NULL },
    { "cuGetProcAddress", 11030, (void *)cuGetProcAddress, NULL },
    { "cuInit", 2000, (void *)cuInit, NULL },
    { "cuDriverGetVersion", 2020, (void *)cuDriverGetVersion, NULL },
    { "cuDeviceGet", 2000, (void *)cuDeviceGet, NULL },
    { "cuDeviceGetCount", 2000, (void *)cuDeviceGetCount, NULL },
    { "cuDevicePrimaryCtxRetain", 7000, (void *)cuDevicePrimaryCtxRetain, NULL },
    { "cuDevicePrimaryCtxReset", 11000, (void *)cuDevicePrimaryCtxReset_v2, NULL },
    { "cuDevicePrimaryCtxGetState", 7000, (void *)cuDevicePrimaryCtxGetState, NULL },
    { "cuDevicePrimaryCtxRelease", 11000, (void *)cuDevicePrimaryCtxRelease_v2, NULL },
    { "cuDeviceGetDefaultMemPool", 11020, (void *)cuDeviceGetDefaultMemPool, NULL },
    { "cuCtxSetCurrent", 4000, (void *)cuCtxSetCurrent, NULL },
    { "cuCtxGetDevice", 2000, (void *)cuCtxGetDevice, NULL },
    { "cuCtxSynchronize", 2000, (void *)cuCtxSynchronize, NULL },
    { "cuStreamCreate", 2000, (void *)cuStreamCreate, NULL },
    { "cuStreamCreateWithPriority", 5050, (void *)cuStreamCreateWithPriority, NULL },
    { "cuStreamIsCapturing", 10000, (void *)cuStreamIsCapturing, NULL },
    { "cuStreamQuery", 2000, (void *)cuStreamQuery, NULL },
    { "cuStreamBeginCapture", 10010, (void *)cuStreamBeginCapture_v2, NULL },
    { "cuStreamBeginCapture", 10000, (void *)cuStreamBeginCapture, NULL },
    { "cuStreamEndCapture", 10000, (void *)cuStreamEndCapture, NULL },
    { "cuStreamGetCaptureInfo", 12030, (void *)cuStreamGetCaptureInfo_v3, NULL },
    { "cuThreadExchangeStreamCaptureMode", 10010, (void *)cuThreadExchangeStreamCaptureMode, NULL },
    { "cuStreamWaitEvent", 3020, (void *)cuStreamWaitEvent, NULL },
    { "cuCtxGetCurrent", 4000, (void *)cuCtxGetCurrent, NULL },
    { "cuCtxPushCurrent", 4000, (void *)cuCtxPushCurrent_v2, NULL },
    { "cuCtxPopCurrent", 4000, (void *)cuCtxPopCurrent_v2, NULL },
    { "cuEventCreate", 2000, (void *)cuEventCreate, NULL },
    { "cuEventRecord", 2000, (void *)cuEventRecord, NULL },
    { "cuCtxRecordEvent", 12050, (void *)cuCtxRecordEvent, NULL },
    { "cuEventQuery", 2000, (void *)cuEventQuery, NULL },
    { "cuEventSynchronize", 2000, (void *)cuEventSynchronize, NULL },
    { "cuEventDestroy", 4000, (void *)cuEventDestroy_v2, NULL },
    { "cuMemGetAddressRange", 3020, (void *)cuMemGetAddressRange_v2, NULL },
    { "cuPointerGetAttribute", 4000, (void *)cuPointerGetAttribute, NULL },
    { "cuPointerGetAttributes", 7000, (void *)cuPointerGetAttributes, NULL },
    { "cuIpcGetMemHandle", 4010, (void *)cuIpcGetMemHandle, NULL },
    { "cuIpcOpenMemHandle", 11000, (void *)cuIpcOpenMemHandle_v2, NULL },
    { "cuIpcCloseMemHandle", 4010, (void *)cuIpcCloseMemHandle, NULL },
    { "cuStreamDestroy", 4000, (void *)cuStreamDestroy_v2, NULL },
    { "cuStreamSynchronize", 2000, (void *)cuStreamSynchronize, NULL },
    { "cuMemcpyHtoD", 3020, (void *)cuMemcpyHtoD_v2, NULL },
    { "cuMemcpyDtoH", 3020, (void *)cuMemcpyDtoH_v2, NULL },
    { "cuMemsetD8", 3020, (void *)cuMemsetD8_v2, NULL },
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    COUNT();
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const struct entry *e = &entries[i];
        if (strcmp(e->name, symbol) != 0) continue;
        known = 1;
        if (version < e->since) continue;
        *pfn = (flags & PTDS) && e->per_thread ? e->per_thread : e->legacy;
        if (status) *status = 0;
        return CUDA_SUCCESS;
    }
    if (status) *status = known ? 2 : 1;
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

EXPORT void *simRealAddress(const char *name) {
    static const struct { const char *name; void *fn; } own[] = {
        { "cuMemAlloc_v2", (void *)cuMemAlloc_v2 },
        { "cuMemAlloc", (void *)cuMemAlloc },
        { "cuMemFree_v2", (void *)cuMemFree_v2 },
        { "cuMemCreate", (void *)cuMemCreate },
        { "cuMemMap", (void *)cuMemMap },
        { "cuMemAllocAsync", (void *)cuMemAllocAsync },
        { "cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz },
        { "cuDriverGetVersion", (void *)cuDriverGetVersion },
        { "cuGetProcAddress_v2", (void *)cuGetProcAddress_v2 },
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strcmp(own[i].name, name) == 0) return own[i].fn;
    return NULL;
}
