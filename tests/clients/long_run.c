/* A long training-like loop for the tests of a trace of any length: each step allocates 48
 * activations of 256 KiB from one line (churn) and frees them, and keeps one 4 KiB allocation
 * (leak) that is never freed; three quarters of the way through, one step also takes a 512 MiB
 * spike (spike) and frees it; at the end, a 1 TiB request fails (huge).
 * Usage: long_run STEPS */
#include "cuda_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) void *churn(void) {
    void *p = NULL;
    cudaMalloc(&p, 256 * 1024);
    return p;
}

__attribute__((noinline)) void *leak(void) {
    void *p = NULL;
    cudaMalloc(&p, 4096);
    return p;
}

__attribute__((noinline)) void spike(void) {
    void *p = NULL;
    cudaMalloc(&p, 512u << 20);
    cudaFree(p);
}

__attribute__((noinline)) int huge(void) {
    void *p = NULL;
    return (int)cudaMalloc(&p, 1ull << 40);
}

int main(int argc, char **argv) {
    long steps = argc > 1 ? atol(argv[1]) : 1000;
    long every = argc > 2 ? atol(argv[2]) : 1;
    int progress = argc > 3 && strcmp(argv[3], "progress") == 0;
    if (steps < 4 || every < 1) return 2;
    void *a[48];
    for (long s = 0; s < steps; s++) {
        for (int i = 0; i < 48; i++) a[i] = churn();
        if (s % every == 0) (void)leak();
        if (s == steps * 3 / 4) spike();
        for (int i = 47; i >= 0; i--) cudaFree(a[i]);
        if (progress && s % 100 == 0) {
            printf("step %ld\n", s);
            fflush(stdout);
        }
    }
    printf("huge %d\n", huge());
    return 0;
}
