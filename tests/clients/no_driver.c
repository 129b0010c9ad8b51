/* Against the real libcudart with no driver present: every runtime call returns 35
 * (cudaErrorInsufficientDriver) and leaves its out-pointer untouched. */
#include "cuda_sim.h"

#include <stdio.h>

int main(void) {
    void *p = (void *)0x5a5a;
    int r = cudaMalloc(&p, 16);
    printf("cudaMalloc %d untouched=%d\n", r, p == (void *)0x5a5a);
    r = cudaMallocHost(&p, 16);
    printf("cudaMallocHost %d untouched=%d\n", r, p == (void *)0x5a5a);
    size_t f = 7, t = 7;
    r = cudaMemGetInfo(&f, &t);
    printf("cudaMemGetInfo %d untouched=%d\n", r, f == 7 && t == 7);
    printf("cudaFree %d\n", cudaFree((void *)0x1000));
    return 0;
}
