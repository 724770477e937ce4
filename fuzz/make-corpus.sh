#!/bin/sh
# Seed corpus for the sframe_read target, generated (not committed): the test vectors
# from ../shared/sframe-vectors and the .sframe sections of binaries built with
# gcc -Wa,--gsframe. Each seed is 8 bytes of section address (LE) + section bytes.
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
echo "seeds: $(ls "$out" | wc -l) in $out"
