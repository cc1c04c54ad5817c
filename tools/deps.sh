#!/usr/bin/env bash
# Install what the build and the tests need, only what is missing; never reads
# standard input. Sourced by tools/quickstart.sh and tools/test.sh:
#   . tools/deps.sh; spn_deps_apt; spn_deps_python
# spn_deps_apt     the Debian packages of .ci/apt-packages (apt-get, via sudo
#                  when not root; nothing runs when all are installed).
# spn_deps_python  a Python with every package of .ci/pip-packages: the
#                  python3 on PATH when it has them all, otherwise the project
#                  environment .venv (created with `python3 -m venv`, filled
#                  with pip; $SPINDLE_VENV names another directory), whose
#                  bin/ then goes first on PATH for the build and the tests.
#                  A Debian system Python refuses `pip install` (PEP 668), so
#                  nothing is ever installed into the system Python.

spn_deps_apt() {
  local p missing=() sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  while read -r p; do
    case "$p" in ''|\#*) continue ;; esac
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done < .ci/apt-packages
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq </dev/null || return 1
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" </dev/null >/dev/null || return 1
}

# Exit status 0 when the given python has every requirement of .ci/pip-packages
# installed (name and, where pip's packaging module can be found, version).
spn_deps_python_ok() {
  "$1" - .ci/pip-packages <<'EOF' 2>/dev/null
import sys, re, importlib.metadata as md
try:
    from packaging.requirements import Requirement
except ImportError:
    try:
        from pip._vendor.packaging.requirements import Requirement
    except ImportError:
        Requirement = None
for line in open(sys.argv[1]):
    line = line.split('#', 1)[0].strip()
    if not line:
        continue
    if Requirement:
        req = Requirement(line)
        name, spec = req.name, req.specifier
    else:
        name, spec = re.split(r'[<>=!~; \[]', line, 1)[0], None
    try:
        ver = md.version(name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if spec is not None and not spec.contains(ver, prereleases=True):
        sys.exit(1)
EOF
}

spn_deps_python() {
  local venv=${SPINDLE_VENV:-.venv} py
  py=$(command -v python3) || { echo "deps: python3 not found" >&2; return 1; }
  if [ -x "$venv/bin/python3" ]; then
    # An earlier run made the project environment: keep using it.
    export PATH="$(cd "$venv" && pwd)/bin:$PATH"
    spn_deps_python_ok "$venv/bin/python3" && return 0
  elif spn_deps_python_ok "$py"; then
    return 0
  else
    echo "creating the Python environment $venv for the tests"
    python3 -m venv "$venv" </dev/null || {
      echo "deps: python3 -m venv failed (Debian: install python3-venv)" >&2; return 1; }
    export PATH="$(cd "$venv" && pwd)/bin:$PATH"
  fi
  echo "installing Python packages into $venv: $(grep -v '^#' .ci/pip-packages | tr '\n' ' ')"
  "$venv/bin/python3" -m pip install -q --disable-pip-version-check --no-input \
    -r .ci/pip-packages </dev/null || { echo "deps: pip install failed" >&2; return 1; }
}
