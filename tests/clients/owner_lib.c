/* A library that keeps device memory of its own, built as libnccl.so.2 so reports name it as
 * NCCL: 8 MiB through the runtime and 4 MiB through the driver, kept until exit; and, asked
 * separately, 2 MiB stream-ordered (cudaMallocAsync). */
#include "cuda_sim.h"

int owner_lib_allocate(void) {
    void *p = NULL;
    CUdeviceptr d = 0;
    int r = cudaMalloc(&p, 8 << 20);
    return r ? r : cuMemAlloc_v2(&d, 4 << 20);
}

int owner_lib_allocate_async(void) {
    void *p = NULL;
    return cudaMallocAsync(&p, 2 << 20, 0);
}
