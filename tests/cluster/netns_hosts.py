"""Worker hosts for the cluster tests: each a Linux network namespace with its own
address and its own sshd, i.e. a second machine in every way Ray's cluster launcher can
see (its own IP, an SSH login, its own raylet), while sharing this machine's files.

``NamespaceHosts(prefix, count)`` makes a bridge on the host side with the first address
of a private /24 (the head's cluster address) and, per worker, a namespace joined to the
bridge by a veth pair, with the next address and loopback up. ``start_sshd`` runs an sshd
inside each namespace on the given port, with the keys and the session wrapper of a
:class:`tests.cluster.sshd_loopback.LoopbackSSH` but a home of its own (so `ray up`'s
file mounts and setup land there, as on another machine). ``close`` kills every process
left in the namespaces and removes them; ``sweep_stale`` removes what a crashed earlier
run left (names start with ``PREFIX``). Needs root and ``ip`` (``available()`` says why
not).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PREFIX = "rcw"  # every namespace, bridge and veth of these tests is named rcw*


def available() -> str | None:
    """None where namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "needs iproute2's ip"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res


def namespace_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def kill_namespace_processes(ns: str, keep: set[int] = frozenset(), wait_s: float = 10.0) -> None:
    """SIGKILL every process in ``ns`` but ``keep`` (as a machine that lost power)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        left = [p for p in namespace_pids(ns) if p not in keep]
        if not left:
            return
        for p in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        time.sleep(0.2)


def sweep_stale() -> None:
    """Remove the namespaces and links a crashed earlier run of these tests left."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        ns = line.split()[0] if line.strip() else ""
        if ns.startswith(PREFIX):
            kill_namespace_processes(ns)
            _ip("netns", "del", ns, check=False)
    links = _ip("-o", "link", "show", check=False).stdout
    for line in links.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith(PREFIX):
            _ip("link", "del", name, check=False)


class NamespaceHosts:
    def __init__(self, tag: str, count: int, subnet: int = 77):
        self.tag = tag  # a few characters making this run's names unique
        self.count = count
        self.net = f"10.{subnet}.{os.getpid() % 200 + 20}"
        self.head_ip = f"{self.net}.1"
        self.bridge = f"{PREFIX}b{tag}"
        self.names = [f"{PREFIX}{tag}{i}" for i in range(count)]
        self.ips = [f"{self.net}.{i + 2}" for i in range(count)]
        self.sshd: list[subprocess.Popen] = []

    def open(self) -> NamespaceHosts:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.head_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, ip) in enumerate(zip(self.names, self.ips, strict=True)):
            outer, inner = f"{PREFIX}v{self.tag}{i}", f"{PREFIX}n{self.tag}{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("addr", "add", f"{ip}/24", "dev", inner, ns=ns)
            _ip("link", "set", inner, "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)
            _ip("route", "add", "default", "via", self.head_ip, ns=ns)
        return self

    def start_sshd(self, ssh, port: int = 22, timeout_s: float = 30.0) -> list[Path]:
        """An sshd in each namespace on ``port`` (22, which Ray's autoscaler dials: it
        does not pass ``auth.ssh_proxy_command`` on to the head), with ``ssh``'s keys (a
        LoopbackSSH already started) and a home of its own. -> the homes"""
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        homes = []
        for ns, ip in zip(self.names, self.ips, strict=True):
            root = ssh.root / ns
            home = root / "home"
            config = ssh.write_config(root, home, port, [ip])
            self.sshd.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", ns, sshd, "-D", "-e", "-f", str(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=open(root / "sshd.log", "w"),  # noqa: SIM115 - kept while it runs
                )
            )
            homes.append(home)
        deadline = time.monotonic() + timeout_s
        for ip, proc in zip(self.ips, self.sshd, strict=True):
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"sshd in the namespace of {ip} exited")
                try:
                    with socket.create_connection((ip, port), timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        return homes

    def sshd_pids(self) -> set[int]:
        return {p.pid for p in self.sshd}

    def close(self) -> None:
        for ns in self.names:
            kill_namespace_processes(ns)
            _ip("netns", "del", ns, check=False)
        for p in self.sshd:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
        _ip("link", "del", self.bridge, check=False)
