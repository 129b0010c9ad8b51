/* Two processes exchanging device memory through legacy CUDA IPC, as NCCL's legacy path and
 * torch.multiprocessing do.
 *
 *   ipc [--plain-peer]     exporter: three 4 MiB blocks carved (under a pool) from one freed
 *                          32 MiB allocation, filled with 0x11, 0x22, 0x33; their handles go to
 *                          a peer process (this program again), which checks the contents and
 *                          writes 0x5a at the start of the second; the exporter then checks it.
 *                          --plain-peer starts the peer without LD_PRELOAD.
 *   ipc import H1 H2 H3    the peer (hex handles)
 *   ipc stale              the exporter frees its blocks and allocates again before the peer
 *                          opens the old handles: CUDA refuses them (never the new blocks)
 *   ipc forge              the peer alters a ticket (secret, slot, generation) and opens it
 *   ipc perms              the exporter's ticket table opened to others, then hard-linked
 *   ipc many N             N blocks exported and opened by one peer (no fixed cap)
 *
 * Prints key=value lines; exit status 0 when every check held. */
#define _GNU_SOURCE
#include "cuda_sim.h"

#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* The peer side of the attacks: opens each handle and says what came back. */
static int probe(int n, char **hex, const char *label) {
    for (int i = 0; i < n; i++) {
        cudaIpcMemHandle_t h;
        from_hex(hex[i], &h);
        void *p = NULL;
        int rc = cudaIpcOpenMemHandle(&p, h, 1);
        unsigned char first = 0;
        if (rc == 0) {
            cudaMemcpy(&first, p, 1, 2);
            cudaIpcCloseMemHandle(p);
        }
        printf("%s%d=%d byte%d=%d\n", label, i, rc, i, first);
    }
    return 0;
}

/* Forged variants of one genuine ticket. */
static int forge(char *hex) {
    cudaIpcMemHandle_t h, f;
    from_hex(hex, &h);
    struct { const char *name; int at; } edits[] = {{"forged_secret", 40}, {"forged_slot", 12},
                                                     {"forged_generation", 24}, {"forged_nonce", 16}};
    for (int i = 0; i < 4; i++) {
        f = h;
        f.reserved[edits[i].at] ^= 1;
        void *p = NULL;
        int rc = cudaIpcOpenMemHandle(&p, f, 1);
        if (rc == 0) cudaIpcCloseMemHandle(p);
        printf("%s=%d\n", edits[i].name, rc);
    }
    void *p = NULL;
    int rc = cudaIpcOpenMemHandle(&p, h, 1);
    unsigned char first = 0;
    if (rc == 0) { cudaMemcpy(&first, p, 1, 2); cudaIpcCloseMemHandle(p); }
    printf("genuine=%d genuine_byte=%d\n", rc, first);
    return 0;
}

static int spawn_peer(char **args) {
    pid_t pid;
    fflush(stdout);
    if (posix_spawn(&pid, "/proc/self/exe", NULL, NULL, args, environ) != 0) return -1;
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int export_hex(void *p, char *hex) {
    cudaIpcMemHandle_t h;
    int rc = cudaIpcGetMemHandle(&h, p);
    to_hex(&h, hex);
    return rc;
}

static int stale(void) {
    void *big = NULL, *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    cudaMalloc(&big, 32 * MiB);
    cudaFree(big);
    cudaMalloc(&a, BLOCK);
    cudaMalloc(&b, BLOCK);
    char ha[129], hb[129];
    int ea = export_hex(a, ha), eb = export_hex(b, hb);
    cudaFree(b);
    cudaFree(a);
    /* The next allocations, filled with what a leak would show. */
    cudaMalloc(&c, BLOCK);
    cudaMalloc(&d, BLOCK);
    cudaMemset(c, 0x77, BLOCK);
    cudaMemset(d, 0x77, BLOCK);
    printf("export_real=%d export_ticket=%d\n", ea, eb);
    char *args[] = {"/proc/self/exe", "probe", "stale", ha, hb, NULL};
    int rc = spawn_peer(args);
    cudaFree(c);
    cudaFree(d);
    return rc;
}

/* A block inside a pooled segment (its handle is a ticket under a pool). */
static void carve(void **a, void **b) {
    void *big = NULL;
    cudaMalloc(&big, 32 * MiB);
    cudaFree(big);
    cudaMalloc(a, BLOCK);
    cudaMalloc(b, BLOCK);
}

static int forge_main(void) {
    void *a = NULL, *b = NULL;
    carve(&a, &b);
    cudaMemset(b, 0x42, BLOCK);
    char hb[129];
    printf("export=%d\n", export_hex(b, hb));
    char *args[] = {"/proc/self/exe", "forge", hb, NULL};
    int rc = spawn_peer(args);
    cudaFree(a);
    cudaFree(b);
    return rc;
}

static int perms(void) {
    void *a = NULL, *b = NULL;
    carve(&a, &b);
    cudaMemset(b, 0x42, BLOCK);
    char hb[129];
    printf("export=%d\n", export_hex(b, hb));
    char pattern[128], table[512] = "";
    snprintf(pattern, sizeof pattern, "gpushim-ipc-%u-%d-", (unsigned)getuid(), (int)getpid());
    DIR *dir = opendir("/dev/shm");
    struct dirent *e;
    while (dir && (e = readdir(dir)))
        if (strncmp(e->d_name, pattern, strlen(pattern)) == 0)
            snprintf(table, sizeof table, "/dev/shm/%s", e->d_name);
    if (dir) closedir(dir);
    struct stat st;
    printf("table_found=%d table_mode=%o\n", table[0] != 0, table[0] && stat(table, &st) == 0 ? st.st_mode & 0777 : 0);
    char *args[] = {"/proc/self/exe", "probe", "open", hb, NULL};
    chmod(table, 0666);
    args[2] = "world_readable";
    spawn_peer(args);
    chmod(table, 0600);
    char link_path[600];
    snprintf(link_path, sizeof link_path, "%s.lnk", table);
    if (link(table, link_path) != 0) perror("link");
    args[2] = "hardlinked";
    spawn_peer(args);
    unlink(link_path);
    args[2] = "private";
    spawn_peer(args);
    cudaFree(a);
    cudaFree(b);
    return 0;
}

static int many(int n, int plain) {
    char path[] = "/tmp/gpushim-ipc-many-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    void **blk = calloc((size_t)n, sizeof *blk);
    for (int i = 0; i < n; i++) cudaMalloc(&blk[i], 65536);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        char hex[129];
        bad += export_hex(blk[i], hex) != 0;
        fprintf(f, "%s\n", hex);
    }
    fclose(f);
    printf("exported=%d failed_exports=%d\n", n, bad);
    if (plain) unsetenv("LD_PRELOAD");
    char *args[] = {"/proc/self/exe", "open-file", path, NULL};
    spawn_peer(args);
    unlink(path);
    for (int i = 0; i < n; i++) cudaFree(blk[i]);
    free(blk);
    return 0;
}

static int open_file(const char *path) {
    FILE *f = fopen(path, "r");
    char line[256];
    int n = 0, failed = 0;
    void *ps[8192];
    while (f && fgets(line, sizeof line, f) && n < 8192) {
        cudaIpcMemHandle_t h;
        from_hex(line, &h);
        ps[n] = NULL;
        int rc = cudaIpcOpenMemHandle(&ps[n], h, 1);
        failed += rc != 0;
        n++;
    }
    int close_failed = 0;
    for (int i = 0; i < n; i++)
        if (ps[i]) close_failed += cudaIpcCloseMemHandle(ps[i]) != 0;
    printf("opened=%d failed_opens=%d failed_closes=%d\n", n, failed, close_failed);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "import") == 0) return peer(argv + 2);
    if (argc >= 3 && strcmp(argv[1], "probe") == 0) return probe(argc - 3, argv + 3, argv[2]);
    if (argc == 3 && strcmp(argv[1], "forge") == 0) return forge(argv[2]);
    if (argc == 3 && strcmp(argv[1], "open-file") == 0) return open_file(argv[2]);
    if (argc == 2 && strcmp(argv[1], "stale") == 0) return stale();
    if (argc == 2 && strcmp(argv[1], "forge") == 0) return forge_main();
    if (argc == 2 && strcmp(argv[1], "perms") == 0) return perms();
    if (argc >= 3 && strcmp(argv[1], "many") == 0) return many(atoi(argv[2]), argc > 3);
    int plain = argc > 1 && strcmp(argv[1], "--plain-peer") == 0;

    void *big = NULL, *blk[3] = { 0 };
    if (cudaMalloc(&big, 32 * MiB) || cudaFree(big)) return 2;
    const unsigned char fill[3] = { 0x11, 0x22, 0x33 };
    char hex[3][129];
    /* All three first: an export seals its segment (nothing more is cut from it). */
    for (int i = 0; i < 3; i++)
        if (cudaMalloc(&blk[i], BLOCK) || cudaMemset(blk[i], fill[i], BLOCK)) return 2;
    for (int i = 0; i < 3; i++) {
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
