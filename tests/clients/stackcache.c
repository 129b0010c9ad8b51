/* Two functions of the same shape allocate from the same stack depth, alternating: each call's
 * recorded stack must name its own function (a stack recognized from an earlier capture must
 * really be the same stack). Sizes tell the calls apart: 4096 from from_f, 8192 from from_g. */
#include "cuda_sim.h"
#include <stdio.h>

__attribute__((noinline)) static int from_f(int i) {
    void *p = NULL;
    int rc = cudaMalloc(&p, 4096);
    __asm__ volatile("" ::: "memory");
    return rc | cudaFree(p) | (i & 0);
}

__attribute__((noinline)) static int from_g(int i) {
    void *p = NULL;
    int rc = cudaMalloc(&p, 8192);
    __asm__ volatile("" ::: "memory");
    return rc | cudaFree(p) | (i & 0);
}

int main(void) {
    int bad = 0;
    for (int i = 0; i < 600; i++) {
        bad |= (i % 3 == 0) ? from_g(i) : from_f(i);
    }
    printf("done %d\n", bad);
    return bad != 0;
}
