#!/usr/bin/env python3
"""Metrics and logs of a gateway + remote worker run.

  test-observe.py SPINDLE FAKE_NVML SRCDIR

A gateway with no in-process workers (`spindle serve --workers 0 --http`) and
the fake NVML library gets five jobs while no worker is connected (queue depth
per pipeline and priority), then a remote `spindle worker` runs them: three
synthetic jobs succeed, one `fail` job dies after two attempts, one is
cancelled while queued. Checks:
- /healthz and /readyz answer 200; an unknown path 404.
- Every metric family docs/operations.md documents is in the final scrape,
  and each family documented as moving has a sample whose value changed
  between the scrape before the jobs ran and the one after.
- The queue depth during the wait names the pipelines and priorities.
- Every line the gateway and the worker wrote to stderr is one JSON object
  with ts, level and msg; the lifecycle events (submitted, leased, succeeded,
  failed, dead, cancelled) are there for the right jobs, with attempt and
  duration_ms where they apply; the failure reason is printed once per attempt.
"""
import json, os, re, signal, subprocess, sys, tempfile, time, urllib.error, urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from freeport import free_port  # noqa: E402  (drawn below the ephemeral range: tests/common/freeport.py)

spindle, fake_nvml, src = (os.path.abspath(a) for a in sys.argv[1:4])
failures = []
procs = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print('FAIL:', msg)


def get(port, path):
    try:
        with urllib.request.urlopen(f'http://127.0.0.1:{port}{path}', timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def parse_metrics(text):
    """{family: {sample line's name+labels: value}} from Prometheus text."""
    fams, types = {}, {}
    for line in text.splitlines():
        m = re.match(r'# TYPE (\S+) (\S+)', line)
        if m:
            types[m.group(1)] = m.group(2)
            fams.setdefault(m.group(1), {})
            continue
        if not line or line.startswith('#'):
            continue
        key, value = line.rsplit(' ', 1)
        name = key.split('{', 1)[0]
        fam = re.sub(r'_(bucket|sum|count)$', '', name) if re.sub(r'_(bucket|sum|count)$', '', name) in types else name
        check(fam in types, f'sample {key} has no # TYPE line')
        fams.setdefault(fam, {})[key] = float(value)
    return fams, types


def documented():
    """(name, moves, processes) for each row of the metrics table in
    docs/operations.md; processes: a subset of {'serve', 'worker'}."""
    rows = re.findall(r'^\| `(spindle_[a-z_]+)` \| (\w+) \|[^\n]*\| (yes|no) \| ([a-z, ]+) \|$',
                      open(os.path.join(src, 'docs', 'operations.md')).read(), re.M)
    return [(name, moves == 'yes', {p.strip() for p in on.split(',')}) for name, _, moves, on in rows]


def run(*args, timeout=60):
    return subprocess.run([spindle, *args], capture_output=True, timeout=timeout, text=True)


tmp = tempfile.mkdtemp(prefix='spn-observe-')
env = dict(os.environ, SPINDLE_NVML_LIBRARY=os.path.abspath(fake_nvml))
http = free_port()
gw_err = open(os.path.join(tmp, 'gateway.err'), 'wb')
gw = subprocess.Popen([spindle, 'serve', '--config', os.path.join(src, 'configs', 'server.toml'),
                       '--workers', '0', '--bind', 'tcp://127.0.0.1:*', '--db', os.path.join(tmp, 'q.db'),
                       '--root', tmp, '--http', f'127.0.0.1:{http}', '--max-attempts', '2',
                       '--backoff-ms', '50', '--heartbeat-ms', '200'],
                      stdout=subprocess.PIPE, stderr=gw_err, env=env, cwd=tmp)
procs.append(gw)
try:
    line = gw.stdout.readline().decode()
    if 'ready on ' not in line:
        sys.exit(f'FAIL: gateway not ready: {line!r} {open(os.path.join(tmp, "gateway.err")).read()}')
    ep = line.split('ready on ')[1].strip()

    code, body = get(http, '/healthz')
    check(code == 200 and body.strip() == 'ok', f'/healthz: {code} {body!r}')
    code, body = get(http, '/readyz')
    check(code == 200 and body.strip() == 'ready', f'/readyz: {code} {body!r}')
    code, _ = get(http, '/nothere')
    check(code == 404, f'/nothere: {code}')

    code, first_text = get(http, '/metrics')
    check(code == 200, f'/metrics: {code}')
    first, _ = parse_metrics(first_text)

    # Queued with no worker: depth by pipeline and priority.
    ids = {}
    for name, args in [('s1', ['synthetic', '--param', 'frames=20', '--priority', '5']),
                       ('s2', ['synthetic', '--param', 'frames=20', '--priority', '5']),
                       ('s3', ['synthetic', '--param', 'frames=20']),
                       ('bad', ['fail', '--max-attempts', '2']),
                       ('gone', ['synthetic', '--param', 'frames=5', '--priority', '-3'])]:
        out = [] if args[0] == 'fail' else ['--output', f'frames={tmp}/{name}.raw']
        r = run('submit', *args, *out, '--connect', ep)
        check(r.returncode == 0, f'submit {name}: {r.returncode} {r.stderr}')
        ids[name] = int(r.stdout.split()[0]) if r.returncode == 0 else -1
    r = run('cancel', str(ids['gone']), '--connect', ep)
    check(r.returncode == 0, f'cancel: {r.returncode} {r.stderr}')
    _, queued_text = get(http, '/metrics')
    queued, _ = parse_metrics(queued_text)
    depth = queued.get('spindle_queue_depth', {})
    check(depth.get('spindle_queue_depth{pipeline="synthetic",priority="5"}') == 2, f'depth synthetic/5: {depth}')
    check(depth.get('spindle_queue_depth{pipeline="synthetic",priority="0"}') == 1, f'depth synthetic/0: {depth}')
    check(depth.get('spindle_queue_depth{pipeline="fail",priority="0"}') == 1, f'depth fail/0: {depth}')
    check(not any('priority="-3"' in k for k in depth), f'a cancelled job is counted as queued: {depth}')
    # no worker yet: every queued job is unserved, by pipeline (priorities added up)
    unserved = queued.get('spindle_queue_unserved', {})
    check(unserved == {'spindle_queue_unserved{pipeline="synthetic"}': 3, 'spindle_queue_unserved{pipeline="fail"}': 1},
          f'unserved before any worker: {unserved}')

    # A worker --http it cannot serve is refused, naming the address.
    for bad, why in [('127.0.0.1', 'expected HOST:PORT'), (f'127.0.0.1:{http}', 'address already in use')]:
        r = run('worker', '--connect', ep, '--name', 'bad', '--http', bad, timeout=30)
        check(r.returncode != 0 and (f'http "{bad}"' in r.stderr or f'http {bad}:' in r.stderr)
              and why.lower() in r.stderr.lower(),
              f'worker --http {bad}: exit {r.returncode} {r.stderr!r}')

    wk_err = open(os.path.join(tmp, 'worker.err'), 'wb')
    whttp = free_port()
    wk = subprocess.Popen([spindle, 'worker', '--connect', ep, '--name', 'w1', '--slots', '2',
                           '--heartbeat-ms', '200', '--config', os.path.join(src, 'configs', 'server.toml'),
                           '--http', f'127.0.0.1:{whttp}'],
                          stdout=wk_err, stderr=wk_err, env=env, cwd=tmp)
    procs.append(wk)
    # The worker's endpoint opens once its pipelines are loaded.
    for _ in range(300):
        try:
            code, body = get(whttp, '/healthz')
            break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    else:
        code, body = None, ''
    check(code == 200 and body.strip() == 'ok', f'worker /healthz: {code} {body!r}')
    code, body = get(whttp, '/readyz')
    check(code == 200 and body.strip() == 'ready', f'worker /readyz: {code} {body!r}')
    code, _ = get(whttp, '/nothere')
    check(code == 404, f'worker /nothere: {code}')
    code, wfirst_text = get(whttp, '/metrics')
    check(code == 200, f'worker /metrics: {code}')
    wfirst, wtypes0 = parse_metrics(wfirst_text)
    # A fresh process's counters and histograms start at zero (the worker
    # may have run a job before the first scrape answered).
    wfirst = {f: ({} if wtypes0.get(f) in ('counter', 'histogram') else v) for f, v in wfirst.items()}
    for name in ['s1', 's2', 's3', 'bad']:
        r = run('watch', str(ids[name]), '--connect', ep, timeout=90)
        want = 5 if name == 'bad' else 0
        check(r.returncode == want or (name == 'bad' and r.returncode != 0),
              f'job {name}: exit {r.returncode} {r.stdout} {r.stderr}')
    _, last_text = get(http, '/metrics')
    last, types = parse_metrics(last_text)
    _, wlast_text = get(whttp, '/metrics')
    wlast, wtypes = parse_metrics(wlast_text)

    docs = documented()
    check(len(docs) >= 15, f'docs/operations.md documents only {len(docs)} metric families (table not parsed?)')
    # (first scrape, scrapes during and after the run, # TYPE lines) per process
    scrapes = {'serve': (first, [queued, last], types), 'worker': (wfirst, [wlast], wtypes)}
    for name, moves, on in docs:
        check(on and on <= scrapes.keys(), f'{name}: "on" must name serve and/or worker, not {on}')
        changed = []
        for proc in on & scrapes.keys():
            before, during, typ = scrapes[proc]
            # Present with samples in a scrape during the run (queue depth has
            # samples only while jobs wait) and in the last one's # TYPE lines.
            check(name in typ, f'{name}: documented on {proc} but not in its /metrics')
            check(any(sc.get(name) for sc in during), f'{name}: no sample in any scrape of {proc}')
            changed += [k for sc in during for k, v in sc.get(name, {}).items() if before.get(name, {}).get(k) != v]
        if moves:
            check(changed, f'{name}: no sample changed while jobs ran')
    for proc, (_, _, typ) in scrapes.items():
        for name in typ:
            check(any(name == d[0] and proc in d[2] for d in docs),
                  f'{name}: in the /metrics of {proc} but not documented for it in docs/operations.md')
    # What the worker ran: three jobs succeeded, two attempts failed; the
    # synthetic pipeline's stages were called, its sink with batches.
    wj = wlast.get('spindle_worker_jobs_total', {})
    check(wj.get('spindle_worker_jobs_total{outcome="succeeded"}') == 3, f'worker jobs: {wj}')
    check(wj.get('spindle_worker_jobs_total{outcome="failed"}') == 2, f'worker jobs: {wj}')
    # ... and their durations, by pipeline and outcome: +Inf is the count
    wd = wlast.get('spindle_worker_job_duration_seconds', {})
    for pipeline, outcome, n in [('synthetic', 'succeeded', 3), ('fail', 'failed', 2)]:
        lab = f'pipeline="{pipeline}",outcome="{outcome}"'
        cnt = wd.get(f'spindle_worker_job_duration_seconds_count{{{lab}}}')
        inf = wd.get(f'spindle_worker_job_duration_seconds_bucket{{{lab},le="+Inf"}}')
        check(cnt == n and inf == n and wd.get(f'spindle_worker_job_duration_seconds_sum{{{lab}}}', -1) >= 0,
              f'worker durations {pipeline}/{outcome}: count {cnt}, +Inf {inf}, want {n}: {sorted(wd)[:4]}')
    lat = wlast.get('spindle_stage_latency_seconds', {})
    counts = {k: v for k, v in lat.items() if k.startswith('spindle_stage_latency_seconds_count{pipeline="synthetic"')}
    check(counts and all(v > 0 for v in counts.values()), f'every stage of synthetic was called: {counts}')
    inf = {k: v for k, v in lat.items() if 'le="+Inf"' in k}
    check(all(inf[k] == counts.get(k.replace('_bucket', '_count').replace(',le="+Inf"', ''), -1) for k in inf),
          f'+Inf bucket equals the count: {inf} {counts}')
    batch = wlast.get('spindle_stage_batch_size', {})
    msgs = [v for k, v in batch.items() if k.startswith('spindle_stage_batch_size_sum{pipeline="synthetic"')]
    check(msgs and max(msgs) >= 60, f'synthetic: 3 jobs x 20 frames went through a stage in batches: {batch}')
    check(wlast.get('spindle_devices_usable', {}).get('spindle_devices_usable', 0) >= 1, 'worker: a usable device')
    load = wlast.get('spindle_pipeline_load_seconds', {}).get('spindle_pipeline_load_seconds{pipeline="synthetic"}')
    check(load is not None and load > 0, f'pipeline load time: {load}')
    ev = last.get('spindle_job_events_total', {})
    for event, n in [('submitted', 5), ('succeeded', 3), ('failed', 1), ('dead', 1), ('cancelled', 1)]:
        key = 'spindle_job_events_total{event="%s"}' % event
        check(ev.get(key) == n, f'events {event}: {ev.get(key)}, expected {n}')
    # SQLite: the gateway makes every move of its queue, so the queue's
    # count is the gateway's, event by event.
    qev = last.get('spindle_queue_events_total', {})
    check({k.replace('spindle_job_events_total', ''): v for k, v in ev.items()}
          == {k.replace('spindle_queue_events_total', ''): v for k, v in qev.items()} and len(ev) == 8,
          f'queue events {qev} differ from the gateway\'s {ev}')
    check(last['spindle_workers'].get('spindle_workers{kind="remote"}') == 1, f'workers: {last.get("spindle_workers")}')
    qw = last.get('spindle_queue_workers', {})
    check(qw.get('spindle_queue_workers{kind="remote",state="live"}') == 1 and
          qw.get('spindle_queue_workers{kind="local",state="live"}') == 0 and sum(qw.values()) == 1,
          f'the queue\'s workers, on SQLite this gateway\'s (no slots, one remote worker): {qw}')
    check(last['spindle_jobs'].get('spindle_jobs{state="succeeded"}') == 3, 'jobs succeeded')
    dur = last.get('spindle_job_duration_seconds', {})
    check(dur.get('spindle_job_duration_seconds_count{pipeline="synthetic",outcome="succeeded"}') == 3,
          f'duration count: {dur}')
    check(len([k for k in last.get('spindle_device_memory_total_bytes', {})]) == 2, 'two NVML devices')

    for p in reversed(procs):
        p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            check(False, 'a process did not stop on SIGTERM')
    gw_err.close()
    wk_err.close()

    # Logs: every line one JSON object.
    events = []
    for who in ['gateway', 'worker']:
        lines = open(os.path.join(tmp, f'{who}.err'), encoding='utf-8').read().splitlines()
        check(lines, f'{who}: wrote no log line')
        for ln in lines:
            try:
                o = json.loads(ln)
            except json.JSONDecodeError:
                check(False, f'{who}: not a JSON line: {ln!r}')
                continue
            check(isinstance(o, dict) and {'ts', 'level', 'msg'} <= o.keys(), f'{who}: missing ts/level/msg: {ln}')
            check(re.match(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$', o.get('ts', '')), f'{who}: ts: {ln}')
            check(o.get('level') in ('debug', 'info', 'warn', 'error'), f'{who}: level: {ln}')
            if 'event' in o:
                events.append(o)
    def evs(job, name):
        return [e for e in events if e.get('job_id') == ids[job] and e['event'] == name]
    for job in ['s1', 's2', 's3']:
        for name in ['submitted', 'leased', 'succeeded']:
            check(len(evs(job, name)) == 1, f'job {job}: {len(evs(job, name))} {name} lines')
        s = evs(job, 'succeeded')
        check(s and s[0].get('attempt') == 1 and isinstance(s[0].get('duration_ms'), int)
              and s[0].get('pipeline') == 'synthetic', f'job {job} succeeded line: {s}')
    check(len(evs('bad', 'leased')) == 2, f'bad: leased {len(evs("bad", "leased"))} times, expected 2')
    f1, d1 = evs('bad', 'failed'), evs('bad', 'dead')
    check(len(f1) == 1 and f1[0]['level'] == 'warn' and f1[0].get('attempt') == 1, f'bad failed: {f1}')
    check(len(d1) == 1 and d1[0]['level'] == 'error' and d1[0].get('attempt') == 2, f'bad dead: {d1}')
    check(len(evs('gone', 'cancelled')) == 1, 'gone: no cancelled line')
    check(any(e.get('worker') == 'w1' or 'w1' in str(e.get('worker', '')) for e in evs('s1', 'leased')),
          f'leased line names the worker: {evs("s1", "leased")}')
    reasons = [e for e in events if e.get('job_id') == ids['bad'] and 'attempt 1: requested failure' in e['msg']]
    check(len(reasons) == 1, f'the first attempt\'s error is printed {len(reasons)} times, expected once')
finally:
    for p in procs:
        if p.poll() is None:
            p.kill()
print('FAILED' if failures else 'OK')
sys.exit(1 if failures else 0)
