/* Part of the simulated libcuda.so.1 (cuda_sim.c includes it, so the simulator stays one
 * translation unit and its statics file-local): virtual memory management: physical allocations, address ranges, mappings. */
/* ---- virtual memory management ---- */
#define GRANULARITY (2u << 20)

EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option) {
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = GRANULARITY;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    COUNT(); (void)flags;
    configure();
    if (!h || !prop || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    delay();
    pthread_mutex_lock(&mu);
    if (used_bytes + size > limit_bytes) { pthread_mutex_unlock(&mu); return CUDA_ERROR_OUT_OF_MEMORY; }
    used_bytes += size;
    pthread_mutex_unlock(&mu);
    int fd = memfd_create("gpushim-sim-phys", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        if (fd >= 0) close(fd);
        pthread_mutex_lock(&mu); used_bytes -= size; pthread_mutex_unlock(&mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct phys *ph = malloc(sizeof *ph);
    *ph = (struct phys){ fd, size, prop->location.id };
    *h = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    COUNT();
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    struct phys *ph = (struct phys *)(uintptr_t)h;
    pthread_mutex_lock(&mu); used_bytes -= ph->size; pthread_mutex_unlock(&mu);
    close(ph->fd); /* existing mappings keep the memory alive, as in CUDA */
    free(ph);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
    COUNT(); (void)align; (void)addr; (void)flags;
    if (!p || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    void *v = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (v == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = (CUdeviceptr)(uintptr_t)v;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) {
    COUNT();
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    return munmap((void *)(uintptr_t)p, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    COUNT(); (void)flags;
    if (!p || !h || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    struct phys *ph = (struct phys *)(uintptr_t)h;
    if (offset + size > ph->size) return CUDA_ERROR_INVALID_VALUE;
    void *v = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->fd, (off_t)offset);
    return v == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    COUNT();
    if (!p || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    void *v = mmap((void *)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (v == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
    forget_access(p, size, -1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) {
    COUNT();
    if (!p || !desc || count == 0) return CUDA_ERROR_INVALID_VALUE;
    if (mprotect((void *)(uintptr_t)p, size, PROT_READ | PROT_WRITE) != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    if (naccess < MAX_ACCESS) access_ranges[naccess++] = (struct access_range){ p, size, desc->location.id };
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
