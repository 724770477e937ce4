# Two Python threads spinning in functions of their own until the process has used
# argv[1] seconds of CPU: a worker thread in worker -> spin_a, the main thread in
# main -> spin_b. Each sample of a thread must show that thread's own frames.
import sys
import threading
import time


def spin_a(n):
    s = 0
    for i in range(n):
        s += i
    return s


def spin_b(n):
    s = 0
    for i in range(n):
        s -= i
    return s


def worker(budget):
    while time.process_time() < budget:
        spin_a(20000)


def main():
    budget = float(sys.argv[1])
    t = threading.Thread(target=worker, args=(budget,))
    t.start()
    while time.process_time() < budget:
        spin_b(20000)
    t.join()


main()
