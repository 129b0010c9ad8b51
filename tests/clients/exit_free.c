/* Frees its device memory from an exit handler registered before its first CUDA call: CUDA's
 * own exit handler, registered when CUDA starts, runs first, and the free meets a driver that is
 * shutting down (as a framework's allocator freeing from a static destructor does). Prints what
 * the free answered. Usage: exit_free */
#include "cuda_sim.h"

#include <stdio.h>
#include <stdlib.h>

static void *p;

static void free_at_exit(void) {
    int rc = cudaFree(p);
    printf("free at exit answered %d\n", rc);
    fflush(stdout);
}

int main(void) {
    atexit(free_at_exit);
    if (cudaMalloc(&p, 4 << 20) != 0) return 1;
    return 0;
}
