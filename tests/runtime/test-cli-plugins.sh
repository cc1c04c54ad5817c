#!/usr/bin/env bash
# `spindle plugins` lists every utility stage with its plugin file, ports and
# config keys; one KIND narrows the listing; refused plugins are warnings.
#   test-cli-plugins.sh SPINDLE UTIL_STAGE_DIR FAKE_PLUGIN_DIR
set -u
spindle=$(realpath "$1") util=$(realpath "$2") fakes=$(realpath "$3")
fail() { echo "FAIL: $*"; exit 1; }
unset SPINDLE_PLUGIN_PATH
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

out=$("$spindle" plugins --plugin-path "$util") || fail "plugins exited $?"
for k in synth passthrough tee check cost; do
  grep -q "^$k\$" <<<"$out" || fail "kind $k not listed"
  grep -q "plugin   $util/libspindle-$k.so" <<<"$out" || fail "plugin file of $k not shown"
done
grep -q "outputs  out0 (any), out1 (any)" <<<"$out" || fail "tee's ports not shown"

one=$("$spindle" plugins --plugin-path "$util" synth) || fail "plugins synth exited $?"
grep -q "^synth\$" <<<"$one" || fail "synth missing"
grep -q "^tee\$" <<<"$one" && fail "asked for synth only, got tee"
grep -Eq '^ +frames +int +30 +\[0, 1000000000\] per-job' <<<"$one" || fail "frames key line: $one"
grep -Eq '^ +format +string +"rgb24"' <<<"$one" || fail "format key line"

"$spindle" plugins --plugin-path "$util" no_such_kind >/dev/null 2>err.txt
[ $? -eq 1 ] || fail "unknown kind should exit 1"
grep -q 'no stage kind "no_such_kind"' err.txt || fail "unknown kind message: $(cat err.txt)"

# A folder of broken plugins: the good ones still list, the refusal is a warning.
"$spindle" plugins --plugin-path "$fakes" >out.txt 2>err.txt || fail "fakes: exited $?"
grep -q '^fake_src$' out.txt || fail "fake_src (from dupkind) not listed"
grep -q 'warning: .*libspindle-abimajor.so: refused: .*rule: ABI major must match' err.txt || fail "no refusal warning: $(cat err.txt)"

"$spindle" plugins --bogus >/dev/null 2>&1
[ $? -eq 2 ] || fail "unknown option should exit 2"
echo ok
