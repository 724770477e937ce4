# A CPU-bound Python program for the profiler's tests: recurses argv[2] calls deep
# through `down`, then spins in `bottom` until it has used argv[1] seconds of CPU.
import sys
import time

sys.setrecursionlimit(10_000)


def bottom(budget):
    s = 0
    while time.process_time() < budget:
        for i in range(20000):
            s += i * i
    return s


def down(n, budget):
    if n == 0:
        return bottom(budget)
    return down(n - 1, budget) + 1


down(int(sys.argv[2]), float(sys.argv[1]))
