/* How long the calling thread has waited runnable on a run queue, in nanoseconds
 * (the second field of /proc/thread-self/schedstat), or -1 where the kernel does not
 * keep it. Shared by the off-CPU fixtures of tests/offcpu.rs and of the VM matrix
 * (xtask/src/vm/fixtures.rs): a wait after a wake-up is part of a sleep as the
 * profiler times it, a preemption while running is not. */
#include <stdio.h>
static long long run_delay_ns(void) {
    unsigned long long cpu = 0, delay = 0;
    FILE *f = fopen("/proc/thread-self/schedstat", "r");
    if (!f) return -1;
    int n = fscanf(f, "%llu %llu", &cpu, &delay);
    fclose(f);
    return n == 2 ? (long long)delay : -1;
}
