/* Part of the simulated libcuda.so.1 (cuda_sim.c includes it, so the simulator stays one
 * translation unit and its statics file-local): the GPU-work model: streams and events in time. */
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
