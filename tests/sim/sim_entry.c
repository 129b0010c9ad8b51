/* Part of the simulated libcuda.so.1 (cuda_sim.c includes it, so the simulator stays one
 * translation unit and its statics file-local): the driver entry-point lookup. */
/* ---- entry points ---- */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags);

struct entry { const char *name; int since; void *legacy; void *per_thread; };

#define PTDS 2u
static const struct entry entries[] = {
    /* For each name, newest ABI first. */
    { "cuMemAlloc", 3020, (void *)cuMemAlloc_v2, NULL },
    { "cuMemAlloc", 2000, (void *)cuMemAlloc, NULL },
    { "cuMemFree", 3020, (void *)cuMemFree_v2, NULL },
    { "cuMemAllocPitch", 3020, (void *)cuMemAllocPitch_v2, NULL },
    { "cuMemGetInfo", 3020, (void *)cuMemGetInfo_v2, NULL },
    { "cuMemAllocManaged", 6000, (void *)cuMemAllocManaged, NULL },
    { "cuMemHostAlloc", 2020, (void *)cuMemHostAlloc, NULL },
    { "cuMemFreeHost", 2000, (void *)cuMemFreeHost, NULL },
    { "cuMemAllocAsync", 11020, (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz },
    { "cuMemFreeAsync", 11020, (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz },
    { "cuMemAllocFromPoolAsync", 11020, (void *)cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync_ptsz },
    { "cuMemCreate", 10020, (void *)cuMemCreate, NULL },
    { "cuMemRelease", 10020, (void *)cuMemRelease, NULL },
    { "cuMemMap", 10020, (void *)cuMemMap, NULL },
    { "cuMemUnmap", 10020, (void *)cuMemUnmap, NULL },
    { "cuMemAddressReserve", 10020, (void *)cuMemAddressReserve, NULL },
    { "cuMemAddressFree", 10020, (void *)cuMemAddressFree, NULL },
    { "cuMemSetAccess", 10020, (void *)cuMemSetAccess, NULL },
    { "cuMemGetAllocationGranularity", 10020, (void *)cuMemGetAllocationGranularity, NULL },
    { "cuGetProcAddress", 12000, (void *)cuGetProcAddress_v2, NULL },
    { "cuGetProcAddress", 11030, (void *)cuGetProcAddress, NULL },
    { "cuInit", 2000, (void *)cuInit, NULL },
    { "cuDriverGetVersion", 2020, (void *)cuDriverGetVersion, NULL },
    { "cuDeviceGet", 2000, (void *)cuDeviceGet, NULL },
    { "cuDeviceGetCount", 2000, (void *)cuDeviceGetCount, NULL },
    { "cuDeviceGetAttribute", 2000, (void *)cuDeviceGetAttribute, NULL },
    { "cuDeviceTotalMem", 3020, (void *)cuDeviceTotalMem_v2, NULL },
    { "cuDevicePrimaryCtxRetain", 7000, (void *)cuDevicePrimaryCtxRetain, NULL },
    { "cuDevicePrimaryCtxReset", 11000, (void *)cuDevicePrimaryCtxReset_v2, NULL },
    { "cuDevicePrimaryCtxGetState", 7000, (void *)cuDevicePrimaryCtxGetState, NULL },
    { "cuDevicePrimaryCtxRelease", 11000, (void *)cuDevicePrimaryCtxRelease_v2, NULL },
    { "cuDeviceGetDefaultMemPool", 11020, (void *)cuDeviceGetDefaultMemPool, NULL },
    { "cuMemPoolCreate", 11020, (void *)cuMemPoolCreate, NULL },
    { "cuGraphCreate", 10000, (void *)cuGraphCreate, NULL },
    { "cuGraphAddMemAllocNode", 11040, (void *)cuGraphAddMemAllocNode, NULL },
    { "cuGraphAddMemFreeNode", 11040, (void *)cuGraphAddMemFreeNode, NULL },
    { "cuMemPoolDestroy", 11020, (void *)cuMemPoolDestroy, NULL },
    { "cuCtxSetCurrent", 4000, (void *)cuCtxSetCurrent, NULL },
    { "cuCtxGetDevice", 2000, (void *)cuCtxGetDevice, NULL },
    { "cuCtxSynchronize", 2000, (void *)cuCtxSynchronize, NULL },
    { "cuStreamCreate", 2000, (void *)cuStreamCreate, NULL },
    { "cuStreamCreateWithPriority", 5050, (void *)cuStreamCreateWithPriority, NULL },
    { "cuStreamIsCapturing", 10000, (void *)cuStreamIsCapturing, NULL },
    { "cuStreamQuery", 2000, (void *)cuStreamQuery, NULL },
    { "cuStreamBeginCapture", 10010, (void *)cuStreamBeginCapture_v2, NULL },
    { "cuStreamBeginCapture", 10000, (void *)cuStreamBeginCapture, NULL },
    { "cuStreamEndCapture", 10000, (void *)cuStreamEndCapture, NULL },
    { "cuStreamGetCaptureInfo", 12030, (void *)cuStreamGetCaptureInfo_v3, NULL },
    { "cuThreadExchangeStreamCaptureMode", 10010, (void *)cuThreadExchangeStreamCaptureMode, NULL },
    { "cuStreamWaitEvent", 3020, (void *)cuStreamWaitEvent, NULL },
    { "cuCtxGetCurrent", 4000, (void *)cuCtxGetCurrent, NULL },
    { "cuCtxPushCurrent", 4000, (void *)cuCtxPushCurrent_v2, NULL },
    { "cuCtxPopCurrent", 4000, (void *)cuCtxPopCurrent_v2, NULL },
    { "cuEventCreate", 2000, (void *)cuEventCreate, NULL },
    { "cuEventRecord", 2000, (void *)cuEventRecord, NULL },
    { "cuCtxRecordEvent", 12050, (void *)cuCtxRecordEvent, NULL },
    { "cuEventQuery", 2000, (void *)cuEventQuery, NULL },
    { "cuEventSynchronize", 2000, (void *)cuEventSynchronize, NULL },
    { "cuEventDestroy", 4000, (void *)cuEventDestroy_v2, NULL },
    { "cuMemGetAddressRange", 3020, (void *)cuMemGetAddressRange_v2, NULL },
    { "cuPointerGetAttribute", 4000, (void *)cuPointerGetAttribute, NULL },
    { "cuPointerGetAttributes", 7000, (void *)cuPointerGetAttributes, NULL },
    { "cuIpcGetMemHandle", 4010, (void *)cuIpcGetMemHandle, NULL },
    { "cuIpcOpenMemHandle", 11000, (void *)cuIpcOpenMemHandle_v2, NULL },
    { "cuIpcCloseMemHandle", 4010, (void *)cuIpcCloseMemHandle, NULL },
    { "cuStreamDestroy", 4000, (void *)cuStreamDestroy_v2, NULL },
    { "cuStreamSynchronize", 2000, (void *)cuStreamSynchronize, NULL },
    { "cuMemcpyHtoD", 3020, (void *)cuMemcpyHtoD_v2, NULL },
    { "cuMemcpyDtoH", 3020, (void *)cuMemcpyDtoH_v2, NULL },
    { "cuMemsetD8", 3020, (void *)cuMemsetD8_v2, NULL },
};

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status) {
    COUNT();
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const struct entry *e = &entries[i];
        if (strcmp(e->name, symbol) != 0) continue;
        known = 1;
        if (version < e->since) continue;
        *pfn = (flags & PTDS) && e->per_thread ? e->per_thread : e->legacy;
        if (status) *status = 0;
        return CUDA_SUCCESS;
    }
    if (status) *status = known ? 2 : 1;
    return CUDA_ERROR_NOT_FOUND;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, uint64_t flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

EXPORT void *simRealAddress(const char *name) {
    static const struct { const char *name; void *fn; } own[] = {
        { "cuMemAlloc_v2", (void *)cuMemAlloc_v2 },
        { "cuMemAlloc", (void *)cuMemAlloc },
        { "cuMemFree_v2", (void *)cuMemFree_v2 },
        { "cuMemCreate", (void *)cuMemCreate },
        { "cuMemMap", (void *)cuMemMap },
        { "cuMemAllocAsync", (void *)cuMemAllocAsync },
        { "cuMemAllocAsync_ptsz", (void *)cuMemAllocAsync_ptsz },
        { "cuDriverGetVersion", (void *)cuDriverGetVersion },
        { "cuGetProcAddress_v2", (void *)cuGetProcAddress_v2 },
    };
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (strcmp(own[i].name, name) == 0) return own[i].fn;
    return NULL;
}
