/* A hostile process posing as CPython 3.13 (run as nobody, named python3.13): it exports
 * `_PyRuntime` with a `_Py_DebugOffsets` of its choosing and `Py_Version`, and forges
 * the interpreter state the profiler's kernel side walks: a thread list that is a cycle
 * (a thread not in it makes the walk go round it), and a frame chain that is a cycle of
 * one frame whose code object is an address that holds nothing. Two threads spin. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

__attribute__((used)) const uint32_t Py_Version = 0x030D00F0;

/* Words of _Py_DebugOffsets (see CPython 3.13's pycore_runtime.h); offsets point into
 * this same array, filled with pointers at run time. */
__attribute__((used)) uint64_t _PyRuntime[1024] = {
    [0] = 0x7970677562656478ull, /* "xdebugpy" */
    [1] = 0x030D00F0,
    [2] = 0,          /* not free-threaded */
    [5] = 8 * 200,    /* runtime.interpreters_head: word 200 */
    [9] = 0,          /* interp.threads_head: the interpreter's word 0 */
    [21] = 0,         /* thread.next: word 0 */
    [23] = 8,         /* thread.current_frame: word 1 */
    [25] = 16,        /* thread.native_thread_id: word 2 */
    [29] = 0,         /* frame.previous: word 0 */
    [30] = 8,         /* frame.executable: word 1 */
    [31] = 16,        /* frame.instr_ptr: word 2 */
    [33] = 24,        /* frame.owner: word 3 */
    [43] = 200,       /* code.co_code_adaptive */
};

volatile unsigned long sink;

__attribute__((noinline)) void forged_spin(void) {
    for (;;)
        sink++;
}

static void *other(void *arg) {
    (void)arg;
    forged_spin();
    return 0;
}

int main(void) {
    uint64_t *interp = &_PyRuntime[300];
    uint64_t *a = &_PyRuntime[400], *b = &_PyRuntime[410];
    uint64_t *frame = &_PyRuntime[500];
    _PyRuntime[200] = (uint64_t)interp;
    interp[0] = (uint64_t)a;
    a[0] = (uint64_t)b; /* a -> b -> a: a cycle */
    b[0] = (uint64_t)a;
    a[2] = 0;
    b[2] = (uint64_t)syscall(SYS_gettid);
    b[1] = (uint64_t)frame;
    frame[0] = (uint64_t)frame; /* its own previous */
    frame[1] = 0x414141414140ull; /* a code object nowhere */
    frame[2] = 0x414141414140ull + 260;
    frame[3] = 0;
    pthread_t t;
    pthread_create(&t, 0, other, 0);
    forged_spin();
    return 0;
}
