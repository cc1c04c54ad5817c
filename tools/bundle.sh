#!/usr/bin/env bash
# Portable release archive: the installed tree of a build (binaries, stage
# plugins, models, configs, sample media, license) plus every shared library
# it needs that is not part of glibc, the C++ runtime or the GPU driver. Each
# ELF file finds its libraries through an $ORIGIN run path, so the unpacked
# tree runs from any folder on a Linux with glibc >= the build host's (2.36 on
# Debian 12), without LD_LIBRARY_PATH.
#   tools/bundle.sh [BUILDDIR [OUTDIR]]
# BUILDDIR defaults to build; OUTDIR to spindle-VERSION-linux-ARCH. Writes
# OUTDIR/ and OUTDIR.tar.gz. Needs patchelf.
set -euo pipefail
builddir=${1:-build}
[ -f "$builddir/meson-private/coredata.dat" ] || { echo "bundle: $builddir is not a meson build folder" >&2; exit 2; }
command -v patchelf >/dev/null || { echo "bundle: patchelf not found (Debian package patchelf)" >&2; exit 2; }
opts=$(meson introspect --buildoptions "$builddir")
opt() { python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == sys.argv[1]))' "$1" <<<"$opts"; }
prefix=$(opt prefix); libdir=$(opt libdir)
version=$(meson introspect --projectinfo "$builddir" | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')
out=${2:-spindle-$version-linux-$(uname -m)}
out=$(mkdir -p "$out" && cd "$out" && pwd)
rm -rf "${out:?}"/*

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C "$builddir" --no-rebuild --destdir "$stage" >/dev/null
cp -a "$stage/$prefix"/. "$out"/
rm -rf "$out/include" "$out/$libdir/pkgconfig"
case "$libdir" in /*) echo "bundle: libdir must be relative to the prefix (is $libdir)" >&2; exit 2 ;; esac
lib="$out/$libdir"

# Libraries every glibc >= 2.36 system has (glibc itself, the GCC runtime) and
# those that must come from the machine's GPU driver.
is_system() {
  case "$1" in
    linux-vdso.so*|ld-linux*.so*|libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*) return 0 ;;
    libresolv.so.*|libutil.so.*|libanl.so.*|libmvec.so.*|libstdc++.so.*|libgcc_s.so.*) return 0 ;;
    libcuda.so*|libnvidia-*.so*|libnvcuvid.so*) return 0 ;;
  esac
  return 1
}

elfs() {
  python3 - "$out/bin" "$lib" <<'EOF'
import os, sys
for top in sys.argv[1:]:
    for d, _, files in os.walk(top):
        for n in sorted(files):
            p = os.path.join(d, n)
            if not os.path.islink(p):
                with open(p, 'rb') as f:
                    if f.read(4) == b'\x7fELF':
                        print(p)
EOF
}

# Copy in the libraries the tree's ELF files resolve on this machine (ldd lists
# the whole closure), named by their soname.
mapfile -t own < <(elfs)
for f in "${own[@]}"; do
  ldd "$f" 2>/dev/null | while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system "$name" && continue
    [ -e "$lib/$name" ] && continue
    if [ ! -f "$path" ]; then echo "bundle: $f needs $name, which is not found" >&2; exit 1; fi
    cp -L "$path" "$lib/$name"
  done
done

# Run paths: programs look in ../<libdir>, libraries beside themselves,
# plugins (<libdir>/spindle-N/) one folder up.
up=$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$lib" "$out/bin")
while read -r f; do
  chmod u+w "$f"
  case "$f" in
    "$out/bin/"*) patchelf --set-rpath "\$ORIGIN/$up" "$f" ;;
    "$lib"/spindle-*/*) patchelf --set-rpath "\$ORIGIN/.." "$f" ;;
    *) patchelf --set-rpath "\$ORIGIN" "$f" ;;
  esac
done < <(elfs)

tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")"
echo "bundle: $out ($(du -sh "$out" | cut -f1)), $out.tar.gz ($(du -sh "$out.tar.gz" | cut -f1))"
