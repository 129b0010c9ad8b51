/* libcudart.so.13 for machines without a GPU. It reaches the driver exactly as the real runtime
 * does: dlopen("libcuda.so.1"), dlsym(handle, "cuGetProcAddress_v2"), and every driver function
 * through that. With no driver it returns cudaErrorInsufficientDriver (35) and leaves
 * out-pointers untouched. Errors are remembered per thread for cudaGetLastError.
 *
 * Test-only: cudartSimDriverFn(name) is the driver function pointer the runtime obtained. */
#define _GNU_SOURCE
#define CUDA_SIM_IMPLEMENTATION
#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDevice = 101,
};

typedef CUresult (*getproc_t)(const char *, void **, int, uint64_t, int *);

static struct {
    getproc_t getproc;
    CUresult (*init)(unsigned);
    CUresult (*device_get_count)(int *);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*primary_ctx_reset)(CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_sync)(void);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_alloc_async)(CUdeviceptr *, size_t, CUstream);
    CUresult (*mem_alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream);
    CUresult (*mem_free_async)(CUdeviceptr, CUstream);
    CUresult (*mem_free_async_ptsz)(CUdeviceptr, CUstream);
    CUresult (*mem_alloc_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*mem_alloc_pool_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*default_pool)(CUmemoryPool *, CUdevice);
    CUresult (*pool_create)(CUmemoryPool *, const void *);
    CUresult (*graph_create)(void **, unsigned int);
    CUresult (*graph_alloc_node)(void **, void *, const void *, size_t, void *);
    CUresult (*graph_free_node)(void **, void *, const void *, size_t, CUdeviceptr);
    CUresult (*pool_destroy)(CUmemoryPool);
    CUresult (*mem_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned);
    CUresult (*mem_host_alloc)(void **, size_t, unsigned);
    CUresult (*mem_free_host)(void *);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*stream_create)(CUstream *, unsigned);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_sync)(CUstream);
    CUresult (*memcpy_htod)(CUdeviceptr, const void *, size_t);
    CUresult (*memcpy_dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*memset_d8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*ipc_get)(void *, CUdeviceptr);
    CUresult (*ipc_open)(CUdeviceptr *, cudaIpcMemHandle_t, unsigned);
    CUresult (*ipc_close)(CUdeviceptr);
    CUresult (*begin_capture)(CUstream, int);
    CUresult (*end_capture)(CUstream, void **);
    CUresult (*is_capturing)(CUstream, int *);
    CUresult (*capture_info)(CUstream, int *, unsigned long long *, void **, const void **, const void **, size_t *);
    CUresult (*exchange_mode)(int *);
    CUresult (*event_create)(void **, unsigned);
    CUresult (*event_record)(void *, CUstream);
    CUresult (*event_query)(void *);
    CUresult (*event_sync)(void *);
    CUresult (*event_destroy)(void *);
    CUresult (*stream_wait_event)(CUstream, void *, unsigned);
} drv;

static pthread_once_t once = PTHREAD_ONCE_INIT;
static cudaError_t init_error = cudaSuccess;
static int device_count;
static __thread int current_device;
static __thread int ctx_bound;
static __thread cudaError_t last_error;

#define GET(field, name) drv.getproc(name, (void **)&drv.field, 13000, 1, NULL)
#define GET_PTSZ(field, name) drv.getproc(name, (void **)&drv.field, 13000, 2, NULL)

static void load_driver(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) { init_error = cudaErrorInsufficientDriver; return; }
    drv.getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
    if (!drv.getproc) { init_error = cudaErrorInsufficientDriver; return; }
    GET(init, "cuInit");
    GET(device_get_count, "cuDeviceGetCount");
    GET(primary_ctx_retain, "cuDevicePrimaryCtxRetain");
    GET(primary_ctx_reset, "cuDevicePrimaryCtxReset");
    GET(ctx_set_current, "cuCtxSetCurrent");
    GET(ctx_sync, "cuCtxSynchronize");
    GET(mem_alloc, "cuMemAlloc");
    GET(mem_free, "cuMemFree");
    GET(mem_alloc_async, "cuMemAllocAsync");
    GET_PTSZ(mem_alloc_async_ptsz, "cuMemAllocAsync");
    GET(mem_free_async, "cuMemFreeAsync");
    GET_PTSZ(mem_free_async_ptsz, "cuMemFreeAsync");
    GET(mem_alloc_pool, "cuMemAllocFromPoolAsync");
    GET_PTSZ(mem_alloc_pool_ptsz, "cuMemAllocFromPoolAsync");
    GET(default_pool, "cuDeviceGetDefaultMemPool");
    GET(pool_create, "cuMemPoolCreate");
    GET(graph_create, "cuGraphCreate");
    GET(graph_alloc_node, "cuGraphAddMemAllocNode");
    GET(graph_free_node, "cuGraphAddMemFreeNode");
    GET(pool_destroy, "cuMemPoolDestroy");
    GET(mem_alloc_pitch, "cuMemAllocPitch");
    GET(mem_alloc_managed, "cuMemAllocManaged");
    GET(mem_host_alloc, "cuMemHostAlloc");
    GET(mem_free_host, "cuMemFreeHost");
    GET(mem_get_info, "cuMemGetInfo");
    GET(stream_create, "cuStreamCreate");
    GET(stream_destroy, "cuStreamDestroy");
    GET(stream_sync, "cuStreamSynchronize");
    GET(memcpy_htod, "cuMemcpyHtoD");
    GET(memcpy_dtoh, "cuMemcpyDtoH");
    GET(memset_d8, "cuMemsetD8");
    GET(ipc_get, "cuIpcGetMemHandle");
    GET(ipc_open, "cuIpcOpenMemHandle");
    GET(ipc_close, "cuIpcCloseMemHandle");
    GET(begin_capture, "cuStreamBeginCapture");
    GET(end_capture, "cuStreamEndCapture");
    GET(is_capturing, "cuStreamIsCapturing");
    GET(capture_info, "cuStreamGetCaptureInfo");
    GET(exchange_mode, "cuThreadExchangeStreamCaptureMode");
    GET(event_create, "cuEventCreate");
    GET(event_record, "cuEventRecord");
    GET(event_query, "cuEventQuery");
    GET(event_sync, "cuEventSynchronize");
    GET(event_destroy, "cuEventDestroy");
    GET(stream_wait_event, "cuStreamWaitEvent");
    if (!drv.init || drv.init(0) != 0 || drv.device_get_count(&device_count) != 0)
        init_error = cudaErrorInsufficientDriver;
}

static cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) last_error = e;
    return e;
}

/* Initializes the runtime and binds the thread's current device, as the real runtime does
 * lazily on the first call that needs a context. */
static cudaError_t ready(void) {
    pthread_once(&once, load_driver);
    if (init_error) return init_error;
    if (!ctx_bound) {
        CUcontext ctx;
        drv.primary_ctx_retain(&ctx, current_device);
        drv.ctx_set_current(ctx);
        ctx_bound = 1;
    }
    return cudaSuccess;
}

#define READY() do { cudaError_t e_ = ready(); if (e_) return fail(e_); } while (0)

static cudaError_t from_driver(CUresult r) {
    return fail((cudaError_t)r); /* the sim's driver codes equal the runtime's for what it returns */
}

EXPORT cudaError_t cudaGetLastError(void) { cudaError_t e = last_error; last_error = cudaSuccess; return e; }
EXPORT cudaError_t cudaPeekAtLastError(void) { return last_error; }
EXPORT const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    default: return "unknown error";
    }
}
EXPORT cudaError_t cudaRuntimeGetVersion(int *v) { if (!v) return fail(cudaErrorInvalidValue); *v = 13000; return cudaSuccess; }
EXPORT cudaError_t cudaDriverGetVersion(int *v) { if (!v) return fail(cudaErrorInvalidValue); *v = 13000; return cudaSuccess; }

EXPORT cudaError_t cudaGetDeviceCount(int *n) { READY(); if (!n) return fail(cudaErrorInvalidValue); *n = device_count; return cudaSuccess; }
EXPORT cudaError_t cudaGetDevice(int *d) { if (!d) return fail(cudaErrorInvalidValue); *d = current_device; return cudaSuccess; }
EXPORT cudaError_t cudaSetDevice(int d) {
    pthread_once(&once, load_driver);
    if (init_error) return fail(init_error);
    if (d < 0 || d >= device_count) return fail(cudaErrorInvalidDevice);
    current_device = d;
    ctx_bound = 0;
    return ready();
}
/* Resets the current device's primary context through the driver, as the real runtime does. */
EXPORT cudaError_t cudaDeviceReset(void) { READY(); return from_driver(drv.primary_ctx_reset(current_device)); }
EXPORT cudaError_t cudaDeviceSynchronize(void) { READY(); return from_driver(drv.ctx_sync()); }
EXPORT cudaError_t cudaStreamCreate(cudaStream_t *s) { READY(); return from_driver(drv.stream_create(s, 0)); }
EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
    READY();
    return from_driver(drv.stream_create(s, flags));
}
EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) { READY(); return from_driver(drv.stream_destroy(s)); }
EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t s) { READY(); return from_driver(drv.stream_sync(s)); }
EXPORT cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
    READY();
    return from_driver(drv.default_pool(pool, device));
}
/* cudaMemPoolProps is laid out as the driver's CUmemPoolProps. */
EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const void *props) {
    READY();
    return from_driver(drv.pool_create(pool, props));
}
EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) { READY(); return from_driver(drv.pool_destroy(pool)); }

EXPORT cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
    READY();
    (void)kind;
    memcpy(dst, src, n);
    return cudaSuccess;
}
EXPORT cudaError_t cudaMemset(void *p, int value, size_t n) {
    READY();
    return from_driver(drv.memset_d8((CUdeviceptr)(uintptr_t)p, (unsigned char)value, n));
}

EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p) {
    READY();
    if (!h) return fail(cudaErrorInvalidValue);
    return from_driver(drv.ipc_get(h, (CUdeviceptr)(uintptr_t)p));
}
EXPORT cudaError_t cudaIpcOpenMemHandle(void **p, cudaIpcMemHandle_t h, unsigned flags) {
    READY();
    if (!p) return fail(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult r = drv.ipc_open(&d, h, flags);
    if (r == 0) *p = (void *)(uintptr_t)d;
    return from_driver(r);
}
EXPORT cudaError_t cudaIpcCloseMemHandle(void *p) {
    READY();
    return from_driver(drv.ipc_close((CUdeviceptr)(uintptr_t)p));
}

EXPORT cudaError_t cudaMalloc(void **p, size_t size) {
    READY();
    if (!p) return fail(cudaErrorInvalidValue);
    if (size == 0) { *p = NULL; return cudaSuccess; }
    CUdeviceptr d = 0;
    CUresult r = drv.mem_alloc(&d, size);
    *p = r == 0 ? (void *)(uintptr_t)d : NULL;
    return from_driver(r);
}

/* cuMemFree waits for the whole device, as the real cudaFree does; cudaFree(NULL) still asks
 * the driver, because during a capture it is refused exactly as a real free is. */
EXPORT cudaError_t cudaFree(void *p) {
    READY();
    return from_driver(drv.mem_free((CUdeviceptr)(uintptr_t)p));
}

/* Stream capture and events, through the driver as the real runtime does. */
EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t s, int mode) { READY(); return from_driver(drv.begin_capture(s, mode)); }
EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t s, void **graph) { READY(); return from_driver(drv.end_capture(s, graph)); }
EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t s, int *status) { READY(); return from_driver(drv.is_capturing(s, status)); }
EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, int *status, unsigned long long *id, void **graph,
                                            const void **deps, const void **edges, size_t *ndeps) {
    READY();
    return from_driver(drv.capture_info(s, status, id, graph, deps, edges, ndeps));
}
EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode) { READY(); return from_driver(drv.exchange_mode(mode)); }
EXPORT cudaError_t cudaEventCreateWithFlags(void **ev, unsigned flags) { READY(); return from_driver(drv.event_create(ev, flags)); }
EXPORT cudaError_t cudaEventCreate(void **ev) { return cudaEventCreateWithFlags(ev, 0); }
EXPORT cudaError_t cudaEventRecord(void *ev, cudaStream_t s) { READY(); return from_driver(drv.event_record(ev, s)); }
EXPORT cudaError_t cudaEventQuery(void *ev) { READY(); return from_driver(drv.event_query(ev)); }
EXPORT cudaError_t cudaEventSynchronize(void *ev) { READY(); return from_driver(drv.event_sync(ev)); }
EXPORT cudaError_t cudaEventDestroy(void *ev) { READY(); return from_driver(drv.event_destroy(ev)); }
EXPORT cudaError_t cudaStreamWaitEvent(cudaStream_t s, void *ev, unsigned flags) { READY(); return from_driver(drv.stream_wait_event(s, ev, flags)); }
EXPORT cudaError_t cudaGraphDestroy(void *graph) { (void)graph; return cudaSuccess; }
EXPORT cudaError_t cudaGraphCreate(void **graph, unsigned int flags) { READY(); return from_driver(drv.graph_create(graph, flags)); }
/* cudaMemAllocNodeParams is laid out as the driver's CUDA_MEM_ALLOC_NODE_PARAMS. */
EXPORT cudaError_t cudaGraphAddMemAllocNode(void **node, void *graph, const void *deps, size_t ndeps, void *params) {
    READY();
    return from_driver(drv.graph_alloc_node(node, graph, deps, ndeps, params));
}
EXPORT cudaError_t cudaGraphAddMemFreeNode(void **node, void *graph, const void *deps, size_t ndeps, void *dptr) {
    READY();
    return from_driver(drv.graph_free_node(node, graph, deps, ndeps, (CUdeviceptr)(uintptr_t)dptr));
}

static cudaError_t malloc_async(CUresult (*f)(CUdeviceptr *, size_t, CUstream), void **p, size_t size, cudaStream_t s) {
    READY();
    if (!p) return fail(cudaErrorInvalidValue);
    if (size == 0) { *p = NULL; return cudaSuccess; }
    CUdeviceptr d = 0;
    CUresult r = f(&d, size, s);
    *p = r == 0 ? (void *)(uintptr_t)d : NULL;
    return from_driver(r);
}
EXPORT cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) { return malloc_async(drv.mem_alloc_async, p, size, s); }
EXPORT cudaError_t cudaMallocAsync_ptsz(void **p, size_t size, cudaStream_t s) { return malloc_async(drv.mem_alloc_async_ptsz, p, size, s); }

static cudaError_t free_async(CUresult (*f)(CUdeviceptr, CUstream), void *p, cudaStream_t s) {
    READY();
    if (!p) return cudaSuccess;
    return from_driver(f((CUdeviceptr)(uintptr_t)p, s));
}
EXPORT cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { return free_async(drv.mem_free_async, p, s); }
EXPORT cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) { return free_async(drv.mem_free_async_ptsz, p, s); }

static cudaError_t malloc_pool(CUresult (*f)(CUdeviceptr *, size_t, CUmemoryPool, CUstream), void **p, size_t size,
                               cudaMemPool_t pool, cudaStream_t s) {
    READY();
    if (!p || !pool) return fail(cudaErrorInvalidValue);
    if (size == 0) { *p = NULL; return cudaSuccess; }
    CUdeviceptr d = 0;
    CUresult r = f(&d, size, pool, s);
    *p = r == 0 ? (void *)(uintptr_t)d : NULL;
    return from_driver(r);
}
EXPORT cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool, cudaStream_t s) {
    return malloc_pool(drv.mem_alloc_pool, p, size, pool, s);
}
EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **p, size_t size, cudaMemPool_t pool, cudaStream_t s) {
    return malloc_pool(drv.mem_alloc_pool_ptsz, p, size, pool, s);
}

EXPORT cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags) {
    READY();
    if (!p || size == 0) return fail(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    CUresult r = drv.mem_alloc_managed(&d, size, flags ? flags : 1);
    *p = r == 0 ? (void *)(uintptr_t)d : NULL;
    return from_driver(r);
}

EXPORT cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
    READY();
    if (!p) return fail(cudaErrorInvalidValue);
    /* cuMemHostAlloc waits for the device, as the real pinning does. */
    return from_driver(drv.mem_host_alloc(p, size, flags));
}
EXPORT cudaError_t cudaMallocHost(void **p, size_t size) { return cudaHostAlloc(p, size, 0); }
EXPORT cudaError_t cudaFreeHost(void *p) {
    READY();
    if (!p) return cudaSuccess;
    return from_driver(drv.mem_free_host(p)); /* waits for the device, as the real one does */
}

EXPORT cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height) {
    READY();
    if (!p || !pitch) return fail(cudaErrorInvalidValue);
    if (width == 0 || height == 0) { *p = NULL; *pitch = 0; return cudaSuccess; }
    CUdeviceptr d = 0;
    CUresult r = drv.mem_alloc_pitch(&d, pitch, width, height, 16);
    *p = r == 0 ? (void *)(uintptr_t)d : NULL;
    return from_driver(r);
}

EXPORT cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pp, struct cudaExtent e) {
    READY();
    if (!pp) return fail(cudaErrorInvalidValue);
    size_t pitch = 0;
    void *p = NULL;
    cudaError_t r = cudaMallocPitch(&p, &pitch, e.width, e.height * e.depth);
    if (r == cudaSuccess) *pp = (struct cudaPitchedPtr){ p, pitch, e.width, e.height };
    return r;
}

EXPORT cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    READY();
    if (!free_bytes || !total_bytes) return fail(cudaErrorInvalidValue);
    return from_driver(drv.mem_get_info(free_bytes, total_bytes));
}

/* cudaEnableDefault (0) is the legacy stream here and per-thread in the _ptsz entry points. */
static cudaError_t entry_point(const char *symbol, void **fn, int version, unsigned long long flags, int ptsz,
                               int *status) {
    pthread_once(&once, load_driver);
    if (init_error) return fail(init_error);
    if (!symbol || !fn) return fail(cudaErrorInvalidValue);
    uint64_t f = flags & 3;
    if (f == 0) f = ptsz ? 2 : 1;
    int st = 0;
    CUresult r = drv.getproc(symbol, fn, version, f, &st);
    if (status) *status = r == 0 ? 0 : st;
    return cudaSuccess; /* not found is reported through the status, as by the real runtime */
}

EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags, int *status) {
    return entry_point(symbol, fn, 13000, flags, 0, status);
}
EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **fn, unsigned long long flags, int *status) {
    return entry_point(symbol, fn, 13000, flags, 1, status);
}
EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                                    unsigned long long flags, int *status) {
    return entry_point(symbol, fn, (int)version, flags, 0, status);
}
EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **fn, unsigned int version,
                                                         unsigned long long flags, int *status) {
    return entry_point(symbol, fn, (int)version, flags, 1, status);
}

EXPORT void *cudartSimDriverFn(const char *name) {
    pthread_once(&once, load_driver);
    if (strcmp(name, "cuMemAlloc") == 0) return (void *)drv.mem_alloc;
    if (strcmp(name, "cuMemFree") == 0) return (void *)drv.mem_free;
    if (strcmp(name, "cuMemAllocAsync_ptsz") == 0) return (void *)drv.mem_alloc_async_ptsz;
    if (strcmp(name, "cuGetProcAddress_v2") == 0) return (void *)drv.getproc;
    return NULL;
}
