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

if ! "$src/tools/bundle.sh" "$build" "$tmp/made/spindle-test" >"$tmp/bundle.log" 2>&1; then
  cat "$tmp/bundle.log"; echo "FAIL: tools/bundle.sh"; exit 1
fi
cat "$tmp/bundle.log"
mkdir -p "$tmp/elsewhere" "$tmp/cwd"
tar -C "$tmp/elsewhere" -xzf "$tmp/made/spindle-test.tar.gz" || { echo "FAIL: unpack"; exit 1; }
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

# Every ELF file has an $ORIGIN run path, and every library it resolves that
# the bundle carries resolves to the bundle's copy; none is missing.
n=0
while read -r f; do
  n=$((n + 1))
  rp=$(readelf -d "$f" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p; s/.*(RPATH).*\[\(.*\)\]/\1/p')
  case "$rp" in '$ORIGIN'*) ;; *) bad "$f: run path '$rp' is not \$ORIGIN-relative" ;; esac
  deps=$("${clean[@]}" ldd "$f" 2>&1)
  grep -q "not found" <<<"$deps" && bad "$f: $(grep 'not found' <<<"$deps" | head -1)"
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ -e "$(dirname "$(find "$u/lib" -name "$name" -print -quit)")/$name" ] 2>/dev/null; then
      case "$(realpath "$path")" in "$u"/*) ;; *) bad "$f: $name resolves to $path, not the bundle's" ;; esac
    fi
  done <<<"$deps"
done < <(find "$u/bin" "$u/lib" -type f \( -name '*.so*' -o -perm -u+x \) -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
echo "checked $n ELF files"
[ $n -gt 10 ] || bad "only $n ELF files in the bundle"
[ -f "$u/share/doc/spindle/LICENSE" ] || bad "no LICENSE in the bundle"
[ $fail -eq 0 ] && echo OK
exit $fail
