"""Real servers on 127.0.0.1 for the cluster tests: PostgreSQL (Debian's ``postgresql`` package)
and ``mlflow server`` with its basic-auth app. Each is started in a temp folder on a free port
and stopped afterwards; :class:`Unavailable` says why one cannot start (the tests then skip
with that reason, except under CI, where ``.ci/run`` installs PostgreSQL and they must run).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


class Unavailable(RuntimeError):
    """A server cannot be started here; the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_bindir() -> Path | None:
    """Folder of ``initdb`` / ``pg_ctl``: on PATH, else Debian's /usr/lib/postgresql/<ver>/bin."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    return Path(dirs[-1]) if dirs else None


class Postgres:
    """A throw-away PostgreSQL cluster on 127.0.0.1 with password (SCRAM) authentication.

    ``initdb`` refuses to run as root, so as root the cluster belongs to the ``postgres`` user
    (created by the Debian package) and commands run through ``runuser``.
    """

    def __init__(self, root: Path, password: str, user: str = "harness"):
        self.root, self.password, self.user = Path(root), password, user
        self.port = free_port()
        self.bindir = pg_bindir()
        if self.bindir is None:
            raise Unavailable("PostgreSQL is not installed (apt-get install postgresql)")
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise Unavailable("running as root and there is no 'postgres' user to own the cluster") from None
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.data = self.root / "pgdata"
        self.log = self.root / "postgres.log"

    def _run(self, *cmd: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120, **kw)

    def start(self) -> "Postgres":
        self.root.mkdir(parents=True, exist_ok=True)
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.as_user:
            shutil.chown(self.root, "postgres")
            shutil.chown(pwfile, "postgres")
        os.chmod(pwfile, 0o600)
        r = self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.user, f"--pwfile={pwfile}",
                      "--auth=scram-sha-256", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        if r.returncode:
            raise Unavailable(f"initdb failed: {r.stderr.strip()[-500:]}")
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c max_connections=200 -c fsync=off"
        r = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts,
                      "-w", "-t", "60", "start")
        if r.returncode:
            tail = self.log.read_text()[-800:] if self.log.exists() else r.stderr
            raise Unavailable(f"PostgreSQL did not start: {tail.strip()}")
        return self

    def createdb(self, name: str) -> str:
        """Create database ``name``; returns its URL *without* the password (libpq reads
        ``PGPASSWORD``, as a user's job should)."""
        env = {**os.environ, "PGPASSWORD": self.password}
        r = subprocess.run([str(self.bindir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user,
                            name], capture_output=True, text=True, env=env, timeout=60)
        if r.returncode:
            raise Unavailable(f"createdb {name} failed: {r.stderr.strip()}")
        return self.url(name)

    def url(self, db: str, with_password: bool = False) -> str:
        auth = f"{self.user}:{self.password}" if with_password else self.user
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{db}"

    def stop(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")


class MlflowServer:
    """``mlflow server --app-name basic-auth`` on 127.0.0.1 with ``backend`` as its store.

    The admin account is ``admin`` / ``admin_password`` (given to the server in
    ``MLFLOW_AUTH_ADMIN_PASSWORD``, never in a file); the users table lives in ``auth_db`` (a
    SQLAlchemy URL, here the same PostgreSQL server).
    """

    def __init__(self, root: Path, backend: str, admin_password: str, auth_db: str, env: dict | None = None):
        self.root, self.backend, self.admin_password, self.auth_db = Path(root), backend, admin_password, auth_db
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "mlflow-server.log"

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> "MlflowServer":
        self.root.mkdir(parents=True, exist_ok=True)
        ini = self.root / "basic_auth.ini"
        ini.write_text("[mlflow]\ndefault_permission = READ\n"  # no secret in the file: see env below
                       f"database_uri = {self.auth_db}\nadmin_username = admin\nauthorization_function = "
                       "mlflow.server.auth:authenticate_request_basic_auth\n"
                       # a checked password is trusted for 60 s: PBKDF2 on every request costs ~0.1 s of CPU
                       "auth_cache_ttl_seconds = 60\n")
        env = {**self.env, "MLFLOW_AUTH_CONFIG_PATH": str(ini), "MLFLOW_AUTH_ADMIN_PASSWORD": self.admin_password,
               "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-only-key"}
        for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            env.pop(k, None)
        cmd = [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend-store-uri", self.backend,
               "--artifacts-destination", str(self.root / "artifacts"), "--workers", "2"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise Unavailable(f"mlflow server exited: {self.log.read_text()[-1500:]}")
            try:
                urllib.request.urlopen(self.uri + "/health", timeout=2)
                return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        self.stop()
        raise Unavailable(f"mlflow server did not answer in {timeout:.0f} s: {self.log.read_text()[-1500:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None
