/* The return codes of docs/cuda-facts.md as scenarios. Prints one line per scenario, with codes and
 * booleans only (never addresses), so the output with and without the shim, and on the
 * simulator and on a real GPU, can be compared line by line. */
#include "cuda_sim.h"

#include <stdint.h>
#include <stdio.h>

int main(void) {
    void *p = (void *)0x1, *q = NULL;
    int local = 0;
    cudaStream_t s = NULL;
    cudaError_t r, e1, e2;

    r = cudaMalloc(&p, 0);
    printf("cudaMalloc(&p, 0): %d null=%d\n", r, p == NULL);
    r = cudaMalloc(NULL, 16);
    e1 = cudaGetLastError();
    printf("cudaMalloc(NULL, 16): %d last=%d\n", r, e1);
    p = (void *)0x1;
    r = cudaMalloc(&p, (size_t)1 << 50);
    e1 = cudaGetLastError();
    e2 = cudaGetLastError();
    printf("cudaMalloc(&p, 1 PiB): %d null=%d last=%d then=%d\n", r, p == NULL, e1, e2);
    r = cudaFree(NULL);
    printf("cudaFree(NULL): %d\n", r);
    cudaMalloc(&p, 1024);
    r = cudaFree((char *)p + 16);
    e1 = cudaGetLastError();
    printf("cudaFree(interior): %d last=%d\n", r, e1);
    r = cudaFree(p);
    e1 = cudaFree(p);
    cudaGetLastError();
    printf("cudaFree twice: %d %d\n", r, e1);
    r = cudaFree((void *)0x1234);
    cudaGetLastError();
    e1 = cudaFree(&local);
    cudaGetLastError();
    printf("cudaFree(garbage), cudaFree(host): %d %d\n", r, e1);
    cudaMalloc(&p, 1000);
    cudaMalloc(&q, 1);
    printf("cudaMalloc alignment: %d %d\n", ((uintptr_t)p % 256) == 0, ((uintptr_t)q % 256) == 0);
    cudaFree(p);
    cudaFree(q);

    CUdeviceptr d = 7;
    CUresult c = cuMemAlloc_v2(&d, 0);
    printf("cuMemAlloc(&d, 0): %d zero=%d\n", c, d == 0);
    printf("cuMemFree(0): %d\n", cuMemFree_v2(0));
    printf("cuMemFree(garbage): %d\n", cuMemFree_v2(0x1234));

    cudaStreamCreate(&s);
    p = (void *)0x1;
    r = cudaMallocAsync(&p, 0, s);
    printf("cudaMallocAsync(&p, 0, s): %d null=%d\n", r, p == NULL);
    printf("cudaFreeAsync(NULL, s): %d\n", cudaFreeAsync(NULL, s));
    cudaMallocAsync(&p, 4096, s);
    cudaStreamSynchronize(s);
    printf("cudaFree(async pointer): %d\n", cudaFree(p));
    cudaMalloc(&p, 4096);
    printf("cudaFreeAsync(cudaMalloc pointer): %d\n", cudaFreeAsync(p, s));
    cudaStreamSynchronize(s);
    printf("cudaGetLastError at end: %d\n", cudaGetLastError());
    return 0;
}
