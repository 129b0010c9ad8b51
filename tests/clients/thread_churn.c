/* Threads that come and go: THREADS threads, one after another, each allocates 64 KiB through
 * the runtime and frees it; the main thread keeps 4 KiB a thousand threads. Prints "threads N".
 * Usage: thread_churn THREADS */
#include "cuda_sim.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static void *one(void *arg) {
    (void)arg;
    void *p = NULL;
    if (cudaMalloc(&p, 64 * 1024) == 0) {
        cudaFree(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long threads = argc > 1 ? atol(argv[1]) : 1000;
    long done = 0;
    for (long i = 0; i < threads; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, one, NULL) != 0) {
            break;
        }
        pthread_join(t, NULL);
        done++;
        if (i % 1000 == 0) {
            void *kept = NULL;
            cudaMalloc(&kept, 4096);
        }
    }
    printf("threads %ld\n", done);
    return 0;
}
