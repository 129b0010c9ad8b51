/* Loads liblocal.so RTLD_LOCAL (this program does not link libcudart) and calls it. */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: load_local PATH/liblocal.so\n"); return 2; }
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    int (*f)(void) = (int (*)(void))dlsym(h, "local_roundtrip");
    if (!f) { fprintf(stderr, "dlsym: %s\n", dlerror()); return 2; }
    int r = f();
    printf("local_roundtrip %d\n", r);
    return r;
}
