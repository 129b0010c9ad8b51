/* One cudaMalloc and one cudaFree through the runtime, then reports whether the runtime's own
 * driver pointer for cuMemAlloc is gpushim's wrapper (the runtime reached the driver through
 * us) and how often the simulated driver's cuMemAlloc_v2 ran. Simulator only. */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>

int main(void) {
    void *p = NULL;
    int r1 = cudaMalloc(&p, 1 << 20);
    int r2 = cudaFree(p);
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    void *(*real_address)(const char *) = (void *(*)(const char *))dlsym(drv, "simRealAddress");
    long (*calls)(const char *) = (long (*)(const char *))dlsym(drv, "simCallCount");
    void *(*runtime_fn)(const char *) = (void *(*)(const char *))dlsym(rt, "cudartSimDriverFn");
    if (!real_address || !calls || !runtime_fn) { fprintf(stderr, "not the simulator\n"); return 2; }
    printf("rc %d %d\n", r1, r2);
    printf("runtime_driver_pointer_wrapped %d\n", runtime_fn("cuMemAlloc") != real_address("cuMemAlloc_v2"));
    printf("driver_cuMemAlloc_v2_calls %ld\n", calls("cuMemAlloc_v2"));
    return 0;
}
