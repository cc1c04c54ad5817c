#!/usr/bin/env python3
"""The public surface as installed: what a plugin author or an embedder gets
from `meson install` is exactly the documented, prefixed API.

  test-exports.py MESON BUILD_ROOT

The build is installed (tags devel, runtime) into a temporary DESTDIR and
then, reading only what was installed:
- every library under lib/ (libspindle, libspindle-client) exports only
  spn_* names and no spn__* one (spn__ is internal: Spindle's own tests reach
  those by linking the library's objects, never through the .so);
- every plugin under lib/spindle-<abi>/ exports its spindle_plugin_*
  descriptor and nothing else (the encode plugin also its documented segment
  table, spindle_segment_api);
- every function an installed header declares with SPN_API is exported by an
  installed library (a declaration without an installed definition fails
  only at a user's link), and no installed header declares an spn__ name;
- every SPN_API prototype of an installed header, and every callback of the
  host table (spn_host_api_t), says in the comment before it who owns what
  ("Ownership:") and which thread may call it ("Thread:"); one comment may
  cover a run of declarations with no blank line between them, and must then
  be true of each.
Names the toolchain adds (a leading underscore: _init, __bss_start, the
sanitizers' __odr_asan_*) are ignored. Needs nm (binutils); exits 77 without it.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def exported(path):
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 3 and f[1] not in ("A", "a") and not f[2].startswith("_"):
            names.add(f[2].split("@")[0])
    return names


def strip_preprocessor(text):
    """Blank out preprocessor lines (and their continuations), keeping line numbers."""
    out, cont = [], False
    for line in text.split("\n"):
        directive = cont or line.lstrip().startswith("#")
        cont = directive and line.rstrip().endswith("\\")
        out.append("" if directive else line)
    return "\n".join(out)


def blank_comments(text):
    """Comments replaced by spaces of the same shape (newlines kept)."""
    return re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)


def declarations(text):
    """(name, line index of SPN_API, is_function) for each SPN_API declaration."""
    code = blank_comments(strip_preprocessor(text))
    found = []
    for m in re.finditer(r"\bSPN_API\b([^;{]*?)\b([A-Za-z_]\w*)\s*\(", code):
        found.append((m.group(2), code.count("\n", 0, m.start()), True))
    for m in re.finditer(r"\bSPN_API\b[^;(]*?\b(spn_\w+)\s*(?:\[[^]]*\])?\s*;", code):
        found.append((m.group(1), code.count("\n", 0, m.start()), False))  # data
    return found


def doc_comment(lines, i):
    """The comment that documents the declaration starting at line i: the
    nearest comment above it, passing over the lines of adjacent
    declarations, not over a blank line. None when there is none."""
    j = i - 1
    while j >= 0:
        s = lines[j].strip()
        if not s:
            return None
        if s.endswith("*/"):
            end = j
            while j >= 0 and "/*" not in lines[j]:
                j -= 1
            return "\n".join(lines[j:end + 1])
        j -= 1
    return None


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    if not shutil.which("nm"):
        print("SKIP: nm not found")
        return 77
    meson, build = sys.argv[1], sys.argv[2]
    bad = []
    with tempfile.TemporaryDirectory() as dest:
        r = subprocess.run([meson, "install", "-C", build, "--destdir", dest, "--no-rebuild", "--quiet",
                            "--tags", "devel,runtime"], capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            print("FAIL meson install")
            return 1
        libs, plugins, headers = [], [], []
        for root, _, files in os.walk(dest):
            for f in files:
                p = os.path.join(root, f)
                if os.path.islink(p):
                    continue
                if re.fullmatch(r"libspindle-[\w-]+\.so", f) and re.fullmatch(r"spindle-\d+", os.path.basename(root)):
                    plugins.append(p)
                elif re.match(r"lib[\w-]+\.so(\.\d+)*$", f):
                    libs.append(p)
                elif f.endswith(".h") and os.path.basename(root) == "spindle":
                    headers.append(p)
        libs.sort(), plugins.sort(), headers.sort()
        if not libs or not plugins or not headers:
            bad.append(f"install found {len(libs)} libraries, {len(plugins)} plugins, {len(headers)} headers")

        names = set()
        for lib in libs:
            ns = exported(lib)
            base = os.path.basename(lib)
            if not ns:
                bad.append(f"{base}: exports nothing")
            bad += [f"{base}: exports {n} (not spn_*)" for n in sorted(ns) if not n.startswith("spn_")]
            bad += [f"{base}: exports internal {n}" for n in sorted(ns) if n.startswith("spn__")]
            names |= ns

        n_decl = n_proto = n_cb = 0
        for h in headers:
            base = os.path.basename(h)
            text = open(h).read()
            lines = text.split("\n")
            for n, line, is_function in sorted(set(declarations(text))):
                n_decl += 1
                if n.startswith("spn__"):
                    bad.append(f"{base}:{line + 1}: declares internal {n} with SPN_API")
                elif n not in names:
                    bad.append(f"{base}:{line + 1}: SPN_API {n} is declared but no installed library exports it")
                if not is_function:
                    continue
                n_proto += 1
                doc = doc_comment(lines, line)
                missing = [w for w in ("Ownership:", "Thread:") if not doc or w not in doc]
                if missing:
                    bad.append(f"{base}:{line + 1}: {n}: its comment lacks {' and '.join(missing)}")
            # The host table is the plugin's API: each callback documented alike.
            m = re.search(r"typedef struct spn_host_api \{(.*?)\} spn_host_api_t;", text, flags=re.S)
            if m:
                first = text.count("\n", 0, m.start(1))
                body = blank_comments(m.group(1))
                for cb in re.finditer(r"\(\*(\w+)\)\s*\(", body):
                    n_cb += 1
                    line = first + body.count("\n", 0, cb.start())
                    doc = doc_comment(lines, line)
                    missing = [w for w in ("Ownership:", "Thread:") if not doc or w not in doc]
                    if missing:
                        bad.append(f"{base}:{line + 1}: host table {cb.group(1)}: its comment lacks "
                                   f"{' and '.join(missing)}")
        if n_cb < 40:
            bad.append(f"only {n_cb} spn_host_api_t callbacks found in the installed plugin.h: the parser is off")
        if n_decl < 50:
            bad.append(f"only {n_decl} SPN_API declarations found in the installed headers: the parser is off")

        allowed_extra = {"spindle_segment_api"}
        for p in plugins:
            ns = exported(p)
            base = os.path.basename(p)
            if not any(n.startswith("spindle_plugin_") for n in ns):
                bad.append(f"{base}: no spindle_plugin_* descriptor exported")
            for n in sorted(ns):
                if not n.startswith("spindle_plugin_") and n not in allowed_extra:
                    bad.append(f"{base}: exports {n}")
    for b in bad:
        print("FAIL", b)
    print(f"{len(libs)} libraries export {len(names)} names; {len(headers)} installed headers declare {n_decl} "
          f"({n_proto} prototypes), the host table {n_cb} callbacks; {len(plugins)} plugins checked; "
          f"{len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
