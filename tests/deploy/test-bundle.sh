#!/usr/bin/env bash
# The portable archive (tools/bundle.sh) unpacked in a fresh folder runs the
# synthetic pipeline with LD_LIBRARY_PATH and SPINDLE_PLUGIN_PATH unset, from
# another working directory; its stages and libraries all come from inside it.
#   test-bundle.sh SRCDIR BUILDDIR
set -uo pipefail
src=$1 build=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# An archive format bundle.sh does not make is refused before anything is
# written, naming the variable.
out=$(SPINDLE_BUNDLE_ARCHIVE=xz "$src/tools/bundle.sh" "$build" "$tmp/bad/spindle-test" 2>&1)
rc=$?
[ $rc -eq 2 ] || bad "SPINDLE_BUNDLE_ARCHIVE=xz: exit $rc, want 2"
grep -q "SPINDLE_BUNDLE_ARCHIVE is 'xz'" <<<"$out" || bad "SPINDLE_BUNDLE_ARCHIVE=xz: no error naming it: $out"
[ ! -e "$tmp/bad" ] || bad "SPINDLE_BUNDLE_ARCHIVE=xz: $tmp/bad was written"

# The loader's cache bundle.sh reads (ldconfig -p) is padded past what a pipe
# holds, as on a machine with many libraries installed: a reader that stops
# at the first match then kills ldconfig with SIGPIPE, which once ended
# bundle.sh silently on such a machine.
fakebin=$tmp/fakebin
mkdir -p "$fakebin"
if real=$(command -v ldconfig); then
  cat >"$fakebin/ldconfig" <<EOF
#!/bin/sh
"$real" "\$@" || exit \$?
[ "\$1" = -p ] || exit 0
i=0
while [ \$i -lt 3000 ]; do
  echo "	libspindle-filler\$i.so (libc6,x86-64) => /nonexistent/libspindle-filler\$i.so"
  i=\$((i + 1))
done
EOF
  chmod +x "$fakebin/ldconfig"
fi

# zstd: the same archive as the default .tar.gz but for the compressor, made
# in seconds rather than a minute with a CUDA build's GPU libraries.
if ! PATH="$fakebin:$PATH" SPINDLE_BUNDLE_ARCHIVE=zst "$src/tools/bundle.sh" "$build" "$tmp/made/spindle-test" >"$tmp/bundle.log" 2>&1; then
  cat "$tmp/bundle.log"; echo "FAIL: tools/bundle.sh"; exit 1
fi
cat "$tmp/bundle.log"
mkdir -p "$tmp/elsewhere" "$tmp/cwd"
tar -C "$tmp/elsewhere" -I zstd -xf "$tmp/made/spindle-test.tar.zst" || { echo "FAIL: unpack"; exit 1; }
rm -rf "$tmp/made"                       # only the unpacked copy is left
u="$tmp/elsewhere/spindle-test"
clean=(env -u LD_LIBRARY_PATH -u SPINDLE_PLUGIN_PATH -u LD_PRELOAD)

out=$(cd "$tmp/cwd" && "${clean[@]}" "$u/bin/spindle" run "$u/share/spindle/configs/synthetic.toml" \
        --set source.frames=50 --set sink.expect_frames=50 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || bad "spindle run exited $rc"
grep -q "job 1 succeeded: 50 frames" <<<"$out" || bad "no 'job 1 succeeded: 50 frames' line"

# Every stage plugin the program loads is the bundle's.
plugins=$(cd "$tmp/cwd" && "${clean[@]}" "$u/bin/spindle" plugins 2>&1 | awk '$1 == "plugin" {print $2}')
[ -n "$plugins" ] || bad "spindle plugins lists no plugin"
while read -r p; do
  [ -z "$p" ] && continue
  case "$(realpath "$p")" in "$u"/*) ;; *) bad "plugin from outside the bundle: $p" ;; esac
done <<<"$plugins"
grep -q "libspindle-synth.so" <<<"$plugins" || bad "the synth stage is not among the bundle's plugins"

# Models are found inside the moved archive: the main job, configs/enhance.toml,
# with an empty model store. A model by name that sits in the archive's
# share/spindle/models (here the ESPCN file under the default Real-ESRGAN's
# name; `spindle model fetch` with SPINDLE_MODEL_PATH=that folder puts the
# real one there) and the ESPCN x2 that superres falls back to both come from
# the archive, not from the prefix it was built for or the source tree.
if [ -f "$u/share/spindle/models/espcn-x2.onnx" ] && [ -f "$u/share/spindle/configs/enhance.toml" ]; then
  mkdir -p "$tmp/home"
  enh=(env -u SPINDLE_MODEL_PATH -u XDG_DATA_HOME HOME="$tmp/home" "${clean[@]}"
       "$u/bin/spindle" run "$u/share/spindle/configs/enhance.toml" --set decode.duration=0.2
       --set encode.path="$tmp/cwd/enhanced.mp4")
  out=$(cd "$tmp/cwd" && "${enh[@]}" 2>&1)
  rc=$?
  [ $rc -eq 0 ] || bad "enhance.toml (nothing fetched) exited $rc: $(tail -3 <<<"$out")"
  grep -q "job 1 succeeded: 5 frames" <<<"$out" || bad "enhance.toml (nothing fetched): no 'job 1 succeeded: 5 frames'"
  grep -q "using the embedded espcn-x2 ($u/share/spindle/models/espcn-x2.onnx)" <<<"$out" ||
    bad "enhance.toml (nothing fetched): superres did not fall back to the archive's espcn-x2.onnx: $(grep -m1 'superres' <<<"$out")"
  cp "$u/share/spindle/models/espcn-x2.onnx" "$u/share/spindle/models/realesr-animevideov3-x2.onnx"
  out=$(cd "$tmp/cwd" && "${enh[@]}" 2>&1)
  rc=$?
  [ $rc -eq 0 ] || bad "enhance.toml (a model in the archive) exited $rc: $(tail -3 <<<"$out")"
  grep -q "superres sr: model $u/share/spindle/models/realesr-animevideov3-x2.onnx" <<<"$out" ||
    bad "realesr-animevideov3-x2 in the archive's models folder was not found by name"
  rm -f "$u/share/spindle/models/realesr-animevideov3-x2.onnx"
else
  echo "note: the archive has no vision stage models or configs; enhance.toml not run"
fi

# Every ELF file has an $ORIGIN run path, and every library it resolves that
# the bundle carries (the names of the files and links under lib/) resolves
# to the bundle's copy; none is missing.
declare -A carried=()
while read -r name; do carried[$name]=1; done < <(find "$u/lib" \( -type f -o -type l \) -printf '%f\n')
n=0
while read -r f; do
  n=$((n + 1))
  rp=$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p')
  case "$rp" in '$ORIGIN'*) ;; *) bad "$f: run path '$rp' is not \$ORIGIN-relative" ;; esac
  deps=$("${clean[@]}" ldd "$f" 2>&1)
  grep -q "not found" <<<"$deps" && bad "$f: $(grep 'not found' <<<"$deps" | head -1)"
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ -n "${carried[$name]:-}" ]; then
      case "$(realpath "$path")" in "$u"/*) ;; *) bad "$f: $name resolves to $path, not the bundle's" ;; esac
    fi
  done <<<"$deps"
done < <(find "$u/bin" "$u/lib" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
echo "checked $n ELF files"
[ $n -gt 10 ] || bad "only $n ELF files in the bundle"
[ -f "$u/share/doc/spindle/LICENSE" ] || bad "no LICENSE in the bundle"
# cuDNN 9 opens its sub-libraries with dlopen (ldd does not list them): a
# bundle that carries libcudnn without them fails its first convolution on a
# GPU host that has no cuDNN of its own.
for c in "$u"/lib/*/libcudnn.so.[0-9]*; do
  [ -e "$c" ] || continue
  v=${c##*.so.}
  for sub in graph ops cnn heuristic engines_precompiled; do
    [ -f "$(dirname "$c")/libcudnn_$sub.so.$v" ] || bad "the bundle carries $(basename "$c") but not libcudnn_$sub.so.$v"
  done
done
# cuBLASLt too is opened with dlopen, by libspindle itself (its soname is in
# the library's text): a CUDA bundle without it cannot open a GPU.
for s in "$u"/lib/*/libspindle.so.[0-9]* "$u"/lib/libspindle.so.[0-9]*; do
  [ -f "$s" ] || continue
  lt=$(grep -ao 'libcublasLt\.so\.[0-9][0-9]*' "$s" | head -1 || true)
  [ -z "$lt" ] || [ -f "$(dirname "$s")/$lt" ] || bad "libspindle opens $lt, which the bundle does not carry beside it"
  [ -z "$lt" ] || echo "carried: $lt"
done
[ $fail -eq 0 ] && echo OK
exit $fail
