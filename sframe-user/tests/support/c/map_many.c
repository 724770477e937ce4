/* `map_many SECONDS FILE...`: maps every FILE executable (PROT_READ | PROT_EXEC), says
 * "mapped" on its standard output, then spins for SECONDS of CPU time: an attacker whose
 * forged objects each carry a build-id of their own (tests/debuginfod.rs). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

volatile unsigned long sink;

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) return 3;
    for (int i = 2; i < argc; i++) {
        struct stat st;
        int fd = open(argv[i], O_RDONLY);
        if (fd < 0 || fstat(fd, &st) != 0) return 1;
        if (mmap(NULL, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED)
            return 2;
        close(fd);
    }
    puts("mapped");
    fflush(stdout);
    double end = cpu_seconds() + atof(argv[1]);
    while (cpu_seconds() < end)
        for (int i = 0; i < 100000; i++) sink++;
    return 0;
}
