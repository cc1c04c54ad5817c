#!/usr/bin/env python3
"""Run the toml-test conformance corpus against the built decoder.

Usage: run-conformance.py CONFORMANCE_DIR DECODER

CONFORMANCE_DIR holds run-toml-test.py and toml-test/ (CI keeps it in
../shared/conformance beside the clone). When it is missing the test is
skipped (exit 77). TOML_TEST_CONFORMANCE overrides the folder.
"""
import os, subprocess, sys

def main():
    conf = os.environ.get('TOML_TEST_CONFORMANCE') or sys.argv[1]
    decoder = sys.argv[2]
    runner = os.path.join(conf, 'run-toml-test.py')
    if not os.path.isfile(runner) or not os.path.isdir(os.path.join(conf, 'toml-test')):
        print(f'conformance corpus not found in {conf}: skipped')
        return 77
    r = subprocess.run([sys.executable, runner, decoder])
    return r.returncode

if __name__ == '__main__':
    sys.exit(main())
