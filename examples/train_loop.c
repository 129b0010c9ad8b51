/* A toy training loop for the main job: per step it allocates activations whose size follows a
 * changing sequence length, uses a stream-ordered scratch buffer, frees the activations, and
 * leaks 1 MiB into a "history" list: the memory that grows every iteration, which gpushim's
 * reports are there to find. Uses only the CUDA runtime API, so it runs on a real GPU and on
 * the simulator alike. Usage: train_loop [STEPS] */
#include "cuda_sim.h"

#include <stdio.h>
#include <stdlib.h>

#define CHECK(x) do { int rc_ = (x); if (rc_) { fprintf(stderr, "%s: error %d\n", #x, rc_); return 1; } } while (0)

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    if (steps < 1 || steps > 100000) { fprintf(stderr, "usage: train_loop [STEPS 1..100000]\n"); return 2; }
    void **history = calloc((size_t)steps, sizeof *history);
    cudaStream_t s = NULL;
    void *weights = NULL, *act[6], *scratch = NULL;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMalloc(&weights, 64 << 20));
    for (int step = 0; step < steps; step++) {
        size_t seq = 256 + (size_t)((step * 37) % 8) * 128;
        for (int i = 0; i < 6; i++) CHECK(cudaMalloc(&act[i], seq * 4096 * (size_t)(i + 1)));
        CHECK(cudaMallocAsync(&scratch, seq * 1024, s));
        CHECK(cudaFreeAsync(scratch, s));
        CHECK(cudaMalloc(&history[step], 1 << 20)); /* the leak */
        for (int i = 5; i >= 0; i--) CHECK(cudaFree(act[i]));
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaFree(weights));
    printf("trained %d steps; %d MiB of history still held\n", steps, steps);
    free(history);
    return 0;
}
