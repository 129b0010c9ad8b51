/* A training loop with NVTX iterations for the report tests. Each "step" range allocates and
 * frees activations, and leaks 512 KiB from one call site (leak); step 6 also makes a 200 MiB
 * spike (spike) on top of everything; device 1 gets one 8 MiB allocation; at the end, a 64 GiB
 * request fails. NVTX through the injection library, as NVTX v3's loader does it. Prints the
 * offsets of leak() and spike() in this executable, to check the reports' call sites.
 * Usage: leaky [STEPS] */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*fnptr)(void);
struct callbacks { size_t size; int (*get_module)(int, fnptr ***, unsigned *); };
static fnptr slots[16];
static fnptr *table[16];
static int get_module(int module, fnptr ***out, unsigned *size) {
    if (module != 1) return 0;
    for (int i = 0; i < 16; i++) table[i] = &slots[i];
    *out = table;
    *size = 16;
    return 1;
}
static struct callbacks cbs = { sizeof(struct callbacks), get_module };
static const void *export_table(unsigned id) { return id == 1 ? (const void *)&cbs : NULL; }
static void push(const char *s) { if (slots[9]) ((int (*)(const char *))slots[9])(s); }
static void pop(void) { if (slots[11]) ((int (*)(void))slots[11])(); }

static void *kept[1000];

__attribute__((noinline)) void leak(int step) {
    cudaMalloc(&kept[step], 512 * 1024);
}

__attribute__((noinline)) void spike(void) {
    void *p = NULL;
    cudaMalloc(&p, 200u << 20);
    cudaFree(p);
}

__attribute__((noinline)) void *activation(size_t size) {
    void *p = NULL;
    cudaMalloc(&p, size);
    return p;
}

static long offset_of(void *f) {
    Dl_info info;
    return dladdr(f, &info) ? (long)((char *)f - (char *)info.dli_fbase) : -1;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 12;
    if (steps < 1 || steps > 1000) return 2;
    const char *path = getenv("NVTX_INJECTION64_PATH");
    void *h = path ? dlopen(path, RTLD_NOW) : NULL;
    int (*init)(const void *(*)(unsigned)) = h ? (int (*)(const void *(*)(unsigned)))dlsym(h, "InitializeInjectionNvtx2") : NULL;
    if (!init || !init(export_table)) { fprintf(stderr, "no NVTX injection\n"); return 2; }
    printf("leak_fn %ld\nspike_fn %ld\n", offset_of((void *)leak), offset_of((void *)spike));
    for (int step = 0; step < steps; step++) {
        push("step");
        void *a[4];
        for (int i = 0; i < 4; i++) a[i] = activation((size_t)(step % 3 + 1) * (i + 1) << 20);
        leak(step);
        if (step == 6) spike();
        for (int i = 3; i >= 0; i--) cudaFree(a[i]);
        pop();
    }
    void *d1 = NULL;
    cudaSetDevice(1);
    cudaMalloc(&d1, 8 << 20);
    cudaSetDevice(0);
    void *huge = NULL;
    int rc = cudaMalloc(&huge, 64ull << 30);
    printf("huge %d\n", rc);
    return 0;
}
