"""Several `cache-server serve` processes on one store and one coordination database, as a scaled-out
deployment runs them (one per GPU), each startable, killable (SIGKILL) and restartable by name."""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from testing.servers import free_port, serve_command, wait_healthy


@dataclass
class Fleet:
    """`cache-server serve --model model --store store --db db *extra`, one process per instance name."""

    model: Path
    store: str
    db: str
    logs: Path
    extra: tuple[str, ...] = ()
    procs: dict[str, tuple[subprocess.Popen[bytes], str]] = field(default_factory=dict)

    def start(self, instance: str, *, wait: bool = True) -> str:
        """Starts the instance (its output in `<logs>/<instance>.log`); its URL, once healthy if `wait`."""
        port = free_port()
        cmd = serve_command(self.model, self.store, port, "--db", self.db, "--instance", instance, *self.extra)
        log = self.logs / f"{instance}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        self.procs[instance] = (proc, url)
        if wait:
            wait_healthy(url, proc, log)
        return url

    def wait_all(self) -> list[str]:
        """Waits until every instance is healthy; their URLs."""
        for instance, (proc, url) in self.procs.items():
            wait_healthy(url, proc, self.logs / f"{instance}.log")
        return [url for _, url in self.procs.values()]

    def url(self, instance: str) -> str:
        """A running instance's URL."""
        return self.procs[instance][1]

    def kill(self, instance: str) -> None:
        """SIGKILL: no shutdown, no lease released, whatever it was writing left half-written."""
        proc, _ = self.procs.pop(instance)
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        """SIGTERM every instance and wait for it."""
        for proc, _ in self.procs.values():
            proc.terminate()
        for proc, _ in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
