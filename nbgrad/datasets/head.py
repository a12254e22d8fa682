"""A Ray head node of our own on this machine (`ray start --head --block`, in a process session of its own), which
starts on a busy machine too; what the Ray tests connect to, locally (`ray.init(address=head.address)`) or through
its client server (`ray.init(head.client_address)`).

Why not `ray.init(num_cpus=2)`: its raylet waits a fixed 15 s for each port its dashboard agent writes to a file
when that agent picked the port itself, then ends ("The current node timed out during startup"). The agent's
start alone is seconds of CPU (`import ray`), many times that on a loaded machine. A head started here gives
every agent its port, so the raylet reads it instead of waiting: Ray passes the raylet the metrics and
runtime-env ports; the agent's listening port, which `ray start` takes but does not pass on, is written where
the raylet looks for it (the value the agent binds, and writes there itself once it is up). Ray's own limits
for a slow agent and slow workers are raised (`RAY_agent_register_timeout_ms`,
`RAY_worker_register_timeout_seconds`). The head authenticates as this process does (RAY_AUTH_MODE), so
that this process can connect to it. A start is tried a bounded number of times, each failure said, and a
failed start or a stop ends every process the head started."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..errors import NbgradError
from .waiting import off_main

SLOW_START_ENV = {"RAY_agent_register_timeout_ms": "600000", "RAY_worker_register_timeout_seconds": "600"}
STARTED = "Ray runtime started"
END_GRACE_S = 5     # `ray start --block` ends its children one by one, and its GCS and idle workers take 30 s to go


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def auth_mode() -> str:
    """The head's authentication: this process's (RAY_AUTH_MODE; unset is none), since a driver that connects to
    a given address uses its own and Ray enables a token for it only on request. With a token, one is made
    first if none exists (`ray get-auth-token --generate`, which keeps it in ~/.ray/auth_token)."""
    mode = os.environ.get("RAY_AUTH_MODE") or "disabled"
    if mode == "token" and not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
                                or (Path.home() / ".ray" / "auth_token").is_file()):
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "get-auth-token", "--generate"],
                       check=True, capture_output=True, timeout=300)
    return mode


class Head:
    """One head node: `address` (host:port of its GCS), `client_address` (ray://127.0.0.1:PORT when started with
    `client=True`), `stop()`."""

    def __init__(self, num_cpus: int = 2, resources: dict | None = None, client: bool = False,
                 env: dict | None = None, attempts: int = 3, start_s: float = 240):
        self.folder = tempfile.mkdtemp(prefix="ray-head-")
        self.env = {**os.environ, **SLOW_START_ENV, "RAY_AUTH_MODE": auth_mode(), **(env or {})}
        self.process, failures = None, []
        for attempt in range(attempts):
            ports = {name: free_port() for name in ("gcs", "client", "agent_grpc", "agent_http", "runtime_env",
                                                     "metrics")}
            try:
                self._start(ports, num_cpus, resources, client, start_s)
                return
            except BaseException as failure:     # an interrupt too: the head's session goes before it is raised
                off_main(self.stop, isinstance(failure, NbgradError))     # (a second one stops only the wait)
                if not isinstance(failure, NbgradError):
                    raise
                failures.append(f"attempt {attempt + 1}: {failure}")
        shutil.rmtree(self.folder, ignore_errors=True)
        raise NbgradError(f"a Ray head node (ray start --head) did not start in {attempts} attempts: "
                          + "; ".join(failures))

    def _start(self, ports: dict, num_cpus: int, resources: dict | None, client: bool, start_s: float) -> None:
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                   "--node-ip-address=127.0.0.1", f"--port={ports['gcs']}", f"--num-cpus={num_cpus}",
                   f"--resources={json.dumps(resources or {})}", "--include-dashboard=false",
                   "--disable-usage-stats", f"--temp-dir={self.folder}",
                   f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
                   f"--dashboard-agent-listen-port={ports['agent_http']}",
                   f"--runtime-env-agent-port={ports['runtime_env']}", f"--metrics-export-port={ports['metrics']}"]
        if client:
            command.append(f"--ray-client-server-port={ports['client']}")
        self.process = subprocess.Popen(command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)
        lines: list = []
        threading.Thread(target=lambda: lines.extend(self.process.stdout), daemon=True).start()
        deadline, written = time.monotonic() + start_s, False
        while self.process.poll() is None and time.monotonic() < deadline and not any(STARTED in line
                                                                                       for line in lines):
            written = written or _write_agent_port(self.folder, ports["agent_http"])
            time.sleep(0.2)
        if self.process.poll() is not None or not any(STARTED in line for line in lines):
            state = f"ended with {self.process.returncode}" if self.process.poll() is not None else \
                f"not started in {start_s:.0f} s"
            raise NbgradError(f"the head {state}: {_said(lines, self.folder)}")
        self.address = f"127.0.0.1:{ports['gcs']}"
        self.client_address = f"ray://127.0.0.1:{ports['client']}" if client else None

    def stop(self, keep_folder: bool = False) -> None:
        """End the head and every process it started (its process session), and remove its folder."""
        if self.process is not None:
            _end_session(self.process)
            self.process = None
        if not keep_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _write_agent_port(folder: str, port: int) -> bool:
    """Once the GCS has written its own port file (which names the session and the node), write the dashboard
    agent's listening port where the raylet waits for it. True when written."""
    found = sorted(Path(folder).glob("session_*/gcs_server_port_*"))
    if not found:
        return False
    node = found[-1].name.rsplit("_", 1)[1]
    target = found[-1].parent / f"dashboard_agent_listen_port_{node}"
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        partial.write_text(str(port))
        os.replace(partial, target)          # the raylet never reads half a file
    return True


def _said(lines: list, folder: str) -> str:
    """The head's last lines and the raylet's fatal line, if any: what failed."""
    said = "".join(lines[-3:]).strip()
    for log in Path(folder).glob("session_*/logs/raylet.out"):
        fatal = [line for line in log.read_text(errors="replace").splitlines() if "Check failed" in line]
        if fatal:
            said += " | raylet: " + fatal[-1][-300:]
    return said or "(no output)"


def _end_session(process: subprocess.Popen) -> None:
    """SIGTERM to the head's process group (`ray start --block` ends what it started), then SIGKILL to each
    process of its session still there after END_GRACE_S: nothing of the head outlives it (its folder goes next)."""
    import psutil
    members = _session_members(process.pid)
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _, alive = psutil.wait_procs(members, timeout=END_GRACE_S)
    for member in alive + _session_members(process.pid):
        try:
            member.kill()
        except psutil.Error:
            pass
    process.wait()


def _session_members(session: int) -> list:
    import psutil
    members = []
    for candidate in psutil.process_iter():
        try:
            if os.getsid(candidate.pid) == session and candidate.pid != os.getpid():
                members.append(candidate)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return members
