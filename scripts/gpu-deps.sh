#!/usr/bin/env bash
# Gathers what the build needs from Debian's packages into one folder, for a
# machine that has CMake, a C++ compiler, nvcc and PyTorch's NCCL wheel but no
# Debian packages (the GPU machine): the Boost headers that muster's sources
# actually include (found by the compiler from build/compile_commands.json),
# nlohmann/json, CLI11, Catch2 and OpenSSL's libcrypto, and their CMake package files in the same
# layout as here, so that `-D<Pkg>_DIR=...` finds them. scripts/gpu-check.sh
# builds against it.
#   scripts/gpu-deps.sh [OUT_DIR]     (default: .gpu-deps; needs scripts/build.sh first)
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-.gpu-deps}")
db=build/compile_commands.json
[ -f "$db" ] || { echo "gpu-deps: $db is missing: run scripts/build.sh first" >&2; exit 1; }
rm -rf "$out.tmp"
mkdir -p "$out.tmp/include"
# Every header under /usr/include/boost that some translation unit includes.
python3 - "$db" "$out.tmp/boost-headers.txt" <<'PY'
import json, shlex, subprocess, sys
db, listing = sys.argv[1], sys.argv[2]
headers = set()
for entry in json.load(open(db)):
    args = entry.get("arguments") or shlex.split(entry["command"])
    # Keep the compiler, the flags that change what is included, and the source.
    keep = [args[0]]
    i = 1
    while i < len(args):
        a = args[i]
        if a in ("-o", "-c"):
            i += 2 if a == "-o" else 1
            continue
        if a.startswith(("-I", "-D", "-std", "-isystem", "-include")):
            keep.append(a)
            if a in ("-I", "-D", "-isystem", "-include"):
                keep.append(args[i + 1])
                i += 1
        i += 1
    keep += ["-M", entry["file"]]
    r = subprocess.run(keep, cwd=entry["directory"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"gpu-deps: could not list the includes of {entry['file']}:\n{r.stderr[-2000:]}")
    for word in r.stdout.replace("\\\n", " ").split():
        if word.startswith("/usr/include/boost/"):
            headers.add(word)
open(listing, "w").write("\n".join(sorted(headers)) + "\n")
print(f"gpu-deps: {len(headers)} Boost headers")
PY
(cd /usr/include && sed 's|^/usr/include/||' "$out.tmp/boost-headers.txt" | xargs cp --parents -t "$out.tmp/include")
# Whole, in case another compiler's configuration picks other headers in them.
(cd /usr/include && cp -r --parents boost/config boost/asio boost/system boost/predef boost/core boost/align \
  boost/assert "$out.tmp/include")
cp -r /usr/include/nlohmann /usr/include/CLI /usr/include/catch2 "$out.tmp/include/"
# The CMake package files, at the same paths relative to the include folder.
for d in /usr/lib/x86_64-linux-gnu/cmake/Boost-1.81.0 /usr/lib/x86_64-linux-gnu/cmake/boost_headers-1.81.0 \
         /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 /usr/lib/cmake/Catch2; do
  [ -d "$d" ] || { echo "gpu-deps: $d is missing (scripts/install-deps.sh installs it)" >&2; exit 1; }
  mkdir -p "$out.tmp/$(dirname "${d#/usr/}")"
  cp -r "$d" "$out.tmp/$(dirname "${d#/usr/}")/"
done
# Catch2's package names its main() library.
cp /usr/lib/libCatch2WithMain.a "$out.tmp/lib/"
# OpenSSL's libcrypto (the rendezvous's HMAC): headers, its configuration
# header and the library, found by CMake's FindOpenSSL with OPENSSL_ROOT_DIR.
cp -r /usr/include/openssl "$out.tmp/include/"
cp /usr/include/x86_64-linux-gnu/openssl/*.h "$out.tmp/include/openssl/"
mkdir -p "$out.tmp/lib/ossl"
cp -L /usr/lib/x86_64-linux-gnu/libcrypto.so.3 "$out.tmp/lib/ossl/"
ln -s libcrypto.so.3 "$out.tmp/lib/ossl/libcrypto.so"
rm -rf "$out"
mv "$out.tmp" "$out"
du -sh "$out" | sed 's/^/gpu-deps: /'
