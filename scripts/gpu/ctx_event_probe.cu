/* Whether one cuCtxRecordEvent (CUDA 12.5+) can stand for an event per stream as the pool's
 * checkpoint, on the real driver: what it covers, what it costs, and what it does during a
 * capture. Prints one line per probe:
 *   probe result
 * 1. covers work on a non-blocking stream: not ready (600) while a kernel runs there, 0 after.
 * 2. covers the legacy stream likewise.
 * 3. cost: cuCtxRecordEvent beside one cuStreamQuery per stream, with 64 idle non-blocking
 *    streams (PyTorch's pool), medians of 2000.
 * 4. with a capture under way on another stream: its answer, and the capture's state after.
 * Built and run on the GPU machine: nvcc -o probe ctx_event_probe.cu -lcuda */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__global__ void spin(long long ns) {
    long long t0 = clock64();
    while (clock64() - t0 < ns) {}
}

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}
static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(void) {
    cudaFree(0);
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    CUevent ev;
    cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
    cudaStream_t nb;
    cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
    /* About a second of spinning at ~1.8 GHz. */
    long long cycles = 2000000000LL;

    spin<<<1, 1, 0, nb>>>(cycles);
    int rc = cuCtxRecordEvent(ctx, ev);
    int during = cuEventQuery(ev);
    cudaStreamSynchronize(nb);
    printf("nonblocking_stream record=%d during=%d after=%d\n", rc, during, cuEventQuery(ev));

    spin<<<1, 1, 0, 0>>>(cycles);
    rc = cuCtxRecordEvent(ctx, ev);
    during = cuEventQuery(ev);
    cudaDeviceSynchronize();
    printf("legacy_stream record=%d during=%d after=%d\n", rc, during, cuEventQuery(ev));

    enum { STREAMS = 64, N = 2000 };
    cudaStream_t pool[STREAMS];
    for (int i = 0; i < STREAMS; i++) cudaStreamCreateWithFlags(&pool[i], cudaStreamNonBlocking);
    static double a[N], b[N];
    for (int i = 0; i < N; i++) {
        double t0 = now_ns();
        cuCtxRecordEvent(ctx, ev);
        double t1 = now_ns();
        for (int j = 0; j < STREAMS; j++) cuStreamQuery((CUstream)pool[j]);
        double t2 = now_ns();
        a[i] = t1 - t0;
        b[i] = t2 - t1;
    }
    qsort(a, N, sizeof a[0], cmp);
    qsort(b, N, sizeof b[0], cmp);
    printf("cost_ns ctx_record_event=%.0f stream_queries_64=%.0f\n", a[N / 2], b[N / 2]);

    cudaStream_t cs;
    cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
    cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed);
    spin<<<1, 1, 0, cs>>>(1000);
    rc = cuCtxRecordEvent(ctx, ev);
    cudaStreamCaptureStatus st;
    cudaStreamIsCapturing(cs, &st);
    cudaGraph_t g = NULL;
    int end = cudaStreamEndCapture(cs, &g);
    cudaGetLastError();
    printf("during_capture record=%d capture_status_after=%d end_capture=%d\n", rc, (int)st, end);
    return 0;
}
