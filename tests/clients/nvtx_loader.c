/* Does what NVTX v3's loader does on a program's first NVTX call, for two libraries that each
 * embed NVTX: dlopen(NVTX_INJECTION64_PATH), call its InitializeInjectionNvtx2 with an export
 * table, then call through the core callback slots it filled. Two threads push, mark and pop,
 * interleaved with a CUDA allocation. Prints each expected NVTX record as
 * "THREAD KIND TEXT LEVEL" (THREAD 0 = main, 1 = worker), in each thread's order. */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*fnptr)(void);
struct callbacks { size_t size; int (*get_module)(int, fnptr ***, unsigned *); };

/* One library's NVTX state: its slots, and the table of pointers to them. */
struct lib { fnptr slots[16]; fnptr *table[16]; };
static struct lib lib_a, lib_b;
static struct lib *current;

static int get_module(int module, fnptr ***out, unsigned *size) {
    if (module != 1) return 0;
    for (int i = 0; i < 16; i++) current->table[i] = &current->slots[i];
    *out = current->table;
    *size = 16;
    return 1;
}
static struct callbacks cbs = { sizeof(struct callbacks), get_module };
static const void *export_table(unsigned id) { return id == 1 ? (const void *)&cbs : NULL; }

typedef int (*push_t)(const char *);
typedef int (*pop_t)(void);
typedef void (*mark_t)(const char *);

static int init(struct lib *l) {
    const char *path = getenv("NVTX_INJECTION64_PATH");
    void *h = path ? dlopen(path, RTLD_NOW) : NULL;
    int (*initialize)(const void *(*)(unsigned)) = h ? (int (*)(const void *(*)(unsigned)))dlsym(h, "InitializeInjectionNvtx2") : NULL;
    if (!initialize) { fprintf(stderr, "no injection: %s\n", dlerror()); return 0; }
    current = l;
    return initialize(export_table);
}

static void *worker(void *arg) {
    (void)arg;
    ((push_t)lib_b.slots[9])("loader");   /* RangePushA, through library B */
    ((mark_t)lib_b.slots[2])("batch ready"); /* MarkA */
    ((pop_t)lib_b.slots[11])();            /* RangePop */
    return NULL;
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!init(&lib_a) || !init(&lib_b)) return 2;
    void *p = NULL;
    ((push_t)lib_a.slots[9])("step 0");
    cudaMalloc(&p, 1 << 20);
    ((push_t)lib_a.slots[9])("forward");
    ((mark_t)lib_a.slots[2])("checkpoint");
    ((pop_t)lib_a.slots[11])();
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    cudaFree(p);
    ((pop_t)lib_a.slots[11])();
    printf("0 range_push step 0|0\n0 range_push forward|1\n0 mark checkpoint|0\n0 range_pop |1\n");
    printf("1 range_push loader|0\n1 mark batch ready|0\n1 range_pop |0\n0 range_pop |0\n");
    return 0;
}
