/* What real CUDA answers, during a stream capture, to the calls the shim's pool would make on a
 * program's behalf: frees of pointers CUDA does not own (host, null, interior), the capture-mode
 * exchange, and which of them invalidate the capture. Prints one line per probe:
 *   probe mode thread rc end_rc last_error
 * Built and run on the GPU machine: nvcc -o probe capture_probe.cu -lcuda. */
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static cudaStream_t s;
static const char *probe_name;
static int probe_id;
static int rc_seen;

static int do_probe(int id) {
    static char host[64];
    void *p = NULL;
    CUdeviceptr d = 0;
    switch (id) {
    case 0: return cudaFree(host);
    case 1: return cudaFree(NULL);
    case 2: return cudaMalloc(&p, 0);
    case 3: return cuMemFree((CUdeviceptr)(uintptr_t)host);
    case 4: return cuMemFree(0);
    case 5: { cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
              int r = cudaThreadExchangeStreamCaptureMode(&m);
              cudaThreadExchangeStreamCaptureMode(&m); return r; }
    case 6: { CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
              int r = cuThreadExchangeStreamCaptureMode(&m);
              cuThreadExchangeStreamCaptureMode(&m); return r; }
    case 7: return cuMemAlloc(&d, 0);
    case 8: { int r = cudaMalloc(&p, 1 << 20); if (r == 0) { int m = cudaStreamCaptureModeRelaxed;
              cudaThreadExchangeStreamCaptureMode((cudaStreamCaptureMode *)&m);
              cudaFree(p); cudaThreadExchangeStreamCaptureMode((cudaStreamCaptureMode *)&m);} return r; }
    }
    return -1;
}
static const char *names[] = {"cudaFree(host)", "cudaFree(NULL)", "cudaMalloc(0)", "cuMemFree(host)",
                              "cuMemFree(0)", "cudaThreadExchangeStreamCaptureMode", "cuThreadExchangeStreamCaptureMode",
                              "cuMemAlloc(0)", "cudaMalloc(1MiB)"};

static void *other(void *arg) { (void)arg; rc_seen = do_probe(probe_id); return NULL; }

__global__ void k(int *x) { if (x) *x = 1; }

int main(void) {
    cudaFree(0);
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    const cudaStreamCaptureMode modes[] = {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal,
                                           cudaStreamCaptureModeRelaxed};
    const char *mname[] = {"global", "thread_local", "relaxed"};
    for (int id = 0; id < 9; id++)
        for (int m = 0; m < 3; m++)
            for (int th = 0; th < 2; th++) {
                probe_id = id; probe_name = names[id];
                cudaGetLastError();
                cudaStreamBeginCapture(s, modes[m]);
                k<<<1, 1, 0, s>>>(NULL);
                if (th) { pthread_t t; pthread_create(&t, NULL, other, NULL); pthread_join(t, NULL); }
                else rc_seen = do_probe(id);
                k<<<1, 1, 0, s>>>(NULL);
                cudaGraph_t g = NULL;
                int end = cudaStreamEndCapture(s, &g);
                int last = cudaGetLastError();
                if (g) cudaGraphDestroy(g);
                printf("%-36s %-12s %-6s rc=%d end=%d last=%d\n", names[id], mname[m], th ? "other" : "same",
                       rc_seen, end, last);
                cudaDeviceSynchronize();
                cudaGetLastError();
            }
    return 0;
}
