# A CPU-bound Python program for the profiler's tests: spins in
# <module> -> main -> Outer.method -> middle -> leaf_work until it has used
# argv[1] seconds of CPU (its own measure, printed at exit).
import sys
import time


def leaf_work(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def middle(n):
    return leaf_work(n) + 1


class Outer:
    def method(self, n):
        return middle(n)


def main():
    budget = float(sys.argv[1])
    o = Outer()
    while time.process_time() < budget:
        o.method(20000)
    print(f"cpu {time.process_time():.3f}")


main()
