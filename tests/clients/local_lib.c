/* A plugin that links libcudart and is loaded RTLD_LOCAL, as Python extension modules are. */
#include "cuda_sim.h"

int local_roundtrip(void) {
    void *p = NULL;
    int r = cudaMalloc(&p, 4096);
    if (r) return r;
    return cudaFree(p);
}
