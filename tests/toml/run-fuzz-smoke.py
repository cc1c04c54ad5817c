#!/usr/bin/env python3
"""Short libFuzzer run of fuzz-toml (suite 'fuzz'; tools/test.sh skips it).

Usage: run-fuzz-smoke.py FUZZER DICT WORK_CORPUS SEED_DIR [SECONDS]

New inputs go to WORK_CORPUS (in the build tree); SEED_DIR (the toml-test
corpus) is only read. Skipped (77) when the seeds are not there.
TOML_TEST_CONFORMANCE, when set, names the conformance folder instead.
"""
import os, subprocess, sys

def main():
    fuzzer, dct, work, seeds = sys.argv[1:5]
    secs = sys.argv[5] if len(sys.argv) > 5 else '20'
    if os.environ.get('TOML_TEST_CONFORMANCE'):
        seeds = os.path.join(os.environ['TOML_TEST_CONFORMANCE'], 'toml-test')
    if not os.path.isdir(seeds):
        print(f'seed corpus {seeds} not found: skipped')
        return 77
    os.makedirs(work, exist_ok=True)
    return subprocess.run([fuzzer, f'-max_total_time={secs}', f'-dict={dct}', '-print_final_stats=1',
                           work, seeds]).returncode

if __name__ == '__main__':
    sys.exit(main())
