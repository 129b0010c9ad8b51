/* Device memory held by two owners at exit: 2 MiB of the program's own and 12 MiB of a library
 * (tests/clients/owner_lib.c, built as libnccl.so.2); one more allocation of the program's is
 * freed. Reports must name each owner with its bytes. */
#include "cuda_sim.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int owner_lib_allocate(void);
int owner_lib_allocate_async(void);

static void wait_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* usage: [OWNER_ASYNC=1] [OWNER_GRAPH=1] [OWNER_POOLS=1] owners [MS]: then holds 64 MiB more for
 * MS milliseconds, frees it and waits MS again before exit (so a sampler sees the peak and the
 * end state). OWNER_GRAPH=1: the program also captures a graph whose memory node keeps 2 MiB.
 * OWNER_POOLS=1: it creates two pools of its own on device 0, keeps 2 MiB from one, and creates
 * and destroys a third. OWNER_NODE=1: it builds a graph node by node whose memory node keeps
 * 2 MiB (and a graph whose memory node is freed by a free node). OWNER_FIRST=1: 32 MiB taken
 * and freed just before the 64. */
int main(int argc, char **argv) {
    void *mine = NULL, *gone = NULL;
    int r = cudaMalloc(&mine, 2 << 20);
    r = r ? r : cudaMalloc(&gone, 1 << 20);
    r = r ? r : cudaFree(gone);
    r = r ? r : owner_lib_allocate();
    /* OWNER_ASYNC=1: the library also keeps 2 MiB it took stream-ordered. */
    if (getenv("OWNER_ASYNC")) r = r ? r : owner_lib_allocate_async();
    if (getenv("OWNER_GRAPH")) {
        cudaStream_t s = NULL;
        void *node = NULL, *graph = NULL;
        r = r ? r : cudaStreamCreate(&s);
        r = r ? r : cudaStreamBeginCapture(s, 0);
        r = r ? r : cudaMallocAsync(&node, 2 << 20, s);
        r = r ? r : cudaStreamEndCapture(s, &graph);
    }
    if (getenv("OWNER_POOLS")) {
        /* cudaMemPoolProps: allocation type 1 (pinned) at 0, location type 1 (a device) at 8,
         * its id at 12; the rest zero. */
        int props[22] = {1, 0, 1, 0};
        cudaMemPool_t kept = NULL, idle = NULL, gone_pool = NULL;
        void *from_pool = NULL;
        r = r ? r : cudaMemPoolCreate(&kept, props);
        r = r ? r : cudaMemPoolCreate(&idle, props);
        r = r ? r : cudaMemPoolCreate(&gone_pool, props);
        r = r ? r : cudaMallocFromPoolAsync(&from_pool, 2 << 20, kept, NULL);
        r = r ? r : cudaMemPoolDestroy(gone_pool);
    }
    if (getenv("OWNER_NODE")) {
        /* cudaMemAllocNodeParams: pool properties (pinned, on device 0), then at byte 104 the
         * size, at 112 the address CUDA writes. */
        unsigned char params[120] = {0};
        int props[4] = {1, 0, 1, 0};
        size_t size = 2 << 20;
        memcpy(params, props, sizeof props);
        memcpy(params + 104, &size, sizeof size);
        void *graph = NULL, *node = NULL, *graph2 = NULL, *node2 = NULL, *freed = NULL;
        r = r ? r : cudaGraphCreate(&graph, 0);
        r = r ? r : cudaGraphAddMemAllocNode(&node, graph, NULL, 0, params);
        unsigned char params2[120];
        memcpy(params2, params, sizeof params2);
        r = r ? r : cudaGraphCreate(&graph2, 0);
        r = r ? r : cudaGraphAddMemAllocNode(&node2, graph2, NULL, 0, params2);
        memcpy(&freed, params2 + 112, sizeof freed);
        r = r ? r : cudaGraphAddMemFreeNode(&node2, graph2, &node2, 1, freed);
    }
    printf("owners: %d\n", r);
    if (argc > 1 && r == 0) {
        long ms = atol(argv[1]);
        void *burst = NULL, *first = NULL;
        /* OWNER_FIRST=1: 32 MiB taken and freed just before (a call under way when a sample
         * begins to wait, ended just before the burst begins). */
        if (getenv("OWNER_FIRST")) {
            r = cudaMalloc(&first, 32 << 20);
            r = r ? r : cudaFree(first);
        }
        r = r ? r : cudaMalloc(&burst, 64 << 20);
        wait_ms(ms);
        r = r ? r : cudaFree(burst);
        wait_ms(ms);
    }
    return r;
}
