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
# SPINDLE_BUNDLE_ARCHIVE: gz (the default, OUTDIR.tar.gz), zst (OUTDIR.tar.zst:
# about ten times faster to make with a CUDA build's 1 GB of mostly
# incompressible libraries, as small; needs zstd) or none (OUTDIR/ only, as
# the container image uses it).
set -euo pipefail
trap 'echo "bundle: line $LINENO: a command failed (exit $?)" >&2' ERR
builddir=${1:-build}
[ -f "$builddir/meson-private/coredata.dat" ] || { echo "bundle: $builddir is not a meson build folder" >&2; exit 2; }
command -v patchelf >/dev/null || { echo "bundle: patchelf not found (Debian package patchelf)" >&2; exit 2; }
opts=$(meson introspect --buildoptions "$builddir")
opt() { python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"] == sys.argv[1]))' "$1" <<<"$opts"; }
prefix=$(opt prefix); libdir=$(opt libdir)
archive=${SPINDLE_BUNDLE_ARCHIVE:-gz}
case "$archive" in
  gz|none) ;;
  zst) command -v zstd >/dev/null || { echo "bundle: SPINDLE_BUNDLE_ARCHIVE=zst needs zstd (Debian package zstd)" >&2; exit 2; } ;;
  *) echo "bundle: SPINDLE_BUNDLE_ARCHIVE is '$archive'; gz, zst or none" >&2; exit 2 ;;
esac
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
carry_deps() {
  ldd "$1" 2>/dev/null | while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_system "$name" && continue
    [ -e "$lib/$name" ] && continue
    if [ ! -f "$path" ]; then echo "bundle: $1 needs $name, which is not found" >&2; exit 1; fi
    cp -L "$path" "$lib/$name"
  done
}
mapfile -t own < <(elfs)
for f in "${own[@]}"; do
  carry_deps "$f"
done

# Libraries loaded with dlopen, which ldd does not see. cuDNN 9 opens its
# sub-libraries (graph, ops, cnn, adv, heuristic, the engines) by soname, and
# its runtime-compiled engines open NVRTC: where the bundle carries libcudnn,
# it carries those from the same folder too, with what they link.
carry_closure() {
  [ -e "$lib/$(basename "$1")" ] || cp -L "$1" "$lib/$(basename "$1")"
  carry_deps "$1"
}
# The path the loader's cache gives SONAME (empty when it has none). awk
# reads the whole listing: stopping at the first match would kill ldconfig
# with SIGPIPE on a machine whose cache lists more than a pipe holds (64 KB),
# and with pipefail and -e that ended the script without a word.
ldcache() { ldconfig -p | awk -v n="$1" '$1 == n && !found {print $NF; found = 1}'; }
# Where the build's libraries came from: libspindle's dependencies as this
# machine resolves them (the run paths are not set yet).
spindle_so=$(find "$lib" -maxdepth 1 -name 'libspindle.so.*' -print -quit)
spindle_deps=$(ldd "$spindle_so" 2>/dev/null || true)
# the folder of the CUDA runtime the build linked (empty without CUDA)
cudart=$(awk '$1 ~ /^libcudart\.so/ {print $3; exit}' <<<"$spindle_deps")
cudart_dir=${cudart:+$(dirname "$(readlink -f "$cudart")")}
for carried in "$lib"/libcudnn.so.*; do
  [ -e "$carried" ] || continue
  soname=$(basename "$carried")
  src=$(awk -v n="$soname" '$1 == n {print $3}' <<<"$spindle_deps")
  [ -n "$src" ] || src=$(ldcache "$soname")
  [ -n "$src" ] || { echo "bundle: cannot find where $soname came from" >&2; exit 1; }
  dir=$(dirname "$(readlink -f "$src")")
  n=0
  for sub in "$dir"/libcudnn_*.so."${soname##*.so.}"; do
    [ -e "$sub" ] || continue
    carry_closure "$sub"
    n=$((n + 1))
  done
  [ $n -gt 0 ] || { echo "bundle: $soname is carried but none of its sub-libraries ($dir/libcudnn_*) is" >&2; exit 1; }
  # NVRTC: beside cuDNN, or beside the CUDA runtime the build linked
  for d in "$dir" ${cudart_dir:+"$cudart_dir"}; do
    ls "$d"/libnvrtc.so.[0-9]* >/dev/null 2>&1 || continue
    for nv in "$d"/libnvrtc.so.[0-9]* "$d"/libnvrtc-builtins.so.[0-9]*; do
      [ -e "$nv" ] && carry_closure "$nv"
    done
    break
  done
  echo "bundle: carried $n cuDNN sub-libraries from $dir"
done

# cuBLASLt: libspindle opens it itself when a CUDA backend opens (its name
# is in the library's text, cuda/engine/cublaslt-api.h), so ldd does not
# list it; carried from where this machine's loader, or the CUDA runtime's
# folder, or libspindle's run path has it.
lt=$(grep -ao 'libcublasLt\.so\.[0-9][0-9]*' "$spindle_so" 2>/dev/null | head -1 || true)
if [ -n "$lt" ] && [ ! -e "$lib/$lt" ]; then
  src=$(ldcache "$lt")
  rp=$(readelf -d "$spindle_so" 2>/dev/null | sed -n 's/.*R[UN]*PATH.*\[\(.*\)\]/\1/p' | tr ':' ' ')
  for d in ${cudart_dir:+"$cudart_dir"} $rp; do
    [ -z "$src" ] && [ -e "$d/$lt" ] && src=$d/$lt
  done
  [ -n "$src" ] || { echo "bundle: libspindle opens $lt, which is not found on this machine" >&2; exit 1; }
  carry_closure "$src"
  echo "bundle: carried $lt from $(dirname "$src")"
fi

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

case "$archive" in
  gz) tar -C "$(dirname "$out")" -czf "$out.tar.gz" "$(basename "$out")" ;;
  zst) tar -C "$(dirname "$out")" -I 'zstd -3 -T0' -cf "$out.tar.zst" "$(basename "$out")" ;;
esac
if [ "$archive" = none ]; then
  echo "bundle: $out ($(du -sh "$out" | cut -f1))"
else
  echo "bundle: $out ($(du -sh "$out" | cut -f1)), $out.tar.$archive ($(du -sh "$out.tar.$archive" | cut -f1))"
fi
