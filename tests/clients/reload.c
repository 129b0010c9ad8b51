/* libcudart closed and opened again at another address (the adversary's row 6): the shim must
 * call the real functions where they now are. Loads the runtime RTLD_LOCAL (as Python does),
 * allocates through it, closes it, fills its old address range with an inaccessible mapping,
 * loads it again and calls cudaMalloc, cudaFree and cudaMemGetInfo. Prints key=value lines. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdint.h>
#include <sys/mman.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <link.h>
#include <string.h>

static size_t lib_span;
static int span_of(struct dl_phdr_info *info, size_t size, void *base) {
    (void)size;
    if ((void *)info->dlpi_addr != base) return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_LOAD) {
            size_t end = info->dlpi_phdr[i].p_vaddr + info->dlpi_phdr[i].p_memsz;
            if (end > lib_span) lib_span = end;
        }
    return 1;
}

typedef int (*malloc_t)(void **, size_t);
typedef int (*free_t)(void *);
typedef int (*info_t)(size_t *, size_t *);

int main(void) {
    void *h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
    if (!h) { printf("load=failed\n"); return 1; }
    malloc_t m = (malloc_t)dlsym(h, "cudaMalloc");
    free_t f = (free_t)dlsym(h, "cudaFree");
    void *p = NULL;
    int first = m(&p, 1 << 20);
    f(p);
    Dl_info info;
    void *real = dlsym(h, "cudaGetDeviceCount"); /* not hooked: the library's own address */
    dladdr(real, &info);
    void *old_base = info.dli_fbase;
    dl_iterate_phdr(span_of, old_base);
    size_t want = (lib_span + 4095) & ~(size_t)4095;
    int closed = dlclose(h);
    Dl_info after;
    int unloaded = dladdr(real, &after) == 0;
    /* The old range, now free, becomes inaccessible memory. */
    /* The whole old image, code included, becomes inaccessible memory. */
    void *block = mmap(old_base, want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    int blocked = block == old_base;
    if (!blocked && getenv("RELOAD_DEBUG")) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "grep -n '' /proc/%d/maps", (int)getpid());
        fprintf(stderr, "old base %p\n", old_base);
        if (system(cmd) != 0) perror("system");
    }
    h = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
    m = (malloc_t)dlsym(h, "cudaMalloc");
    f = (free_t)dlsym(h, "cudaFree");
    info_t i = (info_t)dlsym(h, "cudaMemGetInfo");
    dladdr(dlsym(h, "cudaGetDeviceCount"), &info);
    int moved = info.dli_fbase != old_base;
    size_t fr = 0, to = 0;
    int again = m(&p, 1 << 20);
    int freed = f(p);
    int meminfo = i(&fr, &to);
    printf("first=%d closed=%d unloaded=%d blocked=%d moved=%d again=%d freed=%d meminfo=%d\n", first, closed,
           unloaded, blocked, moved, again, freed, meminfo);
    return 0;
}
