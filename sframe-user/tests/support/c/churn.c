/* A short-lived program: spins for argv[1] milliseconds of CPU in one of four
 * functions (argv[2] % 4), each reached through main -> run -> work_N; -O2 without
 * frame pointers. Many of them, each its own process, stand for a build's churn. */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

#define WORK(n)                                                   \
    __attribute__((noinline)) void work_##n(double until) {       \
        while (cpu_ms() < until)                                  \
            for (int i = 0; i < 1000; i++) sink += i * (n + 1);   \
    }
WORK(0)
WORK(1)
WORK(2)
WORK(3)

__attribute__((noinline)) void run(int which, double ms) {
    double until = cpu_ms() + ms;
    switch (which & 3) {
    case 0: work_0(until); break;
    case 1: work_1(until); break;
    case 2: work_2(until); break;
    default: work_3(until); break;
    }
    sink++;
}

int main(int argc, char **argv) {
    double ms = argc > 1 ? atof(argv[1]) : 30;
    int which = argc > 2 ? atoi(argv[2]) : 0;
    run(which, ms);
    return (int)(sink & 0);
}
