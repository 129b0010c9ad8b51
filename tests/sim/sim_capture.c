/* Part of the simulated libcuda.so.1 (cuda_sim.c includes it, so the simulator stays one
 * translation unit and its statics file-local): stream capture: what is legal during a capture, graphs. */
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
/* What the default pool reserves (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, 5) and what its
 * allocations use (CU_MEMPOOL_ATTR_USED_MEM_CURRENT, 7); other attributes are not modelled. */
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    int created = created_slot(pool);
    int known = pool == (CUmemoryPool)&default_pool || created > 0;
    uint64_t used = created > 0 ? created_pools[created - 1].used : pool_used;
    pthread_mutex_unlock(&mu);
    if (!known) return CUDA_ERROR_INVALID_VALUE;
    if (attr == 5) *(uint64_t *)value = chunks_of(used);
    else if (attr == 7) *(uint64_t *)value = used;
    else return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
/* Graph memory: CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT (0) and RESERVED_MEM_CURRENT (2). As on the
 * GPU, a chunk counts as used whole once an allocation lives in it. */
EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *value) {
    (void)d;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    uint64_t used = graph_used;
    pthread_mutex_unlock(&mu);
    if (attr == 2 || attr == 0) *(uint64_t *)value = chunks_of(used);
    else return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
