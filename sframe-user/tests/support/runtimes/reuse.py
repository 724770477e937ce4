# A Python program whose code object's address is reused: it spins in `transient`
# (compiled by exec) for argv[1] seconds of CPU, frees it, compiles `lasting` until
# its code object gets the same address, and spins in it for argv[2] seconds.
# Prints "reused ADDR" (or exits 3 when the address never came back).
import gc
import sys
import time

SOURCE = """
def {name}(budget):
    s = 0
    while time.process_time() < budget:
        for i in range(2000):
            s += i
    return s
"""


def compiled(name):
    ns = {"time": time}
    exec(SOURCE.format(name=name), ns)
    return ns[name]


transient = compiled("transient")
addr = id(transient.__code__)
transient(float(sys.argv[1]))
del transient
gc.collect()
for _ in range(10000):
    lasting = compiled("lasting")
    if id(lasting.__code__) == addr:
        break
    del lasting
else:
    sys.exit(3)
print(f"reused {addr:#x}", flush=True)
lasting(time.process_time() + float(sys.argv[2]))
