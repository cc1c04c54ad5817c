"""A free loopback TCP port for a test's server, drawn below the kernel's
ephemeral range.

A port taken by binding port 0 comes from the ephemeral range
(net.ipv4.ip_local_port_range, 32768-60999 by default), the range every
outgoing connection and every port-0 bind of the tests running beside this
one also draws from: between the check and the server's own bind another
process can take it, and the server fails with "Address already in use"
(jobs-e2e-redis-drain did, under a loaded CI). Below that range only
servers told a port bind, so a port drawn at random there and found free is
very likely still free when the server binds it.
"""

import random
import socket


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    hi = min(_ephemeral_low(), 32768)
    lo = max(1024, hi - 12000)
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(lo, hi)
        with socket.socket() as so:
            try:
                so.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as so:  # that range is full: the kernel's choice
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]
