"""An SSH server on loopback for the cluster tests: a throwaway host key and client key,
an isolated home, never the machine's own SSH configuration.

``LoopbackSSH`` starts ``sshd -D`` on a free port of 127.0.0.1 (and 127.0.0.2) with its
own config in a temporary folder. Every session runs through a wrapper that sets HOME to
the test's home (so `ray up`'s file mounts, ~/.bashrc and ~/ray_bootstrap_*.yaml land
there) and the environment the test asks for. Clients reach the port through
``relay.py`` (an SSH ProxyCommand), since Ray's local provider always dials port 22.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

RELAY = """import os, select, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
fds = [sys.stdin.fileno(), s]
while True:
    r, _, _ = select.select(fds, [], [])
    if sys.stdin.fileno() in r:
        data = os.read(sys.stdin.fileno(), 65536)
        if not data:
            s.shutdown(socket.SHUT_WR)
            fds.remove(sys.stdin.fileno())
        else:
            s.sendall(data)
    if s in r:
        data = s.recv(65536)
        if not data:
            break
        os.write(sys.stdout.fileno(), data)
"""


# ports handed to servers that bind them later (sshd, MLflow, a Ray head's GCS): outside
# Linux's ephemeral range (32768-60999, where every client socket takes its source port
# and port 0 binds) and Ray's worker ports (10002-19999), so that no other process takes
# one in the seconds before its server binds it (a GCS port from port 0 was once taken)
QUIET_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port no socket on 127.0.0.1 holds now, from ``QUIET_PORTS``."""
    for port in random.sample(QUIET_PORTS, 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 in {QUIET_PORTS.start}-{QUIET_PORTS.stop - 1}")


def descendants(pid: int) -> list[int]:
    """The processes below ``pid`` now (children, theirs, ...), from ``ps``."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True)
    children: dict[int, list[int]] = {}
    for line in out.stdout.splitlines():
        child, parent = (int(x) for x in line.split())
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class LoopbackSSH:
    def __init__(self, root: Path, env: dict[str, str], listen: tuple[str, ...] = ()):
        """``listen``: addresses besides 127.0.0.1 and 127.0.0.2 (e.g. a bridge's)."""
        self.root = root
        self.listen = ("127.0.0.1", "127.0.0.2", *listen)
        self.home = root / "home"
        self.port = free_port()
        self.key = root / "id_ed25519"
        self.relay = root / "relay.py"
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._made_run_dir = False

    def start(self, timeout_s: float = 30.0) -> None:
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        self.root.mkdir(parents=True, exist_ok=True)
        for key in (self.root / "host_key", self.key):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
        (self.root / "authorized_keys").write_text(self.key.with_suffix(".pub").read_text())
        os.chmod(self.root / "authorized_keys", 0o600)
        self.relay.write_text(RELAY)
        config = self.write_config(self.root, self.home, self.port, self.listen)
        if not Path("/run/sshd").is_dir():  # sshd's privilege-separation directory
            Path("/run/sshd").mkdir(mode=0o755, parents=True)
            self._made_run_dir = True
        self.proc = subprocess.Popen(
            [sshd, "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.root / "sshd.log", "w"),  # noqa: SIM115 - kept while it runs
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError((self.root / "sshd.log").read_text())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def write_config(self, root: Path, home: Path, port: int, listen) -> Path:
        """An sshd config in ``root`` with this server's keys, listening on ``port`` of
        ``listen``, every session run by a wrapper with HOME=``home`` and the test's
        environment. -> the config's path"""
        exports = "".join(f"export {k}='{v}'\n" for k, v in self.env.items())
        # ssh expands "~/" in -i from the passwd entry, not from HOME: the head's
        # autoscaler dials the workers with -i ~/ray_bootstrap_key.pem, which must be
        # the one in the test's home (on a real machine the two homes are one)
        tools = self.root / "bin"
        tools.mkdir(exist_ok=True)
        (tools / "ssh").write_text(
            "#!/bin/bash\nargs=()\nkey=0\n"  # the value of -i only (not the remote command)
            'for a in "$@"; do\n'
            '  if [ $key = 1 ]; then case "$a" in "~/"*) a="$HOME/${a#\\~/}";; esac; fi\n'
            '  [ "$a" = -i ] && key=1 || key=0; args+=("$a")\ndone\n'
            f'exec {shutil.which("ssh") or "/usr/bin/ssh"} "${{args[@]}}"\n'
        )
        os.chmod(tools / "ssh", 0o755)
        exports += f'export PATH="{tools}:$PATH"\n'
        home.mkdir(parents=True, exist_ok=True)  # Ray's commands run login shells, which
        (home / ".bashrc").write_text(f'export PATH="{tools}:$PATH"\n')  # reset PATH
        wrapper = root / "session.sh"
        wrapper.write_text(
            "#!/bin/bash\n"
            f"export HOME='{home}'\n{exports}cd \"$HOME\"\n"
            'if [ -n "$SSH_ORIGINAL_COMMAND" ]; then exec /bin/bash -c "$SSH_ORIGINAL_COMMAND"; '
            "else exec /bin/bash -l; fi\n"
        )
        os.chmod(wrapper, 0o755)
        user = (
            os.environ.get("USER")
            or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
        )
        config = root / "sshd_config"
        config.write_text(
            f"Port {port}\n"
            + "".join(f"ListenAddress {a}\n" for a in listen)
            + f"HostKey {self.root / 'host_key'}\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            f"PidFile {root / 'sshd.pid'}\n"
            "StrictModes no\nUsePAM no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
            f"AllowUsers {user}\nForceCommand {wrapper}\nX11Forwarding no\n"
            "MaxStartups 100\nMaxSessions 100\n"
        )
        return config

    def proxy_command(self, port: int | None = None) -> str:
        return f"{sys.executable} {self.relay} %h {port or self.port}"

    def ssh(
        self, host: str, command: str, timeout: float = 60, port: int | None = None
    ) -> subprocess.CompletedProcess:
        """``command`` over SSH on ``host``, through the relay to ``port`` (default: this
        server's)."""
        proxy = self.proxy_command() if port is None else self.proxy_command(port)
        return subprocess.run(
            [
                "ssh",
                "-i",
                str(self.key),
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                f"UserKnownHostsFile={os.devnull}",
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                f"ProxyCommand={proxy}",
                f"{os.environ.get('USER', 'root')}@{host}",
                command,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> None:
        """The server, and the sessions it forked: sshd -D leaves them running when it is
        stopped (with their clients' relays waiting on them)."""
        if self.proc is not None and self.proc.poll() is None:
            sessions = descendants(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):  # ended with the server
                    os.kill(pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self._made_run_dir:
            shutil.rmtree("/run/sshd", ignore_errors=True)
