// Median cost of one allocation + free pair, single thread: cudaMalloc+cudaFree and
// cudaMallocAsync+cudaFreeAsync, SIZE bytes, N pairs each. Built with -cudart shared so that a
// preloaded gpushim sees the calls. Usage: pool_bench [N] [SIZE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>

static double median(std::vector<double> &v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    size_t size = argc > 2 ? strtoull(argv[2], nullptr, 0) : (1 << 20);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaFree(nullptr);
    void *p = nullptr;
    std::vector<double> t(n);
    for (int i = 0; i < 200; i++) { cudaMalloc(&p, size); cudaFree(p); }
    for (int i = 0; i < n; i++) {
        auto a = std::chrono::steady_clock::now();
        if (cudaMalloc(&p, size) || cudaFree(p)) { printf("sync failed\n"); return 1; }
        t[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    double sync_us = median(t);
    for (int i = 0; i < 200; i++) { cudaMallocAsync(&p, size, s); cudaFreeAsync(p, s); }
    cudaStreamSynchronize(s);
    for (int i = 0; i < n; i++) {
        auto a = std::chrono::steady_clock::now();
        if (cudaMallocAsync(&p, size, s) || cudaFreeAsync(p, s)) { printf("async failed\n"); return 1; }
        t[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    cudaStreamSynchronize(s);
    double async_us = median(t);
    // The clock itself, to subtract by eye.
    for (int i = 0; i < n; i++) {
        auto a = std::chrono::steady_clock::now();
        t[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    }
    printf("sync_pair_us %.3f\nasync_pair_us %.3f\nclock_us %.3f\n", sync_us, async_us, median(t));
    return 0;
}
