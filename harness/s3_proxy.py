"""An S3 fault proxy for tests: an HTTP proxy between boto3 and the S3 server that injects
faults by rule.

Point the S3 client at ``proxy.url`` (``make_client(endpoint_url=proxy.url)``, or
``store_options["endpoint_url"]`` for the executors) and the proxy forwards every request to
the real server, except where a rule says otherwise:

- ``ERROR_500``: answer ``500 InternalError`` without forwarding (not applied);
- ``SLOW_DOWN``: answer ``503 SlowDown`` without forwarding (not applied);
- ``RESET``: reset the connection without forwarding (not applied, but the client cannot
  know: a conditional write comes back ``UNKNOWN``);
- ``SLOW``: wait ``delay_s``, then forward and answer normally;
- ``LOST_RESPONSE``: forward (the write is APPLIED), then reset the client's connection
  instead of answering (after ``delay_s``): the client sees its request fail;
- ``STRIP_IF_NONE_MATCH``: forward without ``If-None-Match``, as a store that ignores the
  condition does (it overwrites).

A rule matches by operation (``Op``), a glob over the object key (``fnmatch``: ``*`` also
matches ``/``), a probability drawn from the proxy's seeded generator, and an optional count
of faults after which it stops. The first matching rule whose draw succeeds applies. The
proxy counts what it injected (``injected``, ``faults``) and what it saw (``seen``,
``requests``), and logs every request with its HTTP method, ``Host`` header, client port,
status and start and end times (``log``, ``RequestRecord``), with how many were in flight at
once (``max_in_flight``): what ``bench/s3_requests.py`` counts an epoch's requests from.

Requests from several threads or processes arrive in an order the proxy does not control,
so a seed fixes the draws, not which request gets them.
"""

from __future__ import annotations

import fnmatch
import http.client
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

__all__ = [
    "FaultKind",
    "FaultRule",
    "InjectedFault",
    "Op",
    "RequestRecord",
    "S3FaultProxy",
    "classify",
]


class Op(Enum):
    """What an S3 request does, as the rules see it."""

    GET = "GET"  # GetObject, HeadObject
    PUT = "PUT"  # an unconditional PutObject
    CONDITIONAL_PUT = "CONDITIONAL_PUT"  # PutObject with If-None-Match or If-Match
    DELETE = "DELETE"  # DeleteObject(s)
    LIST = "LIST"  # ListObjectsV2 and the other bucket-level GETs
    OTHER = "OTHER"  # bucket creation and the like


class FaultKind(Enum):
    ERROR_500 = "500 InternalError"
    SLOW_DOWN = "503 SlowDown"
    RESET = "connection reset"
    SLOW = "slow response"
    LOST_RESPONSE = "lost response"
    STRIP_IF_NONE_MATCH = "If-None-Match stripped"


@dataclass
class FaultRule:
    """Inject ``kind`` into requests of ``ops`` whose key matches ``key``.

    Args:
        kind: the fault.
        ops: the operations it applies to (all by default).
        key: a glob over the object key, without the bucket (``"*/_metadata"``).
        probability: the chance, per matching request, that the fault is injected.
        count: inject at most this many faults (None: no limit).
        delay_s: how long ``SLOW`` waits before forwarding, and ``LOST_RESPONSE`` after.
    """

    kind: FaultKind
    ops: frozenset[Op] = frozenset(Op)
    key: str = "*"
    probability: float = 1.0
    count: int | None = None
    delay_s: float = 0.2
    injected: int = field(default=0, init=False)

    def matches(self, op: Op, key: str) -> bool:
        if self.count is not None and self.injected >= self.count:
            return False
        return op in self.ops and fnmatch.fnmatchcase(key, self.key)


@dataclass(frozen=True)
class InjectedFault:
    kind: FaultKind
    op: Op
    key: str


@dataclass(frozen=True)
class RequestRecord:
    """One request the proxy answered (or reset), as logged in ``S3FaultProxy.log``.

    Times are ``time.monotonic()`` seconds in this process: ``started`` when the request
    line arrived, ``ended`` after the answer was written (or the connection reset). A
    request reset before any answer has ``status`` None.
    """

    op: Op
    method: str  # the HTTP method: tells HEAD from GET, and DeleteObjects' POST
    key: str
    path: str  # the request path with its query (a LIST's prefix is in the query)
    host: str  # the Host header: which client endpoint sent it
    client_port: int  # the client's end of the connection
    started: float
    ended: float
    status: int | None
    body_bytes: int = 0  # the request's body (what a PUT uploads)
    answer_bytes: int = 0  # the answer's body (what a GET downloads)


def classify(method: str, path: str, headers: dict[str, str]) -> tuple[Op, str]:
    """The operation and object key of a path-style S3 request (``/bucket/key?query``)."""
    parts = urlsplit(path)
    _, _, key = parts.path.lstrip("/").partition("/")
    key = unquote(key)
    lowered = {name.lower() for name in headers}
    if method == "PUT":
        if not key:
            return Op.OTHER, key
        if "if-none-match" in lowered or "if-match" in lowered:
            return Op.CONDITIONAL_PUT, key
        return Op.PUT, key
    if method == "DELETE" or (method == "POST" and "delete" in parts.query):
        return Op.DELETE, key
    if method in ("GET", "HEAD"):
        return (Op.GET if key else Op.LIST), key
    return Op.OTHER, key


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te"}
_NOT_FORWARDED = _HOP_BY_HOP | {"expect"}  # the proxy answered 100-continue itself


class S3FaultProxy:
    """A fault-injecting HTTP proxy in front of ``upstream`` (``http://host:port``).

    Start it with ``start()`` or ``with S3FaultProxy(...) as proxy:``; it listens on a free
    loopback port (``url``) in threads of this process and stops with ``stop()``.
    """

    def __init__(
        self,
        upstream: str,
        seed: int = 0,
        host: str = "127.0.0.1",
        credentials: tuple[str, str, str] | None = None,
    ) -> None:
        """``credentials`` (access key, secret key, region) let the proxy sign again a
        request it changed (``STRIP_IF_NONE_MATCH``): a store that checks signatures, as
        SeaweedFS does, refuses a signed header that went missing. Without them the changed
        request goes with its old signature (fine for a store that checks none)."""
        self.credentials = credentials
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream {upstream!r} must be an http://host:port URL")
        self.upstream = (parts.hostname, parts.port or 80)
        self.rules: list[FaultRule] = []
        self.faults: list[InjectedFault] = []
        self.seen: Counter[Op] = Counter()
        self.requests: list[tuple[Op, str]] = []  # every request, in arrival order
        self.log: list[RequestRecord] = []  # every request, in the order they ended
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests in flight at once
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None
        self.url = f"http://{host}:{self._server.server_address[1]}"

    def _sign_again(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> list[tuple[str, str]]:
        """``headers`` with a new SigV4 signature over what is left of the request."""
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        assert self.credentials is not None
        access, secret, region = self.credentials
        stale = {"authorization", "x-amz-date", "x-amz-content-sha256"}
        kept = [(k, v) for k, v in headers if k.lower() not in stale]
        host = next(v for k, v in kept if k.lower() == "host")
        request = AWSRequest(method, f"http://{host}{path}", headers=dict(kept), data=body)
        S3SigV4Auth(Credentials(access, secret), "s3", region).add_auth(request)
        return list(request.headers.items())

    # ---- rules and counts ---------------------------------------------------------------

    def add(self, rule: FaultRule) -> FaultRule:
        """Add ``rule`` (after the others) and return it."""
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Remove every rule (the counts stay)."""
        with self._lock:
            self.rules.clear()

    @property
    def injected(self) -> Counter[FaultKind]:
        """Faults injected so far, per kind."""
        with self._lock:
            return Counter(f.kind for f in self.faults)

    def _choose(self, op: Op, key: str) -> FaultRule | None:
        with self._lock:
            self.seen[op] += 1
            self.requests.append((op, key))
            for rule in self.rules:
                if rule.matches(op, key) and self._random.random() < rule.probability:
                    rule.injected += 1
                    self.faults.append(InjectedFault(rule.kind, op, key))
                    return rule
        return None

    def _began(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _ended(self, record: RequestRecord) -> None:
        with self._lock:
            self.in_flight -= 1
            self.log.append(record)

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> S3FaultProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="s3-fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> S3FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the handler --------------------------------------------------------------------

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            upstream_conn: http.client.HTTPConnection | None = None

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: the tests read the counts, not a log

            def do_GET(self) -> None:
                self._logged()

            def _logged(self) -> None:
                """``_relay``, logged as a ``RequestRecord`` (the faults are ``_relay``'s)."""
                started = time.monotonic()
                self._status: int | None = None
                self._sizes = [0, 0]  # request body, answer body
                proxy._began()
                try:
                    self._relay()
                finally:
                    ended = time.monotonic()
                    op, key = classify(self.command, self.path, dict(self.headers.items()))
                    record = RequestRecord(
                        op=op,
                        method=self.command,
                        key=key,
                        path=self.path,
                        host=self.headers.get("Host", ""),
                        client_port=self.client_address[1],
                        started=started,
                        ended=ended,
                        status=self._status,
                        body_bytes=self._sizes[0],
                        answer_bytes=self._sizes[1],
                    )
                    proxy._ended(record)

            def send_response_only(self, code: int, message: str | None = None) -> None:
                self._status = code  # for the log
                super().send_response_only(code, message)

            do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        chunk = self.rfile.read(size)
                        self.rfile.readline()
                        if size == 0:
                            break
                        chunks.append(chunk)
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reset(self) -> None:
                """Close with an RST: the client sees a reset, not a clean end."""
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.close_connection = True
                self.connection.close()

            def _error(self, status: int, code: str, message: str) -> None:
                body = (
                    '<?xml version="1.0" encoding="UTF-8"?>\n'
                    f"<Error><Code>{code}</Code><Message>{message}</Message>"
                    f"<Resource>{self.path}</Resource><RequestId>fault-proxy</RequestId></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _forward(self, body: bytes, drop: set[str]) -> tuple[int, str, list, bytes]:
                headers = [
                    (k, v)
                    for k, v in self.headers.items()
                    if k.lower() not in _NOT_FORWARDED and k.lower() not in drop
                ]
                if body or self.command in ("PUT", "POST"):
                    headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
                    headers.append(("Content-Length", str(len(body))))
                if drop and proxy.credentials is not None:
                    headers = proxy._sign_again(self.command, self.path, headers, body)
                for attempt in (1, 2):
                    if self.upstream_conn is None:
                        self.upstream_conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                    conn = self.upstream_conn
                    try:
                        conn.putrequest(
                            self.command, self.path, skip_host=True, skip_accept_encoding=True
                        )
                        for k, v in headers:
                            conn.putheader(k, v)
                        conn.endheaders(body)
                        response = conn.getresponse()
                        data = response.read()
                        return response.status, response.reason, response.getheaders(), data
                    except (ConnectionError, http.client.HTTPException):
                        # A kept-alive upstream connection the server closed: open a new one.
                        conn.close()
                        self.upstream_conn = None
                        if attempt == 2:
                            raise
                raise AssertionError("unreachable")

            def _relay(self) -> None:
                body = self._body()
                self._sizes[0] = len(body)
                op, key = classify(self.command, self.path, dict(self.headers.items()))
                rule = proxy._choose(op, key)
                kind = rule.kind if rule is not None else None
                delay = rule.delay_s if rule is not None else 0.0
                # Faults that answer before the server sees the request.
                if kind is FaultKind.ERROR_500:
                    return self._error(500, "InternalError", "injected by the fault proxy")
                if kind is FaultKind.SLOW_DOWN:
                    return self._error(503, "SlowDown", "Please reduce your request rate.")
                if kind is FaultKind.RESET:
                    return self._reset()
                if kind is FaultKind.SLOW:
                    time.sleep(delay)
                drop = {"if-none-match"} if kind is FaultKind.STRIP_IF_NONE_MATCH else set()
                status, reason, headers, data = self._forward(body, drop)
                # The request was applied; a lost response never reaches the client.
                if kind is FaultKind.LOST_RESPONSE:
                    time.sleep(delay)
                    return self._reset()
                self.send_response_only(status, reason)
                head = self.command == "HEAD"  # keeps the object's Content-Length
                for k, v in headers:
                    if k.lower() not in _HOP_BY_HOP and (head or k.lower() != "content-length"):
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self._sizes[1] = len(data)
                    self.wfile.write(data)

            def finish(self) -> None:
                try:
                    super().finish()
                finally:
                    if self.upstream_conn is not None:
                        self.upstream_conn.close()

        return Handler
