/* A thread allocates and frees through the runtime in a loop while the main thread forks
 * COUNT children, one at a time. Even-numbered children make one CUDA call (which fails in a
 * forked child, as with real CUDA) and exit; odd-numbered ones exit without touching CUDA.
 * Prints "forked COUNT" when every child was reaped. Usage: forker [COUNT] */
#include "cuda_sim.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static atomic_int stop;

static void *loop(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        void *p = NULL;
        if (cudaMalloc(&p, 4096) == 0) cudaFree(p);
    }
    return NULL;
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 200;
    void *p = NULL;
    cudaMalloc(&p, 1024); /* CUDA initialized and the trace open before any fork */
    cudaFree(p);
    pthread_t t;
    pthread_create(&t, NULL, loop, NULL);
    for (int i = 0; i < count; i++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            if (i % 2 == 0) {
                void *q = NULL;
                cudaMalloc(&q, 512);
            }
            _exit(0);
        }
        int st = 0;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "child %d failed: %d\n", i, st);
            return 1;
        }
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("forked %d\n", count);
    return 0;
}
