/* A program that runs code it wrote into anonymous executable memory, as a JIT does:
 * main -> jit_caller -> the code (a counted loop with a frame-pointer prologue).
 * `jit NAME` also writes its perf map, /tmp/perf-PID.map, naming the code NAME; `jit`
 * alone writes none. It prints the code's address and size, then spins until killed. */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__x86_64__)
static const unsigned char code[] = {
    0x55,                         /* push %rbp */
    0x48, 0x89, 0xe5,             /* mov %rsp,%rbp */
    0xb9, 0xff, 0xff, 0x00, 0x00, /* mov $0xffff,%ecx */
    0xff, 0xc9,                   /* 1: dec %ecx */
    0x75, 0xfc,                   /* jne 1b */
    0x5d,                         /* pop %rbp */
    0xc3,                         /* ret */
};
#elif defined(__aarch64__)
static const unsigned int code[] = {
    0xa9bf7bfd, /* stp x29, x30, [sp, #-16]! */
    0x910003fd, /* mov x29, sp */
    0x529fffe0, /* mov w0, #0xffff */
    0x71000400, /* 1: subs w0, w0, #1 */
    0x54ffffe1, /* b.ne 1b */
    0xa8c17bfd, /* ldp x29, x30, [sp], #16 */
    0xd65f03c0, /* ret */
};
#else
#error "x86-64 or aarch64"
#endif

typedef void (*jitted)(void);

__attribute__((noinline)) void jit_caller(jitted f) {
    for (;;) f();
}

int main(int argc, char **argv) {
    void *mem = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return 2;
    memcpy(mem, code, sizeof code);
    __builtin___clear_cache((char *)mem, (char *)mem + sizeof code);
    if (mprotect(mem, 4096, PROT_READ | PROT_EXEC)) return 3;
    if (argc > 1) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
        FILE *map = fopen(path, "w");
        if (!map) return 4;
        fprintf(map, "%lx %zx %s\n", (unsigned long)mem, sizeof code, argv[1]);
        fclose(map);
    }
    printf("%lx %zx\n", (unsigned long)mem, sizeof code);
    fflush(stdout);
    jit_caller((jitted)mem);
    return 0;
}
