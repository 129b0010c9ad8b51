/* Reaches driver memory functions only through the entry-point lookups, as PyTorch (expandable
 * segments) and the real libcudart do. Prints "call NAME" for each hooked call it makes and
 * "check NAME 0|1" for the pass-through checks. */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*alloc_async_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_t)(CUdeviceptr, CUstream);
typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
typedef CUresult (*release_t)(CUmemGenericAllocationHandle);
typedef CUresult (*reserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*addr_free_t)(CUdeviceptr, size_t);
typedef CUresult (*map_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_t)(CUdeviceptr, size_t);
typedef CUresult (*access_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);

static int failures;

static void *rt_lookup(const char *name) {
    void *fn = NULL;
    int status = -1;
    int r = cudaGetDriverEntryPointByVersion(name, &fn, 12000, 0, &status);
    if (r != 0 || status != 0 || !fn) { fprintf(stderr, "runtime lookup %s: %d/%d\n", name, r, status); failures++; }
    return fn;
}

static void *drv_lookup(const char *name, int version, uint64_t flags) {
    void *fn = NULL;
    int status = -1;
    int r = cuGetProcAddress_v2(name, &fn, version, flags, &status);
    if (r != 0 || !fn) { fprintf(stderr, "driver lookup %s: %d/%d\n", name, r, status); failures++; }
    return fn;
}

#define CALL(name, expr) do { int rc_ = (int)(expr); printf("call %s\n", name); \
    if (rc_) { fprintf(stderr, "%s: %d\n", name, rc_); failures++; } } while (0)

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *p = NULL;
    cudaMalloc(&p, 0); /* initialize the runtime and a context, records nothing that matters */
    printf("call cudaMalloc\n");

    /* Through cudaGetDriverEntryPointByVersion. */
    CUdeviceptr d = 0;
    alloc_t alloc = (alloc_t)rt_lookup("cuMemAlloc");
    free_t dfree = (free_t)rt_lookup("cuMemFree");
    if (alloc && dfree) {
        CALL("cuMemAlloc_v2", alloc(&d, 4096));
        CALL("cuMemFree_v2", dfree(d));
    }
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.location.type = 1;
    create_t create = (create_t)rt_lookup("cuMemCreate");
    reserve_t reserve = (reserve_t)rt_lookup("cuMemAddressReserve");
    map_t map = (map_t)rt_lookup("cuMemMap");
    access_t access = (access_t)rt_lookup("cuMemSetAccess");
    unmap_t unmap = (unmap_t)rt_lookup("cuMemUnmap");
    addr_free_t afree = (addr_free_t)rt_lookup("cuMemAddressFree");
    release_t release = (release_t)rt_lookup("cuMemRelease");
    if (create && reserve && map && access && unmap && afree && release) {
        size_t g = 2 << 20;
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr va = 0;
        CUmemAccessDesc desc = { { 1, 0 }, 3 };
        CALL("cuMemCreate", create(&h, g, &prop, 0));
        CALL("cuMemAddressReserve", reserve(&va, g, 0, 0, 0));
        CALL("cuMemMap", map(va, g, 0, h, 0));
        CALL("cuMemSetAccess", access(va, g, &desc, 1));
        CALL("cuMemUnmap", unmap(va, g));
        CALL("cuMemAddressFree", afree(va, g));
        CALL("cuMemRelease", release(h));
    }

    /* Through cuGetProcAddress_v2, legacy and per-thread default stream. */
    alloc = (alloc_t)drv_lookup("cuMemAlloc", 12000, 0);
    dfree = (free_t)drv_lookup("cuMemFree", 12000, 0);
    if (alloc && dfree) {
        CALL("cuMemAlloc_v2", alloc(&d, 8192));
        CALL("cuMemFree_v2", dfree(d));
    }
    CUstream s = NULL;
    cuStreamCreate(&s, 0);
    alloc_async_t aa = (alloc_async_t)drv_lookup("cuMemAllocAsync", 12000, 2);
    free_async_t fa = (free_async_t)drv_lookup("cuMemFreeAsync", 12000, 2);
    if (aa && fa) {
        CALL("cuMemAllocAsync_ptsz", aa(&d, 4096, s));
        CALL("cuMemFreeAsync_ptsz", fa(d, s));
    }

    /* Pass-through: an unknown (unhooked) name, an older ABI, a newer version than we know. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *real_version = h ? dlsym(h, "cuDriverGetVersion") : NULL;
    void *got = drv_lookup("cuDriverGetVersion", 12000, 0);
    printf("check unknown_name_untouched %d\n", got != NULL && got == real_version);
    void *real_v1 = h ? dlsym(h, "cuMemAlloc") : NULL;
    void *v1 = NULL;
    int st = 0;
    cuGetProcAddress_v2("cuMemAlloc", &v1, 3000, 0, &st);
    printf("check old_abi_untouched %d\n", v1 != NULL && v1 == real_v1);
    void *(*sim_real)(const char *) = h ? (void *(*)(const char *))dlsym(h, "simRealAddress") : NULL;
    if (sim_real) {
        void *future = NULL;
        cuGetProcAddress_v2("cuMemAlloc", &future, 14000, 0, &st);
        printf("check future_version_untouched %d\n", future == sim_real("cuMemAlloc_v2"));
        void *current = NULL;
        cuGetProcAddress_v2("cuMemAlloc", &current, 12000, 0, &st);
        printf("check current_version_wrapped %d\n", current != NULL && current != sim_real("cuMemAlloc_v2"));
    }
    return failures ? 1 : 0;
}
