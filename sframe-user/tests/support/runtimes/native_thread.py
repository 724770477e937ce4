# A Python process with a thread that never runs Python: argv[1] is a shared library
# whose start_native_thread() starts a thread spinning in C; the main thread spins in
# Python until it has used argv[2] seconds of its own CPU time.
import ctypes
import sys
import time


def spin(budget):
    s = 0
    while time.thread_time() < budget:
        for i in range(1000):
            s += i
    return s


lib = ctypes.CDLL(sys.argv[1])
if lib.start_native_thread() != 0:
    sys.exit(3)
print("ready", flush=True)
spin(float(sys.argv[2]))
