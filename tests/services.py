"""Local stand-ins for the services a distributed tkg runs on: PostgreSQL (the Dagster instance
and the shared LLM cache), Redis (the Celery broker and result backend) and an S3-compatible
object store (moto in server mode, for the Parquet system of record).

Each one is started once per session, on 127.0.0.1 and a free port, inside a temporary
folder, and stopped at the end (their logs stay in that folder). Nothing here reaches beyond
127.0.0.1.

When a service's program or package is missing, its fixture skips the tests that need it and
says what to install; under CI (CI=true) it fails instead, because CI must run these tests
(`.ci/run` installs Debian's `postgresql` and `redis-server`, and `pip install -e '.[test]'`
brings moto).

The `running_*` context managers work outside pytest too, e.g. to try a deploy by hand:

    with running_postgres(Path("/tmp/pg")) as postgres: print(postgres.url())
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

HOST = "127.0.0.1"
START_TIMEOUT_SECONDS = 60


class ServiceUnavailable(Exception):
    """The service cannot run here (a program or package is missing); the message says which."""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(reason: str) -> NoReturn:
    """Skip the test that needs a missing service, or fail it under CI, where it must run."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so the `services` tests must run: see .ci/run)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def _log_tail(path: Path, characters: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-characters:]
    except OSError:
        return ""


def _wait_until_ready(name: str, process: subprocess.Popen, log: Path, ready) -> None:
    """Poll `ready()` until it returns True; raise with the service's log if the process exits
    or the time runs out."""
    deadline, last_error = time.monotonic() + START_TIMEOUT_SECONDS, None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode} while starting:\n{_log_tail(log)}")
        try:
            if ready():
                return
        except Exception as error:  # noqa: BLE001 - not accepting connections yet
            last_error = error
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not accept connections within {START_TIMEOUT_SECONDS} s (last: {last_error!r}):\n"
                       f"{_log_tail(log)}")


def _stop(process: subprocess.Popen, stop_signal: int = signal.SIGTERM, timeout: float = 30) -> None:
    if process.poll() is not None:
        return
    process.send_signal(stop_signal)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


# --- PostgreSQL --------------------------------------------------------------------------------

def postgres_bin() -> Path:
    """The folder holding `initdb` and `postgres`: on PATH, else Debian's newest
    /usr/lib/postgresql/<version>/bin."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(on_path).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda path: int(Path(path).parent.parent.name) if Path(path).parent.parent.name.isdigit() else 0)
    if not candidates:
        raise ServiceUnavailable("PostgreSQL is not installed (no initdb on PATH or in /usr/lib/postgresql/*/bin); "
                                 "install Debian's `postgresql` package")
    return Path(candidates[-1]).parent


def _server_user() -> pwd.struct_passwd | None:
    """PostgreSQL refuses to run as root: as root, run it as `postgres` (Debian's package makes
    that user), else as `nobody`. As anyone else, run it as ourselves (None)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise ServiceUnavailable("running as root and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as")


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    password: str
    database: str = "postgres"

    def url(self, database: str | None = None) -> str:
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{database or self.database}"

    def connect(self, database: str | None = None):
        import psycopg2

        return psycopg2.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                                dbname=database or self.database)

    def create_database(self, prefix: str) -> str:
        """A new, empty database (a fresh Dagster instance per test); returns its name."""
        name = f"{prefix}_{secrets.token_hex(4)}"
        connection = self.connect()
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')  # a generated name, not user input
        finally:
            connection.close()
        return name


def _store_password_as_md5(postgres: Postgres) -> None:
    """initdb stores the password as SCRAM; store it again as md5 (password_encryption=md5)."""
    connection = postgres.connect()
    try:
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER ROLE {postgres.user} PASSWORD %s", (postgres.password,))
    finally:
        connection.close()


@contextmanager
def running_postgres(folder: Path) -> Iterator[Postgres]:
    """A PostgreSQL server on 127.0.0.1 (TCP only, password authentication) whose cluster lives
    in `folder`, stopped when the block ends."""
    if importlib.util.find_spec("psycopg2") is None:
        raise ServiceUnavailable("psycopg2 is not installed; `pip install -e '.[test]'` brings it with dagster-postgres")
    binaries = postgres_bin()
    user = _server_user()
    folder.mkdir(parents=True, exist_ok=True)
    if user is not None:
        # The server's user cannot enter a root-only temporary folder: give it its own.
        cluster_parent = Path(tempfile.mkdtemp(prefix="tkg-postgres-"))
        os.chown(cluster_parent, user.pw_uid, user.pw_gid)
    else:
        cluster_parent = folder
    data, log = cluster_parent / "data", folder / "postgres.log"
    password = secrets.token_hex(12)
    password_file = cluster_parent / "password"
    password_file.write_text(password)
    process_user = {}
    if user is not None:
        os.chown(password_file, user.pw_uid, user.pw_gid)
        process_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    environment = {"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "HOME": str(cluster_parent)}
    try:
        with open(log, "ab") as output:
            initialised = subprocess.run(
                [str(binaries / "initdb"), "-D", str(data), "-U", "tkg", f"--pwfile={password_file}", "--auth=md5",
                 "--encoding=UTF8", "--locale=C", "--no-sync"],
                check=False, stdout=output, stderr=subprocess.STDOUT, env=environment, cwd=cluster_parent, **process_user)
        if initialised.returncode != 0:
            raise RuntimeError(f"initdb failed with code {initialised.returncode}:\n{_log_tail(log)}")
        port = free_port()
        # Durability is not what these tests check: fsync off makes schema creation fast. md5
        # rather than SCRAM passwords: Dagster opens a connection per query (NullPool), and
        # SCRAM's key stretching made connecting a third of the cost of a step on a worker.
        with open(log, "ab") as output:
            server = subprocess.Popen(
                [str(binaries / "postgres"), "-D", str(data), "-h", HOST, "-p", str(port), "-k", "",
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=300", "-c", "password_encryption=md5"],
                stdout=output, stderr=subprocess.STDOUT, env=environment, cwd=cluster_parent, **process_user)
        postgres = Postgres(HOST, port, "tkg", password)
        try:
            _wait_until_ready("PostgreSQL", server, log, lambda: postgres.connect().close() is None)
            _store_password_as_md5(postgres)
            yield postgres
        finally:
            _stop(server, signal.SIGINT)  # SIGINT: PostgreSQL's fast shutdown
    finally:
        if cluster_parent != folder:
            shutil.rmtree(cluster_parent, ignore_errors=True)


# --- Redis -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Redis:
    host: str
    port: int
    password: str

    def url(self, database: int = 0) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/{database}"

    def ping(self) -> bool:
        with socket.create_connection((self.host, self.port), timeout=2) as connection:
            connection.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
            answer = b""
            while b"PONG" not in answer and b"-" not in answer[:1]:
                chunk = connection.recv(64)
                if not chunk:
                    break
                answer += chunk
        return b"+PONG" in answer


@contextmanager
def running_redis(folder: Path) -> Iterator[Redis]:
    """A redis-server on 127.0.0.1 with a password and no persistence, stopped when the block ends."""
    program = shutil.which("redis-server")
    if program is None:
        raise ServiceUnavailable("redis-server is not installed; install Debian's `redis-server` package")
    folder.mkdir(parents=True, exist_ok=True)
    log, port, password = folder / "redis.log", free_port(), secrets.token_hex(12)
    config = folder / "redis.conf"  # the password goes in a file, not on a command line others can read
    config.write_text(f"bind {HOST}\nport {port}\nrequirepass {password}\nsave \"\"\nappendonly no\n"
                      f"dir {folder}\nprotected-mode yes\ndaemonize no\nloglevel warning\n")
    with open(log, "ab") as output:
        server = subprocess.Popen([program, str(config)], stdout=output, stderr=subprocess.STDOUT, cwd=folder)
    redis = Redis(HOST, port, password)
    try:
        _wait_until_ready("redis-server", server, log, redis.ping)
        yield redis
    finally:
        _stop(server)


# --- S3 (moto in server mode) ------------------------------------------------------------------

@dataclass(frozen=True)
class ObjectStore:
    endpoint_url: str
    access_key: str = "testing"
    secret_key: str = "testing"
    region: str = "us-east-1"

    def environment(self) -> dict[str, str]:
        """The standard AWS variables pointing boto3 and pyarrow at this server (and nowhere else)."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_DEFAULT_REGION": self.region,
                "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region)

    def create_bucket(self, prefix: str) -> str:
        """A new, empty bucket; returns its name."""
        name = f"{prefix}-{secrets.token_hex(4)}"
        self.client().create_bucket(Bucket=name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        paginator = self.client().get_paginator("list_objects_v2")
        return [item["Key"] for page in paginator.paginate(Bucket=bucket, Prefix=prefix) for item in page.get("Contents", [])]


@contextmanager
def running_object_store(folder: Path) -> Iterator[ObjectStore]:
    """moto's S3 server (`moto[server]`) in its own process on 127.0.0.1, stopped when the block ends."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
        raise ServiceUnavailable("moto's server is not installed; `pip install -e '.[test]'` brings moto[server]")
    folder.mkdir(parents=True, exist_ok=True)
    log, port = folder / "moto.log", free_port()
    environment = {name: value for name, value in os.environ.items() if not name.startswith("AWS_")}
    with open(log, "ab") as output:
        server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)], stdout=output,
                                  stderr=subprocess.STDOUT, cwd=folder, env=environment)
    store = ObjectStore(f"http://{HOST}:{port}")
    try:
        _wait_until_ready("moto S3 server", server, log, lambda: store.client().list_buckets() is not None)
        yield store
    finally:
        _stop(server)


# --- pytest fixtures ---------------------------------------------------------------------------

@contextmanager
def _service(starting) -> Iterator:
    with ExitStack() as stack:
        try:
            service = stack.enter_context(starting)
        except ServiceUnavailable as missing:  # not installed; one that is but fails to start is an error
            unavailable(str(missing))
        yield service


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory) -> Iterator[Postgres]:
    """A PostgreSQL server for the session; `create_database` gives each test its own database."""
    with _service(running_postgres(tmp_path_factory.mktemp("postgres"))) as postgres:
        yield postgres


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> Iterator[Redis]:
    """A Redis server for the session (Celery's broker and result backend)."""
    with _service(running_redis(tmp_path_factory.mktemp("redis"))) as redis:
        yield redis


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[ObjectStore]:
    """An S3-compatible server for the session; `create_bucket` gives each test its own bucket."""
    with _service(running_object_store(tmp_path_factory.mktemp("s3"))) as store:
        yield store
