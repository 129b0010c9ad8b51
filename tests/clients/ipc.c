/* Two processes exchanging device memory through legacy CUDA IPC, as NCCL's legacy path and
 * torch.multiprocessing do.
 *
 *   ipc [--plain-peer]     exporter: three 4 MiB blocks carved (under a pool) from one freed
 *                          32 MiB allocation, filled with 0x11, 0x22, 0x33; their handles go to
 *                          a peer process (this program again), which checks the contents and
 *                          writes 0x5a at the start of the second; the exporter then checks it.
 *                          --plain-peer starts the peer without LD_PRELOAD.
 *   ipc import H1 H2 H3    the peer (hex handles)
 *
 * Prints key=value lines; exit status 0 when every check held. */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define MiB (1u << 20)
#define BLOCK (4 * MiB)

extern char **environ;

static void to_hex(const cudaIpcMemHandle_t *h, char *out) {
    for (int i = 0; i < 64; i++) sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static void from_hex(const char *s, cudaIpcMemHandle_t *h) {
    for (int i = 0; i < 64; i++) {
        unsigned v = 0;
        sscanf(s + 2 * i, "%2x", &v);
        h->reserved[i] = (char)v;
    }
}

static int peer(char **hex) {
    const unsigned char want[3] = { 0x11, 0x22, 0x33 };
    void *p[3] = { 0 };
    int ok = 1;
    for (int i = 0; i < 3; i++) {
        cudaIpcMemHandle_t h;
        from_hex(hex[i], &h);
        int rc = cudaIpcOpenMemHandle(&p[i], h, 1 /* cudaIpcMemLazyEnablePeerAccess */);
        unsigned char first = 0, last = 0;
        if (rc == 0) {
            cudaMemcpy(&first, p[i], 1, 2);
            cudaMemcpy(&last, (char *)p[i] + BLOCK - 1, 1, 2);
        }
        int good = rc == 0 && first == want[i] && last == want[i];
        printf("open%d=%d contents%d=%s\n", i, rc, i, rc ? "none" : good ? "right" : "WRONG");
        ok &= good;
    }
    if (p[1]) cudaMemset(p[1], 0x5a, 1);
    for (int i = 0; i < 3; i++)
        if (p[i]) printf("close%d=%d\n", i, cudaIpcCloseMemHandle(p[i]));
    fflush(stdout);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "import") == 0) return peer(argv + 2);
    int plain = argc > 1 && strcmp(argv[1], "--plain-peer") == 0;

    void *big = NULL, *blk[3] = { 0 };
    if (cudaMalloc(&big, 32 * MiB) || cudaFree(big)) return 2;
    const unsigned char fill[3] = { 0x11, 0x22, 0x33 };
    char hex[3][129];
    for (int i = 0; i < 3; i++) {
        if (cudaMalloc(&blk[i], BLOCK) || cudaMemset(blk[i], fill[i], BLOCK)) return 2;
        cudaIpcMemHandle_t h;
        int rc = cudaIpcGetMemHandle(&h, blk[i]);
        printf("export%d=%d ticket%d=%d\n", i, rc, i, memcmp(h.reserved, "gpushim", 7) == 0);
        if (rc) return 3;
        to_hex(&h, hex[i]);
    }
    fflush(stdout);

    if (plain) unsetenv("LD_PRELOAD");
    char *args[] = { "/proc/self/exe", "import", hex[0], hex[1], hex[2], NULL };
    pid_t pid;
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, args, environ) != 0) return 4;
    int status = 0;
    waitpid(pid, &status, 0);
    int peer_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;

    unsigned char got[3] = { 0 };
    for (int i = 0; i < 3; i++) cudaMemcpy(&got[i], blk[i], 1, 2);
    printf("peer_ok=%d peer_wrote=%d others_intact=%d\n", peer_ok, got[1] == 0x5a,
           got[0] == 0x11 && got[2] == 0x33);
    for (int i = 0; i < 3; i++) cudaFree(blk[i]);
    return 0;
}
