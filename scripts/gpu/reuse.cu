// Safe reuse on a real GPU (contract 3): a kernel on stream s1 still reads a buffer when the
// program frees it; the next allocation goes to a kernel on stream s2 that overwrites it at
// once. If an allocator hands the buffer out before s1 finished, the reader's checksum is wrong.
// Modes: sync (cudaMalloc/cudaFree), async (cudaMallocAsync/cudaFreeAsync: free on s1, next
// allocation on s2), unsafe (the program reuses the buffer itself without waiting: the
// control that shows the check detects reuse). Prints iterations, reuses and bad checksums.
// Usage: reuse MODE [ITERATIONS]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
#include <vector>

constexpr int N = 1 << 16;  // ints per buffer (256 KiB)

__global__ void fill(int *a, int v) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) a[i] = v + i;
}

// Waits ~spin cycles, then sums the buffer into *out.
__global__ void slow_sum(const int *a, long long spin, unsigned long long *out) {
    long long t0 = clock64();
    while (clock64() - t0 < spin) {}
    __shared__ unsigned long long part;
    if (threadIdx.x == 0) part = 0;
    __syncthreads();
    unsigned long long s = 0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) s += (unsigned)a[i];
    atomicAdd(&part, s);
    __syncthreads();
    if (threadIdx.x == 0) *out = part;
}

__global__ void scribble(int *b) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) b[i] = -1;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "sync";
    int iters = argc > 2 ? atoi(argv[2]) : 2000;
    cudaStream_t s1, s2;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    unsigned long long *sums;
    cudaMalloc(&sums, sizeof(unsigned long long) * iters);
    std::vector<unsigned long long> expect(iters);
    int reuses = 0;
    int *own = nullptr;
    if (!strcmp(mode, "unsafe")) cudaMalloc(&own, N * sizeof(int));
    for (int it = 0; it < iters; it++) {
        int v = it * 7;
        unsigned long long e = 0;
        for (int i = 0; i < N; i++) e += (unsigned)(v + i);
        expect[it] = e;
        int *a = nullptr, *b = nullptr;
        if (!strcmp(mode, "async")) {
            cudaMallocAsync(&a, N * sizeof(int), s1);
        } else if (!strcmp(mode, "unsafe")) {
            a = own;
        } else {
            cudaMalloc(&a, N * sizeof(int));
        }
        fill<<<64, 256, 0, s1>>>(a, v);
        slow_sum<<<1, 256, 0, s1>>>(a, 20000, sums + it);
        if (!strcmp(mode, "async")) {
            cudaFreeAsync(a, s1);
            cudaMallocAsync(&b, N * sizeof(int), s2);
        } else if (!strcmp(mode, "unsafe")) {
            b = own;
        } else {
            cudaFree(a);
            cudaMalloc(&b, N * sizeof(int));
        }
        if (b == a) reuses++;
        scribble<<<64, 256, 0, s2>>>(b);
        if (!strcmp(mode, "async")) cudaFreeAsync(b, s2);
        else if (strcmp(mode, "unsafe")) cudaFree(b);
    }
    cudaDeviceSynchronize();
    std::vector<unsigned long long> got(iters);
    cudaMemcpy(got.data(), sums, sizeof(unsigned long long) * iters, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < iters; i++) bad += got[i] != expect[i];
    cudaError_t err = cudaGetLastError();
    printf("mode %s iterations %d reuses %d bad_checksums %d error %d\n", mode, iters, reuses, bad, (int)err);
    return err != cudaSuccess;
}
