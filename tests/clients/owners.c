/* Device memory held by two owners at exit: 2 MiB of the program's own and 12 MiB of a library
 * (tests/clients/owner_lib.c, built as libnccl.so.2); one more allocation of the program's is
 * freed. Reports must name each owner with its bytes. */
#include "cuda_sim.h"
#include <stdio.h>

int owner_lib_allocate(void);

int main(void) {
    void *mine = NULL, *gone = NULL;
    int r = cudaMalloc(&mine, 2 << 20);
    r = r ? r : cudaMalloc(&gone, 1 << 20);
    r = r ? r : cudaFree(gone);
    r = r ? r : owner_lib_allocate();
    printf("owners: %d\n", r);
    return r;
}
