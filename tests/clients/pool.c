/* Exercises the pool through the CUDA API, one scenario per run; prints key=value lines.
 *   pool reuse N        safe reuse while simulated kernels still use freed memory
 *   pool oom            out-of-memory retry and failure, with the runtime's last error
 *   pool limit          cudaMemGetInfo / cuMemGetInfo_v2 under limit:, and the limit itself
 *   pool query          pointer queries and IPC export of pooled blocks
 *   pool count N        N cudaMalloc/cudaFree pairs (device allocations counted by the sim)
 *   pool latesplits N K N pairs, then K more in an exit handler that runs after the shim's
 *   pool pluggable      PyTorch's pluggable-allocator entry points
 * Needs the simulator (simLaunch, simInUse, simCallCount). */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MiB (1024ull * 1024ull)

static int reuse(int n) {
    cudaStream_t s1, s2, blocking;
    if (cudaStreamCreateWithFlags(&s1, 1) || cudaStreamCreateWithFlags(&s2, 1) || cudaStreamCreateWithFlags(&blocking, 0))
        return 1;
    long violations = 0, same_stream = 0, sync_reuse = 0;
    for (int i = 0; i < n; i++) {
        size_t sz = (i % 3 == 0) ? 3 * MiB + 512 * (size_t)i : 4096 + 256 * (size_t)(i % 7);
        /* Synchronous free while a kernel on a non-blocking stream still reads the buffer. */
        void *a = NULL, *b = NULL, *c = NULL;
        if (cudaMalloc(&a, sz)) return 2;
        simLaunch(i % 2 ? s1 : blocking, (CUdeviceptr)(uintptr_t)a, sz, 200);
        if (cudaFree(a)) return 3;
        if (cudaMalloc(&b, sz)) return 4;
        if (simInUse((CUdeviceptr)(uintptr_t)b, sz)) violations++;
        if (b == a) sync_reuse++;
        simLaunch(NULL, (CUdeviceptr)(uintptr_t)b, sz, 100); /* legacy stream */
        if (cudaFree(b)) return 5;
        /* Stream-ordered free on s1; another stream must wait, s1 itself need not. */
        if (cudaMallocAsync(&a, sz, s1)) return 6;
        simLaunch(s1, (CUdeviceptr)(uintptr_t)a, sz, 200);
        if (cudaFreeAsync(a, s1)) return 7;
        if (cudaMallocAsync(&b, sz, s2)) return 8;
        if (simInUse((CUdeviceptr)(uintptr_t)b, sz)) violations++;
        if (cudaMallocAsync(&c, sz, s1)) return 9;
        if (c == a) same_stream++;
        if (cudaFreeAsync(b, s2) || cudaFreeAsync(c, s1)) return 10;
    }
    cudaDeviceSynchronize();
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    cudaStreamDestroy(blocking);
    printf("violations=%ld\nsame_stream_reuse=%ld\nsync_reuse=%ld\ndevice_allocs=%ld\n", violations, same_stream,
           sync_reuse, simCallCount("cuMemAlloc_v2"));
    return 0;
}

static int oom(void) {
    void *a = NULL, *b = NULL, *c = NULL;
    int rc = cudaMalloc(&a, 30 * MiB);
    printf("first=%d\n", rc);
    cudaFree(a);
    /* 30 MiB idle in the cache and 50 MiB more do not fit in 64 MiB: the pool must give the
     * cache back and retry. */
    rc = cudaMalloc(&b, 50 * MiB);
    printf("retry=%d\n", rc);
    c = (void *)1;
    rc = cudaMalloc(&c, 50 * MiB);
    int last = cudaGetLastError(), then = cudaGetLastError();
    printf("oom=%d null=%d last=%d then=%d\n", rc, c == NULL, last, then);
    CUdeviceptr d = 7;
    rc = cuMemAlloc_v2(&d, 50 * MiB);
    printf("driver_oom=%d zero=%d\n", rc, d == 0);
    cudaFree(b);
    return 0;
}

static int limit(void) {
    size_t f0, t0, f1, t1, f2, t2, f3, t3;
    cudaMemGetInfo(&f0, &t0);
    void *a = NULL, *b = NULL, *c = NULL;
    cudaMalloc(&a, 60 * MiB);
    cudaMemGetInfo(&f1, &t1);
    cudaFree(a);
    cudaMemGetInfo(&f2, &t2);
    cuMemGetInfo_v2(&f3, &t3);
    int rb = cudaMalloc(&b, 60 * MiB);
    int rc = cudaMalloc(&c, 60 * MiB);
    int last = cudaGetLastError();
    printf("start_free_mib=%zu start_total_mib=%zu\n", (size_t)(f0 / MiB), (size_t)(t0 / MiB));
    printf("live60_free_mib=%zu\n", (size_t)(f1 / MiB));
    printf("freed_free_mib=%zu driver_free_mib=%zu driver_total_mib=%zu\n", (size_t)(f2 / MiB), (size_t)(f3 / MiB), (size_t)(t3 / MiB));
    printf("second60=%d third60=%d last=%d null=%d\n", rb, rc, last, c == NULL);
    return 0;
}

static int query(void) {
    void *a = NULL, *b = NULL, *big = NULL;
    cudaMalloc(&a, 1000);
    cudaMalloc(&b, 3000);
    cudaMalloc(&big, 8 * MiB);
    CUdeviceptr base = 0;
    size_t size = 0;
    int rc = cuMemGetAddressRange_v2(&base, &size, (CUdeviceptr)(uintptr_t)b + 100);
    printf("range=%d base_is_block=%d size=%zu\n", rc, base == (CUdeviceptr)(uintptr_t)b, size);
    CUdeviceptr start = 0;
    rc = cuPointerGetAttribute(&start, 11 /* RANGE_START_ADDR */, (CUdeviceptr)(uintptr_t)b + 10);
    printf("attr=%d start_is_block=%d\n", rc, start == (CUdeviceptr)(uintptr_t)b);
    unsigned char h[64];
    int sub = cuIpcGetMemHandle(h, (CUdeviceptr)(uintptr_t)b);
    int whole = cuIpcGetMemHandle(h, (CUdeviceptr)(uintptr_t)big);
    printf("ipc_sub_block=%d ipc_segment_start=%d\n", sub, whole);
    cudaFree(a);
    cudaFree(b);
    cudaFree(big);
    return 0;
}

static int count(int n) {
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, 1 << 20) || cudaFree(p)) return 1;
    }
    printf("device_allocs=%ld\n", simCallCount("cuMemAlloc_v2"));
    return 0;
}

/* Allocations after the shim's exit handler: this program's handler is registered before its
 * first CUDA call, so it runs after the shim's (registered at the pool's first use). */
static int late_rounds;
static void late(void) {
    for (int i = 0; i < late_rounds; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, 1 << 20) == 0) cudaFree(p);
    }
}

static int latesplits(int n, int k) {
    late_rounds = k;
    atexit(late);
    return count(n);
}

static int pluggable(void) {
    void *(*alloc)(long, int, void *) = (void *(*)(long, int, void *))dlsym(RTLD_DEFAULT, "gpushim_alloc");
    void (*release)(void *, long, int, void *) = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "gpushim_free");
    if (!alloc || !release) { printf("no_entry_points\n"); return 1; }
    cudaSetDevice(0);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, 1);
    void *p = alloc(1000, 0, s);
    release(p, 1000, 0, s);
    void *q = alloc(1000, 0, s);
    printf("alloc_ok=%d reused_on_stream=%d\n", p != NULL, p == q);
    release(q, 1000, 0, s);
    printf("device_allocs=%ld\n", simCallCount("cuMemAlloc_v2"));
    return 0;
}

/* PyTorch with the pluggable allocator: its caching allocator's library is loaded but replaced,
 * so each tensor comes and goes through gpushim_alloc/gpushim_free. A segment left empty must
 * stay cached past the trimmer's ticks (300 ms here) rather than go back to the device at the
 * next one. Prints the device's frees. */
static int plugidle(void) {
    void *(*alloc)(long, int, void *) = (void *(*)(long, int, void *))dlsym(RTLD_DEFAULT, "gpushim_alloc");
    void (*release)(void *, long, int, void *) = (void (*)(void *, long, int, void *))dlsym(RTLD_DEFAULT, "gpushim_free");
    if (!alloc || !release) { printf("no_entry_points\n"); return 1; }
    cudaSetDevice(0);
    void *p = alloc(4 << 20, 0, NULL);
    void *q = alloc(1000, 0, NULL);
    release(p, 4 << 20, 0, NULL);
    release(q, 1000, 0, NULL);
    struct timespec t = {0, 350 * 1000 * 1000};
    nanosleep(&t, NULL);
    printf("alloc_ok=%d device_frees=%ld\n", p && q, simCallCount("cuMemFree_v2"));
    return 0;
}

/* Stream-ordered calls on a stream being captured must reach CUDA (they become graph nodes). */
static int capture(void) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, 1);
    void *p = NULL, *q = NULL;
    cudaMallocAsync(&p, 4096, s);
    cudaFreeAsync(p, s);
    long before = simCallCount("cuMemAllocAsync");
    cuStreamBeginCapture_v2(s, 0);
    int rc = cudaMallocAsync(&q, 4096, s);
    long during = simCallCount("cuMemAllocAsync") - before;
    cudaFreeAsync(q, s);
    void *graph = NULL;
    cuStreamEndCapture(s, &graph);
    cudaMallocAsync(&p, 4096, s);
    long after = simCallCount("cuMemAllocAsync") - before - during;
    printf("capture_rc=%d reached_cuda_during=%ld reached_cuda_after=%ld\n", rc, during, after);
    return 0;
}

/* All work on the legacy stream: a block freed with cudaFree while its kernel still runs comes
 * back at once (the next owner's work is ordered after it on that one stream). Then a stream is
 * created while a legacy kernel still uses a freed block: from then on, no block is handed to
 * the new stream while that kernel runs. */
static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000LL + t.tv_nsec / 1000000;
}

static int legacy(void) {
    const size_t sz = 8 * MiB;
    void *a = NULL, *b = NULL, *c = NULL;
    cudaMalloc(&a, sz);
    simLaunch(NULL, (CUdeviceptr)(uintptr_t)a, sz, 100000); /* 100 ms over all of a */
    cudaFree(a);
    long long t0 = now_ms();
    cudaMalloc(&b, 2 * MiB); /* cut from a's block; the other 6 MiB stay cached */
    long long waited = now_ms() - t0;
    int reused = a == b;
    /* A second stream appears while the legacy kernel still uses a's memory. */
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, 1);
    cudaMallocAsync(&c, 6 * MiB, s);
    int in_use = simInUse((CUdeviceptr)(uintptr_t)c, 6 * MiB);
    printf("reused_legacy=%d waited_ms=%lld in_use_on_new_stream=%d\n", reused, waited, in_use);
    cudaFreeAsync(c, s);
    cudaFree(b);
    cudaDeviceSynchronize();
    return 0;
}

/* Many streams (as PyTorch makes its pool of them) while the GPU lags: every allocation finds
 * its best block fenced. Prints how many events the pool recorded for its checkpoints, per
 * stream and for the whole context, and how many streams it queried. */
static int seals(int n) {
    for (int i = 0; i < 64; i++) {
        cudaStream_t s;
        if (cudaStreamCreateWithFlags(&s, 1)) return 1;
    }
    void *busy = NULL;
    cudaMalloc(&busy, MiB);
    simLaunch(NULL, (CUdeviceptr)(uintptr_t)busy, MiB, 300000); /* 300 ms on the legacy stream */
    long before = simCallCount("cuEventRecord");
    long queries = simCallCount("cuStreamQuery"), whole = simCallCount("cuCtxRecordEvent");
    for (int i = 0; i < n; i++) {
        void *p = NULL;
        if (cudaMalloc(&p, MiB) || cudaFree(p)) return 1;
    }
    printf("event_records=%ld\n", simCallCount("cuEventRecord") - before);
    printf("stream_queries=%ld\n", simCallCount("cuStreamQuery") - queries);
    printf("context_events=%ld\n", simCallCount("cuCtxRecordEvent") - whole);
    cudaFree(busy);
    return 0;
}

/* A device synchronization with no fence pending, then a block freed while a kernel on another
 * stream still uses it: the next allocation must not get it while the kernel runs (the
 * synchronization passed only what was freed before it). Prints in_use=1 if it did. */
static int syncreuse(void) {
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, 1)) return 1;
    cudaDeviceSynchronize();
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, 4 * MiB)) return 1;
    simLaunch(s, (CUdeviceptr)(uintptr_t)a, 4 * MiB, 200000); /* 200 ms on s */
    cudaFree(a);
    if (cudaMalloc(&b, 4 * MiB)) return 1;
    printf("same=%d in_use=%d\n", a == b, simInUse((CUdeviceptr)(uintptr_t)b, 4 * MiB));
    cudaFree(b);
    cudaDeviceSynchronize();
    return 0;
}

/* Sizes near 2^64 with a block in the cache that a wrapped size would fit: CUDA answers out of
 * memory (2) and leaves the pointer null. */
static int huge(void) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, 1);
    void *p = NULL;
    cudaMalloc(&p, 8 << 20);
    cudaFree(p);
    cudaMallocAsync(&p, 8 << 20, s);
    cudaFreeAsync(p, s);
    const size_t sizes[] = {(size_t)-1, (size_t)-1 - 511, ((size_t)1 << 63) + 1};
    int bad = 0;
    for (int i = 0; i < 3; i++) {
        void *q = (void *)1;
        CUdeviceptr d = 1;
        int a = cudaMalloc(&q, sizes[i]);
        bad += a != 2 || q != NULL;
        int b = cuMemAlloc_v2(&d, sizes[i]);
        bad += b != 2 || d != 0;
        q = (void *)1;
        int c = cudaMallocAsync(&q, sizes[i], s);
        bad += c != 2 || q != NULL;
        printf("size=%zx malloc=%d driver=%d async=%d\n", sizes[i], a, b, c);
    }
    printf("wrong=%d\n", bad);
    return 0;
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "";
    int n = argc > 2 ? atoi(argv[2]) : 100;
    if (!strcmp(what, "reuse")) return reuse(n);
    if (!strcmp(what, "oom")) return oom();
    if (!strcmp(what, "limit")) return limit();
    if (!strcmp(what, "query")) return query();
    if (!strcmp(what, "count")) return count(n);
    if (!strcmp(what, "latesplits")) return latesplits(n, argc > 3 ? atoi(argv[3]) : 3);
    if (!strcmp(what, "pluggable")) return pluggable();
    if (!strcmp(what, "capture")) return capture();
    if (!strcmp(what, "huge")) return huge();
    if (!strcmp(what, "legacy")) return legacy();
    if (!strcmp(what, "seals")) return seals(n);
    if (!strcmp(what, "plugidle")) return plugidle();
    if (!strcmp(what, "syncreuse")) return syncreuse();
    fprintf(stderr, "usage: pool reuse|oom|limit|query|count|pluggable [N]\n");
    return 2;
}
