"""A SeaweedFS with replication across two volume servers, for fault tests.

``harness.services.start_seaweedfs`` runs everything in one ``weed server`` process: one
volume server, no replica. This module starts the parts as separate processes, each a
``Service`` of ``harness.services`` (its own process group and log, stopped by process id):

- a master (``weed master -defaultReplication=001``: every volume has a second copy on
  another volume server of the same rack);
- two volume servers (``weed volume``), each with a folder and ports of its own, so one can
  be killed with ``SIGKILL`` and started again on the same ports and folder;
- a filer (``weed filer``) and the S3 gateway (``weed s3``) with one S3 identity of its own.

What SeaweedFS 4.48 does with a replica down (tried with this module, see
docs/operations.md): a volume server holds a gRPC heartbeat stream to the master; killed,
its sockets close and the master drops it at once and takes every volume with a copy there
out of the writable list. A write needs every copy (W = N, R = 1), so with two servers and
``001`` no volume is writable until the server is back: the S3 gateway holds a write,
retrying, and answers 500 after about 30 s (a write still waiting when the server is back
goes through), while reads of what was written before go on from the surviving copy.

The gateway is a ``weed s3`` of its own: tried first, ``weed filer -s3`` had not opened
its S3 port after 60 s.

Every port is a free loopback port given explicitly (HTTP and gRPC of each part; the
gateway's fixed-port extras, Iceberg and Lance, are off), so several can run at once.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.services import (
    S3Endpoint,
    Service,
    _http_answers,
    _http_ok,
    _spawn,
    _wait_until,
    free_port,
    seaweedfs_binary,
)
from microcheckpoint.errors import ServiceError

__all__ = ["ReplicatedSeaweed", "VolumeServer", "start_replicated_seaweedfs"]

# Grow one volume (with its copies) at a time: every bucket is a collection of its own.
_MASTER_TOML = """[master.volume_growth]
copy_1 = 1
copy_2 = 1
copy_3 = 1
copy_other = 1
"""


@dataclass
class VolumeServer:
    """One ``weed volume`` process and what it needs to start again the same way."""

    index: int
    port: int
    grpc_port: int
    folder: Path
    service: Service | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass
class ReplicatedSeaweed:
    """A running replicated SeaweedFS: ``endpoint`` is its S3 gateway.

    Attributes:
        endpoint: the S3 gateway's URL and the identity it accepts.
        master: the ``weed master`` process; ``master_url`` its HTTP address.
        volumes: the volume servers, by index (0 and 1).
        replication: the master's default replication (``001``).
        log_dir: where each process's log goes.
        filer: the ``weed filer`` process (None until started).
        gateway: the ``weed s3`` process (None until started).
    """

    endpoint: S3Endpoint
    master: Service
    master_url: str
    volumes: list[VolumeServer]
    replication: str
    log_dir: Path
    filer: Service | None = None
    gateway: Service | None = None
    _master_address: str = field(repr=False, default="")  # HOST:HTTP.GRPC

    @property
    def services(self) -> list[Service]:
        """Every running process, master first (stop in reverse)."""
        volumes = [v.service for v in self.volumes]
        every = [self.master, *volumes, self.filer, self.gateway]
        return [service for service in every if service is not None]

    def data_nodes(self) -> set[str]:
        """The volume servers the master lists now (``127.0.0.1:PORT``); empty if it is down."""
        try:
            with urllib.request.urlopen(self.master_url + "/dir/status", timeout=2.0) as reply:
                topology = json.loads(reply.read())["Topology"]
        except (OSError, ValueError, KeyError):
            return set()
        return {
            node["Url"]
            for center in topology.get("DataCenters") or []
            for rack in center.get("Racks") or []
            for node in rack.get("DataNodes") or []
        }

    def kill_volume(self, index: int) -> None:
        """``SIGKILL`` the ``weed volume`` process of server ``index`` (no clean shutdown: it
        sends no goodbye to the master) and wait until the master no longer lists it.

        Edge case: killing a server already down is a no-op.
        """
        server = self.volumes[index]
        if server.service is None:
            return
        server.service.stop(timeout=5.0, sig=signal.SIGKILL)
        server.service = None
        self._wait_nodes(lambda nodes: server.address not in nodes, f"drop {server.address}")

    def restart_volume(self, index: int, timeout: float = 30.0) -> Service:
        """Start volume server ``index`` again on its ports and folder; return once the
        master lists it again (its volumes are writable from then on)."""
        server = self.volumes[index]
        if server.service is not None and server.service.alive():
            raise ServiceError(f"volume server {server.address} is running; kill it first")
        server.service = _start_volume(server, self._master_address, self.log_dir, timeout)
        self._wait_nodes(lambda nodes: server.address in nodes, f"list {server.address}")
        return server.service

    def stop(self) -> None:
        """Stop every process this cluster started, the gateway first."""
        for service in reversed(self.services):
            service.stop()
        for server in self.volumes:
            server.service = None

    def _wait_nodes(
        self, done: Callable[[set[str]], bool], what: str, timeout: float = 30.0
    ) -> None:
        """Wait until ``done(listed volume servers)``; raise ServiceError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not done(self.data_nodes()):
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"the SeaweedFS master {self.master_url} did not {what} within "
                    f"{timeout:.0f}s (lists {sorted(self.data_nodes())}); see {self.master.log_path}"
                )
            time.sleep(0.05)


def _weed(service: str, *flags: str, config_dir: Path | None = None) -> list[str]:
    """A ``weed`` command line on loopback (``-config_dir`` is a global flag: before it)."""
    argv = [str(seaweedfs_binary())]
    argv += [f"-config_dir={config_dir}"] if config_dir is not None else []
    return [*argv, service, "-ip=127.0.0.1", "-ip.bind=127.0.0.1", *flags]


def _run(name: str, argv: list[str], log_dir: Path, address: str, ready, timeout: float) -> Service:
    """``_spawn`` one part, then wait until ``ready()``; its data is throwaway, so ``stop``
    gives it 2 s after SIGTERM (the filer can wait minutes for its streams to end)."""
    service = _spawn(name, argv, dict(os.environ), log_dir, address)
    service.grace = 2.0
    _wait_until(service, ready, timeout)
    return service


def _start_volume(server: VolumeServer, master: str, log_dir: Path, timeout: float) -> Service:
    argv = _weed(
        "volume",
        f"-dir={server.folder}",
        f"-port={server.port}",
        f"-port.grpc={server.grpc_port}",
        f"-master={master}",
        "-max=0",  # as many volumes as the disk holds
        "-preStopSeconds=0",  # stop at once on SIGTERM (the default waits 10 s)
    )
    name = f"seaweedfs-volume{server.index}-{server.port}"
    status = f"http://{server.address}/status"
    return _run(name, argv, log_dir, server.address, lambda: _http_ok(status), timeout)


def _identity(endpoint: S3Endpoint, path: Path) -> Path:
    """Write the gateway's one identity (readable by this user only) to ``path``."""
    identity = {
        "name": "microcheckpoint",
        "credentials": [{"accessKey": endpoint.access_key, "secretKey": endpoint.secret_key}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    path.write_text(json.dumps({"identities": [identity]}))
    path.chmod(0o600)
    return path


def start_replicated_seaweedfs(
    log_dir: Path, replication: str = "001", timeout: float = 60.0
) -> ReplicatedSeaweed:
    """Start a master, two volume servers, a filer and the S3 gateway on loopback.

    1. Ports and folders: a free port for each HTTP and gRPC listener; data under
       ``<log_dir>/seaweedfs-repl-<s3 port>/``.
    2. The master, with ``master.toml`` (grow one volume at a time) and ``replication``.
    3. The two volume servers; wait until the master lists both (before that, a
       replicated volume cannot be grown and the first write would fail).
    4. The filer (its metadata in a LevelDB folder of its own); wait until it answers.
    5. The S3 gateway (``weed s3``) with its identity; wait for its health check.

    Args:
        log_dir: where the data folder and each process's log go.
        replication: the master's ``-defaultReplication``; ``001`` (a second copy on the
            other server of the rack) fits two servers. ``010`` would need two racks.
        timeout: seconds each part has to answer.

    Raises:
        ServiceError: a part exited or did not answer in time (what started is stopped).
    """
    # Step 1
    names = ("s3", "s3g", "m", "mg", "f", "fg", "v0", "v0g", "v1", "v1g")
    port = {name: free_port() for name in names}
    data = log_dir / f"seaweedfs-repl-{port['s3']}"
    for folder in ("master", "filer", "volume0", "volume1"):
        (data / folder).mkdir(parents=True, exist_ok=True)
    (data / "master.toml").write_text(_MASTER_TOML)  # read from -config_dir
    endpoint = S3Endpoint(
        f"http://127.0.0.1:{port['s3']}",
        access_key=f"MCPREPL{secrets.token_hex(6).upper()}",
        secret_key=secrets.token_urlsafe(24),
    )
    master = f"127.0.0.1:{port['m']}.{port['mg']}"  # HOST:HTTP.GRPC names both ports
    filer_address = f"127.0.0.1:{port['f']}.{port['fg']}"
    master_url, filer_url = f"http://127.0.0.1:{port['m']}", f"http://127.0.0.1:{port['f']}"
    started: list[Service] = []
    try:
        # Step 2
        argv = _weed(
            "master",
            f"-mdir={data / 'master'}",
            f"-port={port['m']}",
            f"-port.grpc={port['mg']}",
            "-peers=none",  # one master: no Raft quorum to wait for
            f"-defaultReplication={replication}",
            "-volumeSizeLimitMB=64",
            "-telemetry=false",
            config_dir=data,
        )
        ready = lambda: _http_ok(master_url + "/cluster/status")  # noqa: E731
        started.append(_run(f"seaweedfs-master-{port['m']}", argv, log_dir, master, ready, timeout))
        cluster = ReplicatedSeaweed(endpoint, started[0], master_url, [], replication, log_dir)
        cluster._master_address = master
        # Step 3
        for i in (0, 1):
            server = VolumeServer(i, port[f"v{i}"], port[f"v{i}g"], data / f"volume{i}")
            server.service = _start_volume(server, master, log_dir, timeout)
            started.append(server.service)
            cluster.volumes.append(server)
        cluster._wait_nodes(lambda nodes: len(nodes) == 2, "list both volume servers", timeout)
        # Step 4
        argv = _weed(
            "filer",
            f"-master={master}",
            f"-port={port['f']}",
            f"-port.grpc={port['fg']}",
            f"-defaultStoreDir={data / 'filer'}",
        )
        ready = lambda: _http_answers(filer_url + "/")  # noqa: E731
        cluster.filer = _run(
            f"seaweedfs-filer-{port['f']}", argv, log_dir, filer_url, ready, timeout
        )
        started.append(cluster.filer)
        # Step 5
        argv = _weed(
            "s3",
            f"-filer={filer_address}",
            f"-port={port['s3']}",
            f"-port.grpc={port['s3g']}",
            "-port.iceberg=0",  # the gateway's extras listen on fixed ports: off
            "-port.lance=0",
            "-autoCreateBucket=false",  # as AWS S3: a write to a missing bucket fails
            f"-config={_identity(endpoint, data / 's3.json')}",
        )
        ready = lambda: _http_ok(endpoint.url + "/healthz")  # noqa: E731
        cluster.gateway = _run(
            f"seaweedfs-s3-{port['s3']}", argv, log_dir, endpoint.url, ready, timeout
        )
        started.append(cluster.gateway)
        return cluster
    except BaseException:
        for service in reversed(started):
            service.stop()
        raise
