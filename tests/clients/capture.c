/* Stream-capture conformance: each scenario begins a capture on a non-blocking stream in one
 * mode, makes one call (from the capturing thread or from another one), ends the capture and
 * prints
 *     scenario mode thread: rc=R end=E last=L
 * R the call's result, E cudaStreamEndCapture's, L cudaGetLastError's right after. The same
 * program runs on the simulator (tests/capture.rs) and on the real GPU
 * (scripts/gpu.sh capture), with and without the shim, and every run must print the same
 * lines: docs/cuda-facts.md, "During a stream capture".
 *
 * usage: capture            all scenarios
 *        capture oom        a 1 PiB cudaMalloc inside a global capture with the thread switched
 *                           to relaxed (what PyTorch's test_graph_capture_oom does)
 *        capture graph      what PyTorch's graph capture does to an allocator: blocks freed with
 *                           cudaFree just before (still fenced in a pool), then a global capture
 *                           whose thread allocates and frees in relaxed mode, then empty-cache
 *                           style frees during the capture; the capture must end with a graph
 *        capture race       one thread begins and ends thread-local captures on one stream
 *                           while another allocates and frees with cudaFree (a second stream
 *                           exists, so freed blocks are fenced and the pool makes
 *                           checkpoints): prints how many captures CUDA invalidated, which a
 *                           pool recording its checkpoint events into a capture that had just
 *                           begun would do
 *        capture giveback   (simulator only) 8 x 64 MiB allocated and freed with cudaFree: the
 *                           device's used bytes right after and 2 s later
 *        capture graphmem   a stream-ordered allocation and free captured on a created stream
 *                           (capture begun through the CUDA 10.0 entry point), on
 *                           cudaStreamPerThread, and on stream 0 of the per-thread (_ptsz)
 *                           entry points: each becomes a graph memory node, so the next
 *                           allocation outside the capture gets another address
 *        capture nocontext  a thread with no current context calls cuMemAlloc while another
 *                           thread captures in global mode: 201, the capture untouched
 *        capture reset      a block allocated and freed, cudaDeviceReset, then an allocation of
 *                           the same size: it must be memory of the device (cudaMemset works)
 *        capture overflow N N captures under way at once, all ended, then 2 s: the memory a
 *                           program freed before them must go back (simulator only)
 *        capture release N  one thread frees 32 MiB and empties the allocator's cache while
 *                           another begins and ends a global capture, N rounds: how many
 *                           captures were invalidated, and what stays allocated after */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { GLOBAL = 0, THREAD_LOCAL = 1, RELAXED = 2 };
static const char *mode_name[] = {"global", "thread_local", "relaxed"};

static cudaStream_t s;     /* the capturing stream */
static cudaStream_t other; /* another non-blocking stream */
static void *before_ptr;   /* allocated before the capture */
static void *before_event; /* recorded before the capture */
static int scenario;
static int result;

static int call(int id) {
    void *p = NULL, *ev = NULL;
    size_t f = 0, t = 0;
    int r;
    switch (id) {
    case 0: /* cudaMalloc, freed again outside the capture when it worked */
        r = cudaMalloc(&p, 1 << 20);
        if (r == 0) before_ptr = p;
        return r;
    case 1: /* cudaFree of memory allocated before the capture */
        r = cudaFree(before_ptr);
        if (r == 0) before_ptr = NULL;
        return r;
    case 2: return cudaFree(NULL);
    case 3: return cudaMallocHost(&p, 4096);
    case 4: /* stream-ordered pair on the capturing stream: graph memory nodes */
        r = cudaMallocAsync(&p, 1 << 20, s);
        if (r == 0) r = cudaFreeAsync(p, s);
        return r;
    case 5: /* an event on the legacy stream */
        cudaEventCreate(&ev);
        return cudaEventRecord(ev, NULL);
    case 6: /* an event on another stream, then its query (until it is no longer "not ready",
             * 600, which depends on timing) */
        cudaEventCreate(&ev);
        r = cudaEventRecord(ev, other);
        if (r) return r;
        while ((r = cudaEventQuery(ev)) == 600) {}
        return r;
    case 7: return cudaEventQuery(before_event);
    case 8: return cudaEventSynchronize(before_event);
    case 9: return cudaDeviceSynchronize();
    case 10: return cudaMemGetInfo(&f, &t);
    case 11: { /* stream create and destroy */
        cudaStream_t x;
        r = cudaStreamCreateWithFlags(&x, 1);
        return r ? r : cudaStreamDestroy(x);
    }
    case 12: /* an event recorded on the capturing stream, then queried */
        cudaEventCreate(&ev);
        r = cudaEventRecord(ev, s);
        return r ? r : cudaEventQuery(ev);
    case 13: return cudaStreamWaitEvent(s, before_event, 0);
    }
    return -1;
}

static const char *names[] = {
    "cudaMalloc", "cudaFree", "cudaFree(NULL)", "cudaMallocHost", "cudaMallocAsync+FreeAsync(capturing)",
    "cudaEventRecord(legacy)", "cudaEventRecord(other)+Query", "cudaEventQuery(earlier)",
    "cudaEventSynchronize(earlier)", "cudaDeviceSynchronize", "cudaMemGetInfo", "cudaStreamCreate+Destroy",
    "cudaEventRecord(capturing)+Query", "cudaStreamWaitEvent(capturing,earlier)",
};
#define SCENARIOS ((int)(sizeof names / sizeof names[0]))

static void *on_other_thread(void *arg) {
    (void)arg;
    cudaSetDevice(0);
    result = call(scenario);
    return NULL;
}

static void setup(void) {
    if (!before_ptr) cudaMalloc(&before_ptr, 1 << 20);
    if (!before_event) {
        cudaEventCreate(&before_event);
        cudaEventRecord(before_event, other);
    }
}

static int oom(void) {
    void *p = NULL, *q = NULL, *g = NULL;
    cudaStreamBeginCapture(s, GLOBAL);
    int m = RELAXED;
    cudaThreadExchangeStreamCaptureMode(&m);
    int r1 = cudaMalloc(&p, (size_t)1 << 50);
    int last1 = cudaGetLastError();
    int r2 = cudaMalloc(&q, 1 << 20);
    int r3 = cudaFree(q);
    cudaThreadExchangeStreamCaptureMode(&m);
    int end = cudaStreamEndCapture(s, &g);
    printf("oom: malloc=%d last=%d p_null=%d small_malloc=%d small_free=%d end=%d graph=%d\n", r1, last1,
           p == NULL, r2, r3, end, g != NULL);
    return 0;
}

static int graph(void) {
    void *p[8] = {0}, *q[8] = {0}, *g = NULL;
    for (int i = 0; i < 8; i++) cudaMalloc(&p[i], (size_t)(i + 1) << 20);
    for (int i = 0; i < 8; i++) cudaFree(p[i]);
    int bad = 0;
    cudaStreamBeginCapture(s, GLOBAL);
    int m = RELAXED;
    cudaThreadExchangeStreamCaptureMode(&m);
    for (int i = 0; i < 8; i++) bad += cudaMalloc(&q[i], (size_t)(i + 1) << 20) != 0;
    void *big = NULL;
    bad += cudaMalloc(&big, 256 << 20) != 0;
    bad += cudaFree(big) != 0;
    for (int i = 0; i < 8; i += 2) bad += cudaFree(q[i]) != 0;
    cudaThreadExchangeStreamCaptureMode(&m);
    int end = cudaStreamEndCapture(s, &g);
    int last = cudaGetLastError();
    for (int i = 1; i < 8; i += 2) bad += cudaFree(q[i]) != 0;
    printf("graph: failed_calls=%d end=%d last=%d graph=%d after_sync=%d\n", bad, end, last, g != NULL,
           cudaDeviceSynchronize());
    return 0;
}

static volatile int race_done;
static void *race_allocator(void *arg) {
    (void)arg;
    cudaSetDevice(0);
    long rounds = 0, failed = 0;
    while (!race_done) {
        void *p = NULL;
        int rc = cudaMalloc(&p, 1 << 20);
        if (rc == 0) rc = cudaFree(p);
        if (rc != 0) {
            /* Which call, with what, after how many rounds: the test prints stderr on failure. */
            if (failed++ == 0)
                fprintf(stderr, "race: %s answered %d after %ld rounds\n", p ? "cudaFree" : "cudaMalloc", rc,
                        rounds);
            continue;
        }
        rounds++;
    }
    return (void *)(failed > 0 ? (intptr_t)-1 : (intptr_t)rounds);
}

static int race(int captures) {
    pthread_t t;
    race_done = 0;
    pthread_create(&t, NULL, race_allocator, NULL);
    int invalidated = 0;
    for (int i = 0; i < captures; i++) {
        void *g = NULL;
        if (cudaStreamBeginCapture(s, THREAD_LOCAL) != 0) { invalidated++; continue; }
        int end = cudaStreamEndCapture(s, &g);
        if (end != 0 || !g) invalidated++;
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
    }
    race_done = 1;
    void *rounds = NULL;
    pthread_join(t, &rounds);
    printf("race: captures=%d invalidated=%d allocator_failed=%d\n", captures, invalidated,
           (intptr_t)rounds < 0);
    return 0;
}

static void sleep_ms(int ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static int giveback(void) {
    void *p[8];
    /* Looked up at run time so the client also links against real CUDA. */
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    size_t (*simUsedBytes)(void) = drv ? (size_t (*)(void))dlsym(drv, "simUsedBytes") : NULL;
    if (!simUsedBytes) { printf("giveback: needs the simulator\n"); return 0; }
    size_t base = simUsedBytes();
    for (int i = 0; i < 8; i++) cudaMalloc(&p[i], 64 << 20);
    size_t held = simUsedBytes() - base;
    for (int i = 0; i < 8; i++) cudaFree(p[i]);
    size_t freed = simUsedBytes() - base;
    sleep_ms(2000);
    size_t later = simUsedBytes() - base;
    printf("giveback: held_mib=%zu after_free_mib=%zu after_2s_mib=%zu\n", held >> 20, freed >> 20, later >> 20);
    return 0;
}

typedef CUresult (*begin_v1_t)(CUstream);

/* Allocates and frees on `on` while `on` is captured, ends the capture, then allocates the
 * same size outside it: the graph keeps its block, so the address must differ. */
static void graph_memory(const char *what, cudaStream_t on, int ptsz, int v1) {
    void *g = NULL, *p = NULL, *q = NULL;
    int begin;
    if (v1) {
        void *fn = NULL;
        int st = 0;
        cuGetProcAddress_v2("cuStreamBeginCapture", &fn, 10000, 0, &st);
        begin = fn ? ((begin_v1_t)fn)(on) : -1;
    } else {
        begin = cudaStreamBeginCapture(on, GLOBAL);
    }
    int a = ptsz ? cudaMallocAsync_ptsz(&p, 1 << 20, 0) : cudaMallocAsync(&p, 1 << 20, on);
    int f = ptsz ? cudaFreeAsync_ptsz(p, 0) : cudaFreeAsync(p, on);
    int end = cudaStreamEndCapture(on, &g);
    int n = cudaMallocAsync(&q, 1 << 20, on);
    printf("graphmem %s: begin=%d alloc=%d free=%d end=%d graph=%d next=%d reused=%d\n", what, begin, a, f, end,
           g != NULL, n, p != NULL && p == q);
    cudaFreeAsync(q, on);
    cudaStreamSynchronize(on);
}

static int graphmem(void) {
    graph_memory("created_stream_v1", s, 0, 1);
    graph_memory("per_thread_stream", (cudaStream_t)2, 0, 0);
    graph_memory("ptsz_stream_0", (cudaStream_t)2, 1, 0);
    return 0;
}

static int nocontext_rc;
static void *no_context_thread(void *arg) {
    (void)arg;
    CUdeviceptr d = 0;
    nocontext_rc = cuMemAlloc_v2(&d, 1 << 20);
    return NULL;
}

static int nocontext(void) {
    void *g = NULL;
    cudaStreamBeginCapture(s, GLOBAL);
    pthread_t t;
    pthread_create(&t, NULL, no_context_thread, NULL);
    pthread_join(t, NULL);
    int end = cudaStreamEndCapture(s, &g);
    printf("nocontext: alloc=%d end=%d graph=%d\n", nocontext_rc, end, g != NULL);
    return 0;
}

static int reset(void) {
    void *p = NULL, *q = NULL;
    int a = cudaMalloc(&p, 32 << 20);
    int f = cudaFree(p);
    int r = cudaDeviceReset();
    int b = cudaMalloc(&q, 32 << 20);
    int m = cudaMemset(q, 0, 32 << 20);
    int g = cudaFree(q);
    printf("reset: malloc=%d free=%d reset=%d malloc_after=%d memset=%d free_after=%d\n", a, f, r, b, m, g);
    return 0;
}

static size_t (*sim_used(void))(void) {
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return drv ? (size_t (*)(void))dlsym(drv, "simUsedBytes") : NULL;
}

static int overflow(int n) {
    size_t (*used)(void) = sim_used();
    if (!used) { printf("overflow: needs the simulator\n"); return 0; }
    size_t base = used();
    void *p = NULL;
    cudaMalloc(&p, 32 << 20);
    cudaFree(p);
    cudaStream_t *st = calloc((size_t)n, sizeof *st);
    int begun = 0, ended = 0;
    for (int i = 0; i < n; i++) {
        cudaStreamCreateWithFlags(&st[i], 1);
        begun += cudaStreamBeginCapture(st[i], RELAXED) == 0;
    }
    for (int i = 0; i < n; i++) {
        void *g = NULL;
        ended += cudaStreamEndCapture(st[i], &g) == 0;
    }
    sleep_ms(2000);
    printf("overflow: begun=%d ended=%d held_mib=%zu\n", begun, ended, (used() - base) >> 20);
    free(st);
    return 0;
}

/* One thread empties the cache while the other begins a capture: the pool's own frees must
 * never join or break it, and a free that failed must not lose the segment. */
static pthread_mutex_t rel_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t rel_cv = PTHREAD_COND_INITIALIZER;
static int rel_turn; /* 0: the freeing thread allocates; 1: the capture may begin; 2: it ended */
static int rel_rounds, rel_invalidated;

static void rel_wait(int turn) {
    pthread_mutex_lock(&rel_mu);
    while (rel_turn != turn) pthread_cond_wait(&rel_cv, &rel_mu);
    pthread_mutex_unlock(&rel_mu);
}
static void rel_set(int turn) {
    pthread_mutex_lock(&rel_mu);
    rel_turn = turn;
    pthread_cond_broadcast(&rel_cv);
    pthread_mutex_unlock(&rel_mu);
}

static void *rel_capturer(void *arg) {
    (void)arg;
    cudaSetDevice(0);
    for (int i = 0; i < rel_rounds; i++) {
        rel_wait(1);
        void *g = NULL;
        if (cudaStreamBeginCapture(s, GLOBAL) == 0) {
            /* The capture lasts as long as recording some work takes. */
            struct timespec ts = {0, 300000};
            nanosleep(&ts, NULL);
            int end = cudaStreamEndCapture(s, &g);
            if (end != 0 || !g) rel_invalidated++;
        }
        cudaGetLastError();
        rel_set(2);
    }
    return NULL;
}

static int release(int n) {
    void (*empty)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gpushim_empty_cache");
    size_t (*used)(void) = sim_used();
    size_t base = used ? used() : 0;
    rel_rounds = n;
    pthread_t t;
    pthread_create(&t, NULL, rel_capturer, NULL);
    int failed = 0;
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        failed += cudaMalloc(&p, 32 << 20) != 0;
        failed += cudaFree(p) != 0;
        rel_set(1);
        if (empty) empty();
        rel_wait(2);
    }
    pthread_join(t, NULL);
    if (empty) empty();
    printf("release: rounds=%d invalidated=%d failed_calls=%d held_mib=%ld\n", n, rel_invalidated, failed,
           used ? (long)((used() - base) >> 20) : -1L);
    return 0;
}

int main(int argc, char **argv) {
    cudaSetDevice(0);
    cudaStreamCreateWithFlags(&s, 1);
    cudaStreamCreateWithFlags(&other, 1);
    if (argc > 1 && strcmp(argv[1], "oom") == 0) return oom();
    if (argc > 1 && strcmp(argv[1], "graph") == 0) return graph();
    if (argc > 1 && strcmp(argv[1], "giveback") == 0) return giveback();
    if (argc > 1 && strcmp(argv[1], "race") == 0) return race(argc > 2 ? atoi(argv[2]) : 20000);
    if (argc > 1 && strcmp(argv[1], "graphmem") == 0) return graphmem();
    if (argc > 1 && strcmp(argv[1], "nocontext") == 0) return nocontext();
    if (argc > 1 && strcmp(argv[1], "reset") == 0) return reset();
    if (argc > 1 && strcmp(argv[1], "overflow") == 0) return overflow(argc > 2 ? atoi(argv[2]) : 65);
    if (argc > 1 && strcmp(argv[1], "release") == 0) return release(argc > 2 ? atoi(argv[2]) : 300);
    for (int id = 0; id < SCENARIOS; id++)
        for (int mode = 0; mode < 3; mode++)
            for (int th = 0; th < 2; th++) {
                setup();
                cudaGetLastError();
                scenario = id;
                if (cudaStreamBeginCapture(s, mode) != 0) {
                    printf("%s %s %s: begin failed\n", names[id], mode_name[mode], th ? "other" : "same");
                    continue;
                }
                if (th) {
                    pthread_t t;
                    pthread_create(&t, NULL, on_other_thread, NULL);
                    pthread_join(t, NULL);
                } else {
                    result = call(id);
                }
                void *g = NULL;
                int end = cudaStreamEndCapture(s, &g);
                int last = cudaGetLastError();
                if (g) cudaGraphDestroy(g);
                printf("%s %s %s: rc=%d end=%d last=%d\n", names[id], mode_name[mode], th ? "other" : "same",
                       result, end, last);
                cudaDeviceSynchronize();
                cudaGetLastError();
            }
    /* The device works normally afterwards. */
    void *p = NULL;
    int r = cudaMalloc(&p, 1 << 20);
    int f = cudaFree(p);
    printf("after: malloc=%d free=%d sync=%d\n", r, f, cudaDeviceSynchronize());
    return 0;
}
