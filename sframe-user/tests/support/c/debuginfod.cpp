// A C++ program built without frame pointers and then stripped (tests/debuginfod.rs):
// its frames can be named only from its separate debug file.
#include <cstdlib>
#include <ctime>

volatile unsigned long sink;

static double cpu_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

namespace fixture {
struct Worker {
    __attribute__((noinline)) void spin_leaf();
    __attribute__((noinline)) void spin_middle();
};

void Worker::spin_leaf() {
    for (int i = 0; i < 200000; i++) sink += i;  // SPIN_LEAF_LINE
}

void Worker::spin_middle() {
    spin_leaf();
    sink ^= 1;
}
}  // namespace fixture

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 1.0;
    double end = cpu_seconds() + seconds;
    fixture::Worker w;
    while (cpu_seconds() < end) w.spin_middle();
    return 0;
}
