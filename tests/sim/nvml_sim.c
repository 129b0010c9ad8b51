/* libnvidia-ml.so.1 for machines without a GPU: what NVML would say of this process on the
 * simulator's device. A process that made a CUDA context shows its device memory (the
 * simulator's allocations) plus the context's own (GPUSHIM_SIM_CONTEXT_BYTES, default 512 MiB,
 * about what a CUDA 13 context takes on an H100); the device total is the simulator's limit
 * plus what the driver keeps for itself (GPUSHIM_SIM_NVML_RESERVED, default 480 MiB, as on an
 * H100 80GB: NVML's total 81,559 MiB, CUDA's 81,079), which no process can allocate. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_INSUFFICIENT_SIZE = 7 };

static size_t (*used_fn)(void);
static int (*context_fn)(void);
static size_t (*limit_fn)(void);

/* The simulator's driver, where it is: in the global scope (a driver-API program links it), or
 * loaded locally by the simulator's runtime (dlopen of libcuda.so.1 with RTLD_LOCAL, as the
 * real runtime does), which RTLD_DEFAULT does not search. */
static void *lookup(const char *name) {
    void *f = dlsym(RTLD_DEFAULT, name);
    if (f) return f;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return NULL;
    f = dlsym(h, name);
    dlclose(h);
    return f;
}

static void find(void) {
    if (!used_fn) used_fn = (size_t (*)(void))lookup("simUsedBytes");
    if (!context_fn) context_fn = (int (*)(void))lookup("simContextMade");
    if (!limit_fn) limit_fn = (size_t (*)(void))lookup("simLimitBytes");
}

static unsigned long long context_bytes(void) {
    const char *v = getenv("GPUSHIM_SIM_CONTEXT_BYTES");
    return v ? strtoull(v, NULL, 10) : 512ull << 20;
}

/* This process's bytes on the device, 0 before it made a context. */
static unsigned long long process_bytes(void) {
    find();
    if (!context_fn || !context_fn()) return 0;
    return (used_fn ? used_fn() : 0) + context_bytes();
}

EXPORT int nvmlInit_v2(void) { return NVML_SUCCESS; }
EXPORT int nvmlShutdown(void) { return NVML_SUCCESS; }
EXPORT int nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = 1;
    return NVML_SUCCESS;
}
EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
    if (!h || i != 0) return NVML_ERROR_INVALID_ARGUMENT;
    *h = (void *)1;
    return NVML_SUCCESS;
}
EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(void *h, unsigned int *count, nvmlProcessInfo_t *infos) {
    (void)h;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long b = process_bytes();
    unsigned int n = b ? 1 : 0;
    if (*count < n) { *count = n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    *count = n;
    if (n) infos[0] = (nvmlProcessInfo_t){ (unsigned int)getpid(), b, 0xffffffffu, 0xffffffffu };
    return NVML_SUCCESS;
}
EXPORT int nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    (void)h;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    find();
    const char *kept = getenv("GPUSHIM_SIM_NVML_RESERVED");
    m->total = (limit_fn ? limit_fn() : 16ull << 30) + (kept ? strtoull(kept, NULL, 0) : 480ull << 20);
    m->used = process_bytes();
    m->free = m->total > m->used ? m->total - m->used : 0;
    return NVML_SUCCESS;
}
