"""Real Redis servers for the shared tier's tests and benchmarks: one standalone ``redis-server``, or a
Redis Cluster of masters (made with ``redis-cli --cluster create``) plus replicas. Every server listens
on a free loopback port, keeps nothing on disk (``--save '' --appendonly no``, files under a given work
directory) and is killed by :meth:`stop`."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from typing import List, Optional

__all__ = ["RedisServer", "RedisCluster", "free_port"]


def free_port() -> int:
    """A free loopback port whose +10000 (the cluster bus port) is free too."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair")


class RedisServer:
    """One ``redis-server`` process."""

    def __init__(self, workdir, cluster: bool = False, extra: Optional[List[str]] = None,
                 password: Optional[str] = None):
        self.port = free_port()
        self.password = password
        self.dir = os.path.join(str(workdir), f"redis-{self.port}")
        os.makedirs(self.dir, exist_ok=True)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", self.dir, "--logfile", os.path.join(self.dir, "log"),
                "--protected-mode", "yes"]
        if cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(self.dir, "nodes.conf"),
                     "--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no",
                     "--cluster-replica-validity-factor", "0", "--repl-diskless-sync-delay", "0"]
        if password:
            args += ["--requirepass", password]
        args += list(extra or [])
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}"
        self.wait_ready()

    def cli(self, *args, check=True, timeout=20) -> str:
        auth = ["-a", self.password, "--no-auth-warning"] if self.password else []
        r = subprocess.run(["redis-cli", "-p", str(self.port), *auth, *map(str, args)], capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"redis-cli {' '.join(map(str, args))}: {r.stderr}{r.stdout}")
        return r.stdout

    def wait_ready(self, timeout=10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server on {self.port} exited: {self.log()}")
            r = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True)
            if r.stdout.strip() == "PONG" or "NOAUTH" in r.stdout:
                return
            time.sleep(0.05)
        raise AssertionError(f"redis-server on {self.port} not ready: {self.log()}")

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "log")) as f:
                return f.read()[-2000:]
        except OSError:
            return ""

    def node_id(self) -> str:
        return self.cli("cluster", "myid").strip()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the server accepts connections (the kernel does) and never answers."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.kill()


class RedisCluster:
    """``masters`` cluster masters made with ``redis-cli --cluster create``, then ``replicas`` replicas
    of the first master (``add-node --cluster-slave``)."""

    def __init__(self, workdir, masters: int = 3, replicas: int = 0):
        self.masters = [RedisServer(workdir, cluster=True) for _ in range(masters)]
        self.replicas: List[RedisServer] = []
        addrs = [f"127.0.0.1:{s.port}" for s in self.masters]
        r = subprocess.run(["redis-cli", "--cluster", "create", *addrs, "--cluster-replicas", "0",
                            "--cluster-yes"], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            self.stop()
            raise AssertionError(f"cluster create failed: {r.stdout}{r.stderr}")
        self.wait_ok()
        for _ in range(replicas):
            rep = RedisServer(workdir, cluster=True)
            self.replicas.append(rep)
            # what `redis-cli --cluster add-node --cluster-slave` does, without its 1 s polling
            master_id = self.masters[0].node_id()
            rep.cli("cluster", "meet", "127.0.0.1", self.masters[0].port)
            self._wait(lambda: master_id in rep.cli("cluster", "nodes"), "replica meets the cluster")
            self._wait(lambda: rep.cli("cluster", "replicate", master_id, check=False).strip() == "OK",
                       "cluster replicate")
        for rep in self.replicas:
            self._wait(lambda: "master_link_status:up" in rep.cli("info", "replication"), "replica link up")
            # every master must know the replica as a replica before a failover: a takeover announced by a
            # node another master has not met yet is ignored there, and that master keeps routing the slots
            # to the dead node (seen: the slot map unchanged 15 s after a takeover)
            rep_id = rep.node_id()
            for m in self.masters[1:]:
                self._wait(lambda: any(line.startswith(rep_id) and "slave" in line.split()[2]
                                       for line in m.cli("cluster", "nodes").splitlines()),
                           f"master {m.port} knows replica {rep.port}")
        self.wait_ok()

    @property
    def urls(self) -> str:
        return ",".join(s.url for s in self.masters)

    def _wait(self, cond, what, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if cond():
                    return
            except AssertionError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"cluster: {what} not reached in {timeout} s")

    def wait_replicated(self, timeout: float = 20.0) -> None:
        """Wait until every replica has applied its master's replication stream up to now (its
        ``slave_repl_offset`` reaches the master's ``master_repl_offset`` read at the call).

        ``WAIT numreplicas`` sent from a fresh ``redis-cli`` does not do this: a connection that wrote
        nothing waits for offset 0, so it returns at once even while the replica still lacks the writes.

        Raises: AssertionError after ``timeout`` seconds."""
        def field(server, name):
            for line in server.cli("info", "replication").splitlines():
                if line.startswith(name + ":"):
                    return int(line.split(":", 1)[1])
            return -1

        target = field(self.masters[0], "master_repl_offset")
        for rep in self.replicas:
            self._wait(lambda: field(rep, "slave_repl_offset") >= target,
                       f"replica {rep.port} at the master's replication offset {target}", timeout)

    def wait_ok(self, servers=None) -> None:
        for s in servers or self.masters + self.replicas:
            self._wait(lambda: "cluster_state:ok" in s.cli("cluster", "info"), f"cluster_state:ok on {s.port}")

    def stop(self) -> None:
        for s in self.masters + self.replicas:
            s.stop()
