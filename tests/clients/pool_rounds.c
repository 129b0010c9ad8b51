/* Host cost of the pool: N rounds of free-then-allocate over 64 live blocks of a training-like
 * size mix (four in five up to 256 KiB, one in five 1 to 9 MiB), no GPU work. `sync` uses
 * cudaMalloc/cudaFree (a framework without a cache), `async` cudaMallocAsync/cudaFreeAsync on
 * the legacy stream (the pluggable allocator's path). Prints nanoseconds per round (one free
 * and one allocation) of the second pass over the same sizes.
 * usage: pool_rounds sync|async N */
#include "cuda_sim.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    int async = argc > 1 && strcmp(argv[1], "async") == 0;
    int n = argc > 2 ? atoi(argv[2]) : 200000;
    enum { W = 64 };
    void *live[W] = {0};
    double ns = 0;
    for (int pass = 0; pass < 2; pass++) {
        uint64_t x = 12345;
        double t0 = now_ns();
        for (int i = 0; i < n; i++) {
            int k = i % W;
            if (live[k]) {
                if (async ? cudaFreeAsync(live[k], 0) : cudaFree(live[k])) return 1;
            }
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t size = x % 5 == 0 ? (1u << 20) + x % (8u << 20) : 512 + x % (256u << 10);
            if (async ? cudaMallocAsync(&live[k], size, 0) : cudaMalloc(&live[k], size)) return 1;
        }
        ns = (now_ns() - t0) / n;
    }
    printf("%.0f\n", ns);
    return 0;
}
