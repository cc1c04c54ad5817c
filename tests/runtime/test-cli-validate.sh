#!/usr/bin/env bash
# `spindle validate`: every config in configs/ is valid; a config with an
# unknown stage kind (and other mistakes) exits 2 naming file:line:col, the
# stage and the kind.
#   test-cli-validate.sh SPINDLE UTIL_STAGE_DIR SOURCE_ROOT
set -u
spindle=$(realpath "$1") util=$(realpath "$2") src=$(realpath "$3")
fail() { echo "FAIL: $*"; exit 1; }
export SPINDLE_PLUGIN_PATH=$util${SPINDLE_MEDIA_STAGE_DIR:+:$SPINDLE_MEDIA_STAGE_DIR}
# configs that need the media stages are skipped in builds without them
needs_missing() { [ -z "${SPINDLE_MEDIA_STAGE_DIR:-}" ] && grep -Eq 'kind = "(decode|encode)"' "$1"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

n=0
# Pipeline configs have a [pipeline] table; server configs ([server]) are
# loaded by the job service's tests.
for c in "$src"/configs/*.toml; do
  needs_missing "$c" && continue
  grep -q '^\[pipeline\]' "$c" || continue
  out=$("$spindle" validate "$c" 2>&1) || fail "$c: $out"
  n=$((n + 1))
done
[ "$n" -ge 1 ] || fail "no configs found"

cat > unknown.toml <<'TOML'
[pipeline]
name = "broken"

[[stage]]
name = "source"
kind = "synth"

[[stage]]
name = "blur"
kind = "gaussian_blur"
inputs = ["source"]
TOML
"$spindle" validate unknown.toml >out.txt 2>err.txt
rc=$?
[ $rc -eq 2 ] || fail "unknown kind: exit $rc, want 2"
grep -q 'unknown.toml:10:8: stage "blur": unknown stage kind "gaussian_blur"' err.txt || fail "message: $(cat err.txt)"
grep -q 'known: .*synth' err.txt || fail "known kinds not listed: $(cat err.txt)"

# A --set that breaks a valid config.
"$spindle" validate "$src/configs/synthetic.toml" --set source.frames=lots 2>err.txt
[ $? -eq 2 ] || fail "bad --set should exit 2"
grep -q -- '--set "source.frames=lots": stage "source": key "frames" must be an integer, got string' err.txt ||
  fail "bad --set message: $(cat err.txt)"
# ... and one that keeps it valid.
"$spindle" validate "$src/configs/synthetic.toml" --set source.frames=5 --set sink.expect_frames=5 >/dev/null ||
  fail "valid --set refused"

# TOML syntax errors carry their position too.
printf '[pipeline]\nname = "x\n' > syntax.toml
"$spindle" validate syntax.toml 2>err.txt
[ $? -eq 2 ] || fail "syntax error should exit 2"
grep -q 'syntax.toml:2:' err.txt || fail "syntax message: $(cat err.txt)"

"$spindle" validate missing.toml 2>err.txt
[ $? -eq 2 ] || fail "missing file should exit 2"
grep -q 'missing.toml' err.txt || fail "missing file message: $(cat err.txt)"

"$spindle" validate >/dev/null 2>&1
[ $? -eq 2 ] || fail "no file should exit 2"
echo ok
