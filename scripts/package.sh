#!/usr/bin/env bash
# Builds the Debian packages: muster, libmuster0, libmuster-dev and their
# -dbgsym packages (packaging/README.md).
#   scripts/package.sh [OUTPUT_DIR]      (default: build-deb/packages)
# A build of its own (MUSTER_PACKAGE_BUILD_DIR, default build-deb/: prefix /usr,
# so libraries go to Debian's multiarch folder; RelWithDebInfo, whose symbols
# go to the -dbgsym packages; no tests, benches or examples; the NCCL backend
# off unless MUSTER_PACKAGE_CUDA=auto, since a package must not link a pip
# wheel's NCCL). OUTPUT_DIR keeps whatever else it holds: only the packages
# this script writes there are replaced.
. "$(dirname "$0")/lib/help.sh"
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/../build-deb/packages}")
cd "$(dirname "$0")/.."
build=$(realpath -m "${MUSTER_PACKAGE_BUILD_DIR:-build-deb}")
cmake=$(command -v /usr/bin/cmake || command -v cmake)
cpack=$(command -v /usr/bin/cpack || command -v cpack)
# The changelog's date: the commit's, so a rebuild of one commit gives the same files.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
"$cmake" -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr -DMUSTER_DEB_PACKAGE=ON \
  -DMUSTER_BUILD_TESTS=OFF -DMUSTER_WITH_CUDA="${MUSTER_PACKAGE_CUDA:-OFF}" \
  -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON > /dev/null
"$cmake" --build "$build" -j "${MUSTER_JOBS:-2}" --target muster musterd musterctl muster_runtime man_pages_written

mkdir -p "$out"
work=$(mktemp -d "$out/.package.XXXXXX")
trap 'rm -rf "$work"' EXIT
(cd "$build" && "$cpack" -G DEB -B "$work/cpack" > "$work/cpack.log") || { cat "$work/cpack.log" >&2; exit 1; }

# Finishing touches, as debhelper would leave them: shared libraries and split
# debug symbols are not executable (CMake and objcopy keep the bit); a -dbgsym
# package's doc folder is a link to its package's, which has the copyright and
# changelog; md5sums list every file by its path in the package (CPack writes
# absolute build paths into the -dbgsym ones).
for pkg in "$work"/cpack/*.deb "$work"/cpack/*.ddeb; do
  tree="$work/tree"
  rm -rf "$tree"
  dpkg-deb -R "$pkg" "$tree"
  find "$tree/usr" -type f \( -name '*.so.*' -o -name '*.debug' \) -exec chmod 0644 {} +
  name=$(dpkg-deb -f "$pkg" Package)
  if [ "${name%-dbgsym}" != "$name" ]; then
    mkdir -p "$tree/usr/share/doc"
    ln -s "${name%-dbgsym}" "$tree/usr/share/doc/$name"
  fi
  (cd "$tree" && find usr -type f -printf '%P\n' | sort | sed 's#^#usr/#' | xargs -r md5sum) > "$tree/DEBIAN/md5sums"
  dpkg-deb --root-owner-group -Zxz -b "$tree" "$out/$(basename "$pkg")" > /dev/null
  echo "$out/$(basename "$pkg")"
done
