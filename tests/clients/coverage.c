/* Calls every CUDA memory function gpushim hooks, once each where it can, by direct dynamic
 * linking, and prints the name of each hooked call as it makes it, one per line. The test
 * compares that list with the trace: one record per call, same API, same order. */
#include "cuda_sim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

#define CALL(name, expr)                                                       \
    do {                                                                       \
        int rc_ = (int)(expr);                                                 \
        printf("%s\n", name);                                                  \
        if (rc_ != 0) { fprintf(stderr, "%s failed: %d\n", name, rc_); failures++; } \
    } while (0)

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *a = NULL, *b = NULL, *h = NULL;
    cudaStream_t s = NULL;
    cudaMemPool_t pool = NULL;
    size_t pitch = 0, fr = 0, to = 0;

    /* Runtime API. */
    CALL("cudaMalloc", cudaMalloc(&a, 1024));
    CALL("cudaFree", cudaFree(a));
    if (cudaStreamCreate(&s) != 0) { fprintf(stderr, "no stream\n"); return 2; }
    CALL("cudaMallocAsync", cudaMallocAsync(&a, 4096, s));
    CALL("cudaFreeAsync", cudaFreeAsync(a, s));
    CALL("cudaMallocAsync_ptsz", cudaMallocAsync_ptsz(&a, 4096, s));
    CALL("cudaFreeAsync_ptsz", cudaFreeAsync_ptsz(a, s));
    if (cudaDeviceGetDefaultMemPool(&pool, 0) != 0) { fprintf(stderr, "no pool\n"); return 2; }
    CALL("cudaMallocFromPoolAsync", cudaMallocFromPoolAsync(&a, 8192, pool, s));
    CALL("cudaMallocFromPoolAsync_ptsz", cudaMallocFromPoolAsync_ptsz(&b, 8192, pool, s));
    CALL("cudaFreeAsync", cudaFreeAsync(a, s));
    CALL("cudaFreeAsync", cudaFreeAsync(b, s));
    cudaStreamSynchronize(s);
    CALL("cudaMallocManaged", cudaMallocManaged(&a, 1 << 16, 1));
    CALL("cudaFree", cudaFree(a));
    CALL("cudaMallocHost", cudaMallocHost(&h, 1 << 16));
    CALL("cudaFreeHost", cudaFreeHost(h));
    CALL("cudaHostAlloc", cudaHostAlloc(&h, 1 << 16, 0));
    CALL("cudaFreeHost", cudaFreeHost(h));
    CALL("cudaMallocPitch", cudaMallocPitch(&a, &pitch, 1000, 10));
    CALL("cudaFree", cudaFree(a));
    struct cudaPitchedPtr pp;
    struct cudaExtent ext = { 1000, 10, 3 };
    CALL("cudaMalloc3D", cudaMalloc3D(&pp, ext));
    CALL("cudaFree", cudaFree(pp.ptr));
    CALL("cudaMemGetInfo", cudaMemGetInfo(&fr, &to));

    /* Driver API (the runtime above made the context current). */
    CUdeviceptr d = 0, e = 0;
    CUstream cs = NULL;
    CUmemoryPool cpool = NULL;
    cuStreamCreate(&cs, 0);
    cuDeviceGetDefaultMemPool(&cpool, 0);
    CALL("cuMemAlloc_v2", cuMemAlloc_v2(&d, 1 << 20));
    CALL("cuMemFree_v2", cuMemFree_v2(d));
    CALL("cuMemAllocAsync", cuMemAllocAsync(&d, 1 << 12, cs));
    CALL("cuMemFreeAsync", cuMemFreeAsync(d, cs));
    CALL("cuMemAllocAsync_ptsz", cuMemAllocAsync_ptsz(&d, 1 << 12, cs));
    CALL("cuMemFreeAsync_ptsz", cuMemFreeAsync_ptsz(d, cs));
    CALL("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync(&d, 1 << 12, cpool, cs));
    CALL("cuMemAllocFromPoolAsync_ptsz", cuMemAllocFromPoolAsync_ptsz(&e, 1 << 12, cpool, cs));
    CALL("cuMemFreeAsync", cuMemFreeAsync(d, cs));
    CALL("cuMemFreeAsync", cuMemFreeAsync(e, cs));
    CALL("cuMemAllocPitch_v2", cuMemAllocPitch_v2(&d, &pitch, 1000, 10, 16));
    CALL("cuMemFree_v2", cuMemFree_v2(d));
    CALL("cuMemAllocManaged", cuMemAllocManaged(&d, 1 << 16, 1));
    CALL("cuMemFree_v2", cuMemFree_v2(d));
    CALL("cuMemHostAlloc", cuMemHostAlloc(&h, 1 << 16, 0));
    CALL("cuMemFreeHost", cuMemFreeHost(h));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = 1;
    prop.location.id = 0;
    size_t gran = 0;
    cuMemGetAllocationGranularity(&gran, &prop, 0);
    if (gran == 0) gran = 2 << 20;
    CUmemGenericAllocationHandle ph = 0;
    CUdeviceptr va = 0;
    CUmemAccessDesc acc = { { 1, 0 }, 3 };
    CALL("cuMemCreate", cuMemCreate(&ph, gran, &prop, 0));
    CALL("cuMemAddressReserve", cuMemAddressReserve(&va, gran, 0, 0, 0));
    CALL("cuMemMap", cuMemMap(va, gran, 0, ph, 0));
    CALL("cuMemSetAccess", cuMemSetAccess(va, gran, &acc, 1));
    char msg[16] = "through the map";
    char back[16] = { 0 };
    cuMemcpyHtoD_v2(va, msg, sizeof msg);
    cuMemcpyDtoH_v2(back, va, sizeof back);
    if (memcmp(msg, back, sizeof msg) != 0) { fprintf(stderr, "VMM round trip failed\n"); failures++; }
    CALL("cuMemUnmap", cuMemUnmap(va, gran));
    CALL("cuMemAddressFree", cuMemAddressFree(va, gran));
    CALL("cuMemRelease", cuMemRelease(ph));
    CALL("cuMemGetInfo_v2", cuMemGetInfo_v2(&fr, &to));
    return failures ? 1 : 0;
}
