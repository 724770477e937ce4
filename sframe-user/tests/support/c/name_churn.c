/* A hostile user's program: forks children without end, each naming itself (comm) with
 * a new name — the exporter's markers, quotes, backslashes, newlines and a counter —
 * and spinning in a function 60 frames deep for about 3 ms of CPU. */
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile unsigned long sink;

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

__attribute__((noinline)) void deep(int n, double until) {
    if (n > 0) {
        deep(n - 1, until);
        sink++;
        return;
    }
    while (cpu_ms() < until) sink++;
}

int main(void) {
    static const char *forms[] = {"[other]", "[no frames]", "a\"b", "c\\d", "e\nf", "g;h"};
    for (unsigned long i = 0;; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            char name[16];
            snprintf(name, sizeof name, "%s%lu", forms[i % 6], i);
            prctl(PR_SET_NAME, name);
            deep(60, cpu_ms() + 3);
            _exit(0);
        }
        if (pid > 0) waitpid(pid, NULL, 0);
    }
}
