/* A training loop with no caching allocator of its own, as PyTorch runs with
 * PYTORCH_NO_CUDA_MEMORY_CACHING=1: every step allocates its tensors with cudaMalloc, runs its
 * "kernels" on the legacy stream (simulated GPU time), frees the tensors with cudaFree, and
 * synchronizes once at the end of the step. The host's work (the simulator's latency per call)
 * overlaps the GPU's unless something makes the host wait.
 *
 * usage: perstep STEPS TENSORS GPU_US_PER_STEP [STREAMS]
 * STREAMS non-blocking streams are created first and never used (PyTorch creates its pool of
 * streams this way), which ends the pool's single-stream rule.
 * Prints: steps=.. wall_us=.. gpu_us=.. live_peak=.. used_peak=.. (device bytes in use, as
 * NVML would see them, from the simulator) event_records=.. (cuEventRecord calls)
 * blocked_us=.. (time the host spent waiting for the simulated GPU, its own one
 * synchronization per step left out: what a pool that waits for nothing keeps near 0) */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static long long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000LL + t.tv_nsec / 1000;
}

/* Shapes that change a little every step, as with varying sequence lengths. */
#define SIZE(s, i) (((size_t)((i) % 4) + 1) * ((1u << 20) + (size_t)(((s) * 37 + (i)) % 7) * 65536))

/* The host's own work (Python, kernel launches): busy for `us` microseconds. */
static void host_work(unsigned us) {
    long long end = now_us() + us;
    while (now_us() < end) {}
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 40;
    int n = argc > 2 ? atoi(argv[2]) : 16;
    unsigned gpu_us = argc > 3 ? (unsigned)atoi(argv[3]) : 4000;
    int streams = argc > 4 ? atoi(argv[4]) : 0;
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    size_t (*used)(void) = drv ? (size_t (*)(void))dlsym(drv, "simUsedBytes") : NULL;
    uint64_t (*blocked)(void) = drv ? (uint64_t (*)(void))dlsym(drv, "simBlockedNs") : NULL;
    if (!used || !blocked) { fprintf(stderr, "perstep needs the simulator\n"); return 2; }
    void **t = calloc((size_t)n, sizeof *t);
    size_t live = 0, live_peak = 0, used_peak = 0, base = 0;
    cudaFree(0);
    for (int i = 0; i < streams; i++) {
        cudaStream_t st;
        if (cudaStreamCreateWithFlags(&st, 1)) { fprintf(stderr, "no stream\n"); return 1; }
    }
    base = used();
    uint64_t own_sync = 0, blocked0 = blocked();
    long long t0 = now_us();
    void **g = calloc((size_t)n, sizeof *g);
    unsigned op_us = gpu_us / (2u * (unsigned)n);
    for (int s = 0; s < steps; s++) {
        /* Forward: each layer's activation, then its kernel. The host's own work per op takes
         * half as long as the GPU's: it runs ahead, and the two overlap unless it waits. */
        for (int i = 0; i < n; i++) {
            size_t size = SIZE(s, i);
            if (cudaMalloc(&t[i], size)) { fprintf(stderr, "cudaMalloc failed\n"); return 1; }
            live += size;
            simLaunch(NULL, (CUdeviceptr)(uintptr_t)t[i], size, op_us);
            host_work(op_us / 2);
        }
        if (live > live_peak) live_peak = live;
        /* Backward: each activation is freed and a gradient of its size takes its place while
         * earlier kernels still run (a pool that waits for them stalls the host here). */
        for (int i = n - 1; i >= 0; i--) {
            size_t size = SIZE(s, i);
            cudaFree(t[i]);
            if (cudaMalloc(&g[i], size)) { fprintf(stderr, "cudaMalloc failed\n"); return 1; }
            simLaunch(NULL, (CUdeviceptr)(uintptr_t)g[i], size, op_us);
            host_work(op_us / 2);
        }
        for (int i = 0; i < n; i++) {
            cudaFree(g[i]);
            live -= SIZE(s, i);
        }
        size_t u = used() - base;
        if (u > used_peak) used_peak = u;
        uint64_t b0 = blocked();
        cudaDeviceSynchronize(); /* loss.item() */
        own_sync += blocked() - b0;
    }
    long long wall = now_us() - t0;
    long (*calls)(const char *) = (long (*)(const char *))dlsym(drv, "simCallCount");
    printf("steps=%d wall_us=%lld gpu_us=%lld live_peak=%zu used_peak=%zu event_records=%ld "
           "blocked_us=%llu\n",
           steps, wall, (long long)steps * gpu_us, live_peak, used_peak,
           calls ? calls("cuEventRecord") : -1L,
           (unsigned long long)((blocked() - blocked0 - own_sync) / 1000));
    free(t);
    free(g);
    return 0;
}
