/* The CUDA API subset that gpushim's simulator implements and its test clients call.
 * Declarations match the real CUDA 13 headers' ABI, so the clients also build against the real
 * libcudart/libcuda on the GPU machine. */
#ifndef GPUSHIM_CUDA_SIM_H
#define GPUSHIM_CUDA_SIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaMemPool_t;
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef int CUdevice;
typedef void *CUcontext;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { char reserved[64]; } cudaIpcMemHandle_t;

struct cudaExtent { size_t width, height, depth; };
struct cudaPitchedPtr { void *ptr; size_t pitch, xsize, ysize; };

typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes;
    struct { int type; int id; } location; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;

typedef struct {
    struct { int type; int id; } location;
    int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} CUmemAccessDesc;

/* Runtime. */
cudaError_t cudaMalloc(void **p, size_t size);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s);
cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s);
cudaError_t cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s);
cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool, cudaStream_t s);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t size, cudaMemPool_t pool, cudaStream_t s);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device);
cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const void *props);
cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool);
cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags);
cudaError_t cudaMallocHost(void **p, size_t size);
cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height);
cudaError_t cudaMalloc3D(struct cudaPitchedPtr *p, struct cudaExtent extent);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind);
cudaError_t cudaMemset(void *p, int value, size_t n);
cudaError_t cudaRuntimeGetVersion(int *v);
cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags, int *status);
cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                             unsigned long long flags, int *status);

/* Driver. */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *v);
CUresult cuDeviceGet(CUdevice *d, int ordinal);
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice d);
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice d);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice d);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxGetDevice(CUdevice *d);
CUresult cuCtxSynchronize(void);
CUresult cuStreamCreate(CUstream *s, unsigned int flags);
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size);
CUresult cuMemFree_v2(CUdeviceptr p);
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t size, CUstream s);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t size, CUstream s);
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d);
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const void *props);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuDeviceGetGraphMemAttribute(CUdevice d, int attr, void *value);
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int elem);
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t size, unsigned int flags);
CUresult cuMemHostAlloc(void **p, size_t size, unsigned int flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle h);
CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr p, size_t size);
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr p, size_t size);
CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, int option);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p);
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p);
CUresult cuIpcGetMemHandle(void *handle, CUdeviceptr p);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *out, cudaIpcMemHandle_t handle, unsigned flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr p);
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p);
cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags);
cudaError_t cudaIpcCloseMemHandle(void *p);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags);

CUresult cuStreamBeginCapture_v2(CUstream s, int mode);
CUresult cuStreamEndCapture(CUstream s, void **graph);
CUresult cuStreamIsCapturing(CUstream s, int *status);
CUresult cuStreamQuery(CUstream s);
CUresult cuThreadExchangeStreamCaptureMode(int *mode);
CUresult cuEventCreate(void **ev, unsigned int flags);
CUresult cuEventRecord(void *ev, CUstream s);
CUresult cuEventQuery(void *ev);
CUresult cuEventSynchronize(void *ev);
CUresult cuStreamWaitEvent(CUstream s, void *ev, unsigned int flags);

/* Runtime stream capture and events (void * stands for cudaEvent_t and cudaGraph_t; modes and
 * statuses are the enums' int values). */
cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, void **graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, int *status);
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, int *status, unsigned long long *id, void **graph,
                                     const void **deps, const void **edges, size_t *ndeps);
cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode);
cudaError_t cudaEventCreate(void **ev);
cudaError_t cudaEventRecord(void *ev, cudaStream_t s);
cudaError_t cudaEventQuery(void *ev);
cudaError_t cudaEventSynchronize(void *ev);
cudaError_t cudaEventDestroy(void *ev);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, void *ev, unsigned int flags);
cudaError_t cudaGraphDestroy(void *graph);
/* A graph built node by node; the memory nodes' parameters (cudaMemAllocNodeParams) as bytes. */
cudaError_t cudaGraphCreate(void **graph, unsigned int flags);
cudaError_t cudaGraphAddMemAllocNode(void **node, void *graph, const void *deps, size_t ndeps, void *params);
cudaError_t cudaGraphAddMemFreeNode(void **node, void *graph, const void *deps, size_t ndeps, void *dptr);
CUresult cuGraphCreate(void **graph, unsigned int flags);
CUresult cuGraphAddMemAllocNode(void **node, void *graph, const void *deps, size_t ndeps, void *params);
CUresult cuGraphAddMemFreeNode(void **node, void *graph, const void *deps, size_t ndeps, CUdeviceptr dptr);

/* Simulator only (tests/sim): GPU work in time, and call counts. */
CUresult simLaunch(CUstream s, CUdeviceptr p, size_t size, unsigned usec);
int simInUse(CUdeviceptr p, size_t size);
long simCallCount(const char *name);
size_t simUsedBytes(void);

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, uint64_t flags, int *status);

/* The names a program uses, as CUDA's own cuda.h maps them to the versioned functions (the
 * simulator itself defines the unversioned legacy ones too, so it leaves these out). */
#ifndef CUDA_SIM_IMPLEMENTATION
#define cuMemAlloc cuMemAlloc_v2
#define cuMemFree cuMemFree_v2
#define cuMemAllocPitch cuMemAllocPitch_v2
#define cuMemGetInfo cuMemGetInfo_v2
#define cuDeviceTotalMem cuDeviceTotalMem_v2
#define cuMemcpyHtoD cuMemcpyHtoD_v2
#define cuMemcpyDtoH cuMemcpyDtoH_v2
#define cuStreamDestroy cuStreamDestroy_v2
#define cuMemGetAddressRange cuMemGetAddressRange_v2
#endif

#ifdef __cplusplus
}
#endif
#endif
