# Python frames that are not plain calls, until the process has used argv[1] seconds
# of CPU: a coroutine chain run by asyncio (main -> asyncio.run -> ... -> outer_coro ->
# inner_coro -> spin_c) and a generator (gen_values) consumed by a loop.
import asyncio
import sys
import time


def spin_c(n):
    s = 0
    for i in range(n):
        s += i
    return s


def gen_values(n):
    for i in range(n):
        yield spin_c(200) + i


async def inner_coro():
    spin_c(20000)
    await asyncio.sleep(0)


async def outer_coro(budget):
    while time.process_time() < budget:
        await inner_coro()
        for _ in gen_values(50):
            pass


def main():
    asyncio.run(outer_coro(float(sys.argv[1])))


main()
