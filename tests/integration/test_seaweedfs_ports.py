"""SeaweedFS on a busy machine: a port chosen free but taken before ``weed`` binds it.

``start_seaweedfs`` picks eight free loopback ports; another process can take one of them
in the second or more before ``weed`` binds it (seen in ``make test``: its filer's gRPC
port, taken meanwhile, and every S3 test of that worker erred). It starts again on new
ports. Here the filer's gRPC port is one this test holds, so the first start must fail.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import services
from microcheckpoint.errors import ServiceError

FILER_GRPC = 7  # the eighth port start_seaweedfs asks for


def _taking(monkeypatch: pytest.MonkeyPatch, port: int, attempts: int) -> None:
    """The filer's gRPC port of the first start is ``port``; other ports are free ones."""
    real, calls = services.free_port, iter(range(1_000))
    monkeypatch.setattr(
        services, "free_port", lambda: port if next(calls) == FILER_GRPC else real()
    )
    monkeypatch.setattr(services, "SEAWEEDFS_PORT_ATTEMPTS", attempts)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port this test listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def test_a_port_taken_before_weed_binds_it_starts_seaweedfs_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken_port: int
) -> None:
    _taking(monkeypatch, taken_port, attempts=3)
    service, endpoint = services.start_seaweedfs(tmp_path)
    try:
        assert services._http_ok(endpoint.url + "/healthz")
        logs = sorted(tmp_path.glob("seaweedfs-*.log"))
        assert len(logs) == 2, logs  # the failed start's and this one's
        failed = [p for p in logs if p != service.log_path]
        assert "address already in use" in failed[0].read_text()
    finally:
        service.stop()


def test_without_a_second_attempt_the_taken_port_is_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, taken_port: int
) -> None:
    _taking(monkeypatch, taken_port, attempts=1)
    with pytest.raises(ServiceError, match="address already in use"):
        services.start_seaweedfs(tmp_path)
