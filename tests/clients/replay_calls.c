/* Replays a recorded run's cudaMalloc/cudaFree calls, in their order and sizes, through whatever
 * answers them (the shim's pool, or CUDA itself), and prints the nanoseconds per
 * allocation-and-free pair of the last of three passes (the first two warm the pool). With
 * THRASH_KB > 0, that many KiB of other memory are touched between two calls of the last pass
 * (one byte per 64), as a program's own work evicts the allocator's data between two
 * allocations; the time of the touching is left out.
 * The ops file has one line per call: "a SLOT SIZE" or "f SLOT" (scripts/bench.sh replay
 * writes it from `gpushim events`). With STREAM=1 a non-blocking stream is created first, so
 * that the pool fences blocks freed with cudaFree (PyTorch leaves the legacy stream so).
 * usage: replay_calls OPS_FILE THRASH_KB STREAM */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int cudaError_t;
typedef void *cudaStream_t;
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaDeviceSynchronize(void);

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: replay_calls OPS_FILE THRASH_KB STREAM\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    size_t thrash_len = (size_t)strtoul(argv[2], NULL, 0) << 10;
    int stream = atoi(argv[3]);
    size_t cap = 1024, n = 0, slots = 0;
    char *kind = malloc(cap);
    unsigned *slot = malloc(cap * sizeof *slot);
    size_t *size = malloc(cap * sizeof *size);
    char k;
    unsigned s;
    while (fscanf(f, " %c %u", &k, &s) == 2) {
        size_t bytes = 0;
        if (k == 'a' && fscanf(f, "%zu", &bytes) != 1) return 2;
        if (n == cap) {
            cap *= 2;
            kind = realloc(kind, cap);
            slot = realloc(slot, cap * sizeof *slot);
            size = realloc(size, cap * sizeof *size);
        }
        kind[n] = k;
        slot[n] = s;
        size[n] = bytes;
        if (s + 1 > slots) slots = s + 1;
        n++;
    }
    fclose(f);
    void **live = calloc(slots ? slots : 1, sizeof *live);
    volatile unsigned char *thrash = thrash_len ? calloc(thrash_len, 1) : NULL;
    if (stream) {
        cudaStream_t st;
        if (cudaStreamCreateWithFlags(&st, 1)) return 1;
    }
    double ns = 0;
    for (int pass = 0; pass < 3; pass++) {
        uint64_t spent = 0, pairs = 0;
        for (size_t i = 0; i < n; i++) {
            if (pass == 2)
                for (size_t j = 0; j < thrash_len; j += 64) thrash[j]++;
            uint64_t t0 = now_ns();
            if (kind[i] == 'a') {
                if (cudaMalloc(&live[slot[i]], size[i])) {
                    fprintf(stderr, "call %zu: cudaMalloc(%zu) failed\n", i, size[i]);
                    return 1;
                }
                pairs++;
            } else if (live[slot[i]]) {
                cudaFree(live[slot[i]]);
                live[slot[i]] = NULL;
            }
            spent += now_ns() - t0;
        }
        for (size_t j = 0; j < slots; j++) {
            if (live[j]) cudaFree(live[j]);
            live[j] = NULL;
        }
        cudaDeviceSynchronize();
        ns = pairs ? (double)spent / (double)pairs : 0;
    }
    printf("%.0f\n", ns);
    return 0;
}
