#!/usr/bin/env python3
"""Count test results from one or more of meson's testlog.json files.

A cmocka program counts as its individual cases (its '[  PASSED  ] N test(s).'
and '[  FAILED  ] N test(s)' lines), a conformance runner that prints
'N passed, M failed' counts as those, and anything else as one test by its
meson result. Prints 'N passed, N failed[, N skipped]' as the last line."""
import json, re, sys

passed = failed = skipped = 0
def records():
    for f in sys.argv[1:]:
        for line in open(f, errors='replace'):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except ValueError:
                yield {'result': 'ERROR', 'stdout': 'unreadable testlog line in ' + f}

for t in records():
    res = t.get('result')
    out = (t.get('stdout') or '') + '\n' + (t.get('stderr') or '')
    if res == 'SKIP':
        skipped += 1
        continue
    ok = res in ('OK', 'EXPECTEDFAIL')
    cm_pass = sum(int(x) for x in re.findall(r'^\[  PASSED  \] (\d+) test', out, re.M))
    cm_fail = sum(int(x) for x in re.findall(r'^\[  FAILED  \] (\d+) test', out, re.M))
    plain = re.findall(r'^(?:[\w-]+: )?(\d+) passed, (\d+) failed', out, re.M)
    if cm_pass or cm_fail:
        passed += cm_pass
        failed += cm_fail
        if not ok and cm_fail == 0:
            failed += 1          # crashed or timed out after its cases
    elif plain:
        p, f = map(int, plain[-1])
        passed += p
        failed += f
        if not ok and f == 0:
            failed += 1
    elif ok:
        passed += 1
    else:
        failed += 1
if skipped:
    print(f'{passed} passed, {failed} failed, {skipped} skipped')
else:
    print(f'{passed} passed, {failed} failed')
