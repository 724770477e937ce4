# Off-CPU time in a known Python chain: <module> -> main -> waiter -> wait_short, which
# sleeps 10 ms at a time for about argv[1] seconds in all; prints the seconds it slept
# by its own measure.
import sys
import time


def wait_short():
    time.sleep(0.01)


def waiter(total):
    slept = 0.0
    while slept < total:
        t = time.perf_counter()
        wait_short()
        slept += time.perf_counter() - t
    return slept


def main():
    print(f"slept {waiter(float(sys.argv[1])):.6f}")


main()
