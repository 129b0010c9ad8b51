/* Median cost of cudaMalloc+cudaFree (1 MiB) and cudaMallocAsync+cudaFreeAsync (1 MiB, warm
 * pool), in microseconds, over N pairs. Run with and without the shim to see its cost. */
#include "cuda_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    double *t = malloc(sizeof(double) * (size_t)n);
    void *p = NULL;
    cudaStream_t s = NULL;
    cudaStreamCreate(&s);
    cudaFree(NULL);
    for (int i = 0; i < n; i++) {
        double a = now_us();
        if (cudaMalloc(&p, 1 << 20) || cudaFree(p)) { fprintf(stderr, "cudaMalloc/cudaFree failed\n"); return 1; }
        t[i] = now_us() - a;
    }
    qsort(t, (size_t)n, sizeof *t, cmp);
    printf("malloc_free_us %.3f\n", t[n / 2]);
    for (int i = 0; i < 100; i++) { cudaMallocAsync(&p, 1 << 20, s); cudaFreeAsync(p, s); }
    cudaStreamSynchronize(s);
    for (int i = 0; i < n; i++) {
        double a = now_us();
        if (cudaMallocAsync(&p, 1 << 20, s) || cudaFreeAsync(p, s)) { fprintf(stderr, "async failed\n"); return 1; }
        t[i] = now_us() - a;
    }
    cudaStreamSynchronize(s);
    qsort(t, (size_t)n, sizeof *t, cmp);
    printf("malloc_free_async_us %.3f\n", t[n / 2]);
    return 0;
}
