/* An allocation storm: THREADS threads allocate and free through the runtime until killed.
 * Prints "storming" once every thread has started. Usage: storm [THREADS] */
#include "cuda_sim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *loop(void *arg) {
    size_t size = 256 * (size_t)(1 + (long)arg);
    for (;;) {
        void *p = NULL;
        if (cudaMalloc(&p, size) == 0) cudaFree(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4;
    pthread_t t[64];
    if (n < 1 || n > 64) return 2;
    for (long i = 0; i < n; i++) pthread_create(&t[i], NULL, loop, (void *)i);
    printf("storming\n");
    fflush(stdout);
    pthread_join(t[0], NULL);
    return 0;
}
