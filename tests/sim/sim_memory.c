/* Part of the simulated libcuda.so.1 (cuda_sim.c includes it, so the simulator stays one
 * translation unit and its statics file-local): memory: allocation, free, pointer queries, IPC. */
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
    CUresult rc = alloc_block(p, size, KIND_DEVICE);
    if (rc == CUDA_SUCCESS && return_ms && size >= (32u << 20)) {
        struct timespec ts = { return_ms / 1000, (long)(return_ms % 1000) * 1000000L };
        nanosleep(&ts, NULL);
    }
    return rc;
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
/* On a capturing stream the allocation becomes a graph memory node: the graph owns the block.
 * `created`: the created pool it comes from (slot + 1), 0 for the device's default pool. */
static CUresult alloc_from(CUdeviceptr *p, size_t size, CUstream s, int created) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    *p = 0;
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = alloc_block(p, size, KIND_DEVICE);
    if (rc == CUDA_SUCCESS) {
        int graph = stream_capturing(s);
        pthread_mutex_lock(&mu);
        struct block *b = find_exact(*p);
        if (b) {
            b->graph = graph;
            b->pooled = 1;
            b->created = graph ? 0 : created;
            if (b->created) created_pools[created - 1].used += b->size;
            else *(graph ? &graph_used : &pool_used) += b->size;
        }
        pthread_mutex_unlock(&mu);
    }
    return rc;
}
static CUresult alloc_async(CUdeviceptr *p, size_t size, CUstream s) { return alloc_from(p, size, s, 0); }
static CUresult alloc_pool(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int created = created_slot(pool);
    pthread_mutex_unlock(&mu);
    if (created < 0) return CUDA_ERROR_INVALID_VALUE;
    return alloc_from(p, size, s, created);
}
/* Graphs built node by node: cuGraphCreate, and a memory node added directly (not captured)
 * allocates at once, as graph memory the graph owns (CUDA_MEM_ALLOC_NODE_PARAMS: the pool
 * properties' location id at byte 12, bytesize at 104, dptr written at 112); a free node of a
 * graph's allocation leaves the memory the graph's. */
static char sim_built_graph;
EXPORT CUresult cuGraphCreate(void **graph, unsigned int flags) {
    COUNT(); (void)flags;
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    *graph = &sim_built_graph;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddMemAllocNode(void **node, void *graph, const void *deps, size_t ndeps, void *params) {
    COUNT(); (void)deps; (void)ndeps;
    if (!node || !graph || !params) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *p = params;
    size_t size;
    memcpy(&size, p + 104, sizeof size);
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    CUdeviceptr d = 0;
    CUresult rc = alloc_block(&d, size, KIND_DEVICE);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&mu);
    struct block *b = find_exact(d);
    if (b) {
        b->graph = 1;
        b->pooled = 1;
        graph_used += b->size;
    }
    pthread_mutex_unlock(&mu);
    memcpy(p + 112, &d, sizeof d);
    *node = graph;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGraphAddMemFreeNode(void **node, void *graph, const void *deps, size_t ndeps, CUdeviceptr dptr) {
    COUNT(); (void)deps; (void)ndeps;
    if (!node || !graph) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    struct block *b = find_exact(dptr);
    CUresult rc = b && b->graph ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&mu);
    if (rc == CUDA_SUCCESS) *node = graph;
    return rc;
}
/* cuMemPoolCreate: a pool on the device its properties name (CUmemPoolProps: allocation type
 * at 0, handle types at 4, location type at 8 (1: a device), location id at 12). */
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const void *props) {
    COUNT();
    if (!pool || !props) return CUDA_ERROR_INVALID_VALUE;
    const int *p = props;
    if (p[2] != 1 || p[3] < 0 || p[3] >= ndevices) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < CREATED_POOLS; i++)
        if (!created_pools[i].live && created_pools[i].used == 0) {
            created_pools[i] = (struct created_pool){ .live = 1, .device = p[3], .used = 0 };
            *pool = &created_pools[i];
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&mu);
    return rc;
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    COUNT();
    pthread_mutex_lock(&mu);
    int created = created_slot(pool);
    if (created > 0) created_pools[created - 1].live = 0;
    pthread_mutex_unlock(&mu);
    return created > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
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
    return alloc_pool(p, size, pool, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
    COUNT();
    return alloc_pool(p, size, pool, ordered_stream(s, 1));
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
    /* The pools' chunks count whole. */
    size_t u = used_bytes + (chunks_of(pool_used) - pool_used) + (chunks_of(graph_used) - graph_used);
    for (int i = 0; i < CREATED_POOLS; i++) u += chunks_of(created_pools[i].used) - created_pools[i].used;
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
