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
#define CUDA_SIM_IMPLEMENTATION
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
struct block { uint64_t base, size; int kind; int device; int mmapped; uint64_t free_at; int shared; int64_t origin_pid; uint64_t origin_base; int graph; int pooled; int created; };
struct phys { int fd; size_t size; int device; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct block *blocks;
static size_t nblocks, cap_blocks;
static uint64_t used_bytes;
/* Stream-ordered memory (docs/cuda-facts.md, "Memory CUDA's own pools hold"): the device's
 * default pool and graph memory hand out allocations from memory they reserve in whole chunks
 * of POOL_CHUNK, so a small allocation holds a chunk. What each pool's allocations use; what it
 * reserves is that rounded up to chunks, and the device's used memory (NVML's) counts it. */
#define POOL_CHUNK (32ull << 20)
static uint64_t pool_used, graph_used;
static uint64_t chunks_of(uint64_t used) { return (used + POOL_CHUNK - 1) / POOL_CHUNK * POOL_CHUNK; }
/* Pools the program creates (cuMemPoolCreate): each reserves in chunks as the default pool does.
 * A pool destroyed with allocations outstanding keeps its memory until they are freed (as CUDA
 * does), though its handle answers no more. Slot i's handle is &created_pools[i]. */
#define CREATED_POOLS 16
static struct created_pool { int live; int device; uint64_t used; } created_pools[CREATED_POOLS];
/* The created pool a handle names (its slot + 1), -1 for one destroyed, 0 for none. */
static int created_slot(CUmemoryPool pool) {
    struct created_pool *c = pool;
    if (c < created_pools || c >= created_pools + CREATED_POOLS) return 0;
    return c->live ? (int)(c - created_pools) + 1 : -1;
}
static uint64_t limit_bytes;
static unsigned latency_us;
/* GPUSHIM_SIM_RETURN_MS: a device allocation of 32 MiB or more returns this long after its
 * memory is counted (NVML already sees it), as a real cuMemAlloc can return late to a thread
 * the scheduler set aside: the caller records it only after that. */
static unsigned return_ms;
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

/* Set by CUDA's own exit handler: from then on the driver answers CUDA_ERROR_DEINITIALIZED (4)
 * to memory calls, as the real one does to calls made at exit after its teardown (seen on the
 * GPU: PyTorch's allocator freeing its blocks from a static destructor). The real driver
 * registers its handler when it starts, so a program's exit handlers registered before that run
 * after it. */
static atomic_int shut_down;
static void shut_down_at_exit(void) { atomic_store(&shut_down, 1); }

static void configure_locked(void) {
    if (configured) return;
    configured = 1;
    pthread_atfork(NULL, NULL, in_child);
    atexit(shut_down_at_exit);
    const char *m = getenv("GPUSHIM_SIM_MEMORY");
    limit_bytes = m ? strtoull(m, NULL, 0) : (16ull << 30);
    const char *l = getenv("GPUSHIM_SIM_LATENCY_US");
    latency_us = l ? (unsigned)strtoul(l, NULL, 0) : 0;
    const char *r = getenv("GPUSHIM_SIM_RETURN_MS");
    return_ms = r ? (unsigned)strtoul(r, NULL, 0) : 0;
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
    if (atomic_load(&shut_down)) return 4; /* CUDA_ERROR_DEINITIALIZED */
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
    if (atomic_load(&shut_down)) return 4; /* CUDA_ERROR_DEINITIALIZED */
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
    if (copy.created) created_pools[copy.created - 1].used -= copy.size;
    else if (copy.pooled) *(copy.graph ? &graph_used : &pool_used) -= copy.size;
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
/* A device's make-up: an H100's by default (132 multiprocessors of 2048 threads each, as
 * torch.cuda.get_device_properties said on the GPU machine), GPUSHIM_SIM_MULTIPROCESSORS for
 * another count. Other attributes are not simulated. */
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR 39
/* The device's memory as CUDA counts it: the simulator's limit (what cuMemGetInfo calls the
 * total). NVML's total is larger, as on a real device (see nvml_sim.c). */
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    configure();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = limit_bytes;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice d) {
    configure();
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (d < 0 || d >= ndevices) return CUDA_ERROR_INVALID_DEVICE;
    if (attribute == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) {
        const char *m = getenv("GPUSHIM_SIM_MULTIPROCESSORS");
        *value = m ? atoi(m) : 132;
        return CUDA_SUCCESS;
    }
    if (attribute == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) {
        *value = 2048;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
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

/* The simulator's parts, in the order each relies on the ones before. */
#include "sim_work.c"
#include "sim_capture.c"
#include "sim_memory.c"
#include "sim_vmm.c"
#include "sim_entry.c"
