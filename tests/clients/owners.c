/* Device memory held by two owners at exit: 2 MiB of the program's own and 12 MiB of a library
 * (tests/clients/owner_lib.c, built as libnccl.so.2); one more allocation of the program's is
 * freed. Reports must name each owner with its bytes. */
#include "cuda_sim.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int owner_lib_allocate(void);

/* usage: owners [MS]: waits MS milliseconds before exit (so a sampler sees the end state). */
int main(int argc, char **argv) {
    void *mine = NULL, *gone = NULL;
    int r = cudaMalloc(&mine, 2 << 20);
    r = r ? r : cudaMalloc(&gone, 1 << 20);
    r = r ? r : cudaFree(gone);
    r = r ? r : owner_lib_allocate();
    printf("owners: %d\n", r);
    if (argc > 1) {
        long ms = atol(argv[1]);
        struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
        nanosleep(&t, NULL);
    }
    return r;
}
