#!/usr/bin/env bash
# Builds the Debian packages into build-deb/packages/: muster, libmuster0,
# libmuster-dev and their -dbgsym packages (packaging/README.md).
#   scripts/package.sh [OUTPUT_DIR]
# A build of its own (build-deb/: prefix /usr, so libraries go to Debian's
# multiarch folder; RelWithDebInfo, whose symbols go to the -dbgsym packages;
# no tests, benches or examples; the NCCL backend off unless
# MUSTER_PACKAGE_CUDA=auto, since a package must not link a pip wheel's NCCL).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build-deb/packages}
cmake=$(command -v /usr/bin/cmake || command -v cmake)
cpack=$(command -v /usr/bin/cpack || command -v cpack)
# The changelog's date: the commit's, so a rebuild of one commit gives the same files.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
"$cmake" -S . -B build-deb -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX=/usr -DMUSTER_DEB_PACKAGE=ON \
  -DMUSTER_BUILD_TESTS=OFF -DMUSTER_WITH_CUDA="${MUSTER_PACKAGE_CUDA:-OFF}" \
  -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON > /dev/null
"$cmake" --build build-deb -j "${MUSTER_JOBS:-2}" --target muster musterd musterctl muster_runtime man_pages_written
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd build-deb && "$cpack" -G DEB -B "$out/.cpack" > "$out/cpack.log") || { cat "$out/cpack.log" >&2; exit 1; }
mv "$out"/.cpack/*.deb "$out"/.cpack/*.ddeb "$out"/
rm -rf "$out/.cpack"
# Finishing touches, as debhelper would leave them: shared libraries and split
# debug symbols are not executable (CMake and objcopy keep the bit); a -dbgsym
# package's doc folder is a link to its package's, which has the copyright and
# changelog; md5sums list every file by its path in the package (CPack writes
# absolute build paths into the -dbgsym ones).
for pkg in "$out"/*.deb "$out"/*.ddeb; do
  tree=$(mktemp -d)
  dpkg-deb -R "$pkg" "$tree"
  find "$tree/usr" -type f \( -name '*.so.*' -o -name '*.debug' \) -exec chmod 0644 {} +
  name=$(dpkg-deb -f "$pkg" Package)
  if [ "${name%-dbgsym}" != "$name" ]; then
    mkdir -p "$tree/usr/share/doc"
    ln -s "${name%-dbgsym}" "$tree/usr/share/doc/$name"
  fi
  (cd "$tree" && find usr -type f -printf '%P\n' | sort | sed 's#^#usr/#' | xargs -r md5sum) > "$tree/DEBIAN/md5sums"
  dpkg-deb --root-owner-group -Zxz -b "$tree" "$pkg" > /dev/null
  rm -rf "$tree"
done
ls -1 "$out"/*.deb "$out"/*.ddeb 2>/dev/null
