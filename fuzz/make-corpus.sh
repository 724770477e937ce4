#!/bin/sh
# Seed corpus for the sframe_read target, generated (not committed): the test vectors
# from ../shared/sframe-vectors, the .sframe sections of binaries built with
# gcc -Wa,--gsframe, and hand-built big-endian, s390x and FLEX-heavy sections (below).
# Each seed is 8 bytes of section address (LE) + section bytes.
set -eu
cd "$(dirname "$0")"
out=corpus/sframe_read
mkdir -p "$out"
vectors=../../shared/sframe-vectors
if [ -d "$vectors" ]; then
  python3 - "$vectors" "$out" <<'PY'
import json, os, struct, sys
src, out = sys.argv[1], sys.argv[2]
for name in sorted(os.listdir(src)):
    if not name.endswith(".json"):
        continue
    d = json.load(open(os.path.join(src, name)))
    data = struct.pack("<Q", d["section_base"]) + bytes(d["content"])
    open(os.path.join(out, name[:-5]), "wb").write(data)
PY
fi
if command -v gcc >/dev/null && command -v objcopy >/dev/null; then
  tmp=$(mktemp -d)
  printf 'int f(int x){return x*2;}\nint main(int c,char**v){return f(c)+__builtin_strlen(v[0]);}\n' > "$tmp/m.c"
  for flags in -O0 -O2 "-O2 -fomit-frame-pointer" "-O2 -shared -fPIC"; do
    tag=$(echo "$flags" | tr -d ' -')
    # shellcheck disable=SC2086
    gcc $flags -Wa,--gsframe "$tmp/m.c" -o "$tmp/bin" 2>/dev/null || continue
    addr=$(readelf -SW "$tmp/bin" | awk '$2==".sframe"{print $4} $3==".sframe"{print $5}' | head -1)
    objcopy -O binary --only-section=.sframe "$tmp/bin" "$tmp/sf"
    python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<Q', int('$addr',16)) + open('$tmp/sf','rb').read())" > "$out/gcc-$tag"
  done
  rm -rf "$tmp"
fi
# Hand-built sections for shapes neither source has: big-endian (AArch64 BE, s390x with
# its CFA and register encodings), FLEX-heavy v3 (every control-word form, all word
# widths, functions long enough for lookup checkpoints), signal frames, pointer
# authentication key B, a fixed FP offset. Laid out from the binutils SFrame spec.
python3 - "$out" <<'PY'
import os, struct, sys
out = sys.argv[1]
AARCH64_BE, AARCH64_LE, AMD64, S390X = 1, 2, 3, 4
SORTED, PCREL = 1, 4
CTL = 1 << 40  # marks an unsigned FLEX control word

def ctl(reg, deref=False):
    return CTL | (reg << 3) | (int(deref) << 1) | 1

def ctl_cfa(deref=True):
    return CTL | (int(deref) << 1)

def wsize(words):
    for size, bits in ((1, 8), (2, 16), (4, 32)):
        if all((w - CTL < (1 << bits)) if w >= CTL else (-(1 << (bits - 1)) <= w < (1 << (bits - 1)))
               for w in words):
            return size
    return 4

def section(version, abi, funcs, vaddr=0x2000, fixed_fp=0, fixed_ra=None, flags=None):
    """funcs: (start, size, info_bits, flex, [(start, base_sp, mangled, [words])])"""
    be = abi in (AARCH64_BE, S390X)
    e = ">" if be else "<"
    if fixed_ra is None:
        fixed_ra = -8 if abi == AMD64 else 0
    if flags is None:
        flags = SORTED | (PCREL if version > 1 else 0)
    fde_size = {1: 17, 2: 20, 3: 16}[version]
    fres_start = 28 + len(funcs) * fde_size
    fres, data, nfres = b"", [], 0
    for start, size, info_bits, flex, rows in funcs:
        fre_type = 0 if size < 0x100 else 1 if size < 0x10000 else 2
        data.append(len(fres))
        if version == 3:
            fres += struct.pack(e + "HBBB", len(rows), info_bits | fre_type, int(flex), 0)
        for rstart, base_sp, mangled, words in rows:
            aw = (1, 2, 4)[fre_type]
            fres += rstart.to_bytes(aw, "big" if be else "little")
            ws = wsize(words)
            code = {1: 0, 2: 1, 4: 2}[ws]
            fres += bytes([int(base_sp) | (len(words) << 1) | (code << 5) | (0x80 if mangled else 0)])
            for w in words:
                w = w - CTL if w >= CTL else w
                fres += (w & ((1 << (8 * ws)) - 1)).to_bytes(ws, "big" if be else "little")
            nfres += 1
    hdr = struct.pack(e + "HBBBbbBIIIII", 0xDEE2, version, flags, abi, fixed_fp, fixed_ra, 0,
                      len(funcs), nfres, len(fres), 0, len(funcs) * fde_size)
    fdes = b""
    for k, (start, size, info_bits, flex, rows) in enumerate(funcs):
        fre_type = 0 if size < 0x100 else 1 if size < 0x10000 else 2
        off = 28 + k * fde_size
        rel = start - (vaddr + off if flags & PCREL else vaddr)
        if version == 3:
            fdes += struct.pack(e + "qII", rel, size, data[k])
        else:
            fdes += struct.pack(e + "iIIIB", rel, size, data[k], len(rows), info_bits | fre_type)
            if version == 2:
                fdes += b"\0\0\0"
    return struct.pack("<Q", vaddr) + hdr + fdes + fres

def write(name, seed):
    open(os.path.join(out, "handbuilt-" + name), "wb").write(seed)

# s390x v2: CFA stored as (off - 160) / 8; odd RA/FP words 2N+1 = register N; RA 0 = padding.
s390x_rows = [(0, True, False, [0]), (6, True, False, [20, -48, -72]),
              (0x10, False, False, [20, 49, 51]), (0x20, True, False, [20, 0, -80]),
              (0x30, True, False, [])]
s390x_long = [(0, True, False, [-1]), (0x104, True, False, [1000, 1, -4000])]
write("s390x-v2", section(2, S390X, [(0x1000, 0x40, 0, False, s390x_rows),
                                     (0x1100, 0x200, 0, False, s390x_long)]))
sp, fp = ctl(15), ctl(11)
write("s390x-v3-flex", section(3, S390X, [
    (0x1000, 0x40, 0, True, [(0, True, False, [sp, 0]),
                             (6, True, False, [sp, 20, ctl_cfa(), -48, ctl_cfa(), -72]),
                             (0x10, False, False, [fp, 20, ctl(24), 0, ctl(25), 0]),
                             (0x20, True, False, [sp, 20, 0, ctl_cfa(), -80]),
                             (0x30, True, False, [])]),
    (0x1100, 0x200, 0, False, [(0, True, False, [2, -48]), (0x10, True, False, [40, -8, -16])])]))

# AArch64, both byte orders, v2 and v3: signed RAs with key B, FLEX rows.
for abi, tag in ((AARCH64_BE, "be"), (AARCH64_LE, "le")):
    default = [(0, True, False, [0]), (4, True, True, [16, -8, -16]),
               (8, False, True, [16, -8, -16]), (0xc, True, False, [0])]
    write("aarch64%s-v2-keyb" % tag, section(2, abi, [(0x1000, 0x20, 0x20, False, default),
                                                      (0x1020, 0x20, 0, False, default)]))
    flex = [(0, True, True, [ctl(31), 16, 0, ctl_cfa(), -16]),
            (4, False, True, [ctl(29), 16, ctl_cfa(), -8, ctl_cfa(), -16]),
            (8, True, False, [ctl(31), 0, ctl(30), 0]),
            (0xc, True, False, [ctl(29, True), 0x1234, ctl(30, True), -0x12345]),
            (0x10, True, False, [])]
    write("aarch64%s-v3-flex-keyb" % tag, section(3, abi, [(0x1000, 0x20, 0x20, True, flex),
                                                           (0x1020, 0x20, 0x20, False, default)]))

# AMD64 v3, FLEX-heavy: every control-word form, 1/2/4-byte words, 40-row functions
# (lookup checkpoints every 16 rows), signal frames, a DEFAULT function between.
forms = [[ctl(7), 8], [ctl(10), 0, 0, ctl(6, True), 0], [ctl(6, True), -8, 0, ctl(6, True), 0],
         [ctl(7), 16, ctl(3), 0], [ctl(7), 16, ctl(6, True), 8],
         [ctl(7), 24, ctl_cfa(), -16, ctl_cfa(), -24], [ctl(7), 4000], [ctl(7), 0x12345], []]
funcs, pc = [], 0x1000
for f in range(12):
    n = 40 if f % 3 == 0 else 1 + f
    rows = [(4 * i, True, False, forms[(i + f) % len(forms)]) for i in range(n)]
    info = 0x80 if f % 4 == 1 else 0
    funcs.append((pc, 4 * n + 4, info, True, rows))
    pc += 4 * n + 16
    funcs.append((pc, 0x10, info, False, [(0, True, False, [8]), (1, False, False, [16, -16])]))
    pc += 0x10
write("amd64-v3-flex-heavy", section(3, AMD64, funcs))
# A fixed FP offset in the header (DEFAULT and FLEX rows).
write("amd64-v3-fixed-fp", section(3, AMD64, [
    (0x1000, 0x20, 0, False, [(0, True, False, [8]), (1, False, False, [16]), (0x10, True, False, [])]),
    (0x1020, 0x10, 0, True, [(0, True, False, [ctl(10), 0])])], fixed_fp=-16))
PY
echo "seeds: $(ls "$out" | wc -l) in $out"
