"""A throwaway PostgreSQL cluster for tests and benchmarks: initdb into a temp folder, listen
on a Unix socket only (listen_addresses='') unless a TCP port is asked for, one fresh database
per test, removed at the end.

PostgreSQL refuses to run as root, so as root the server programs run as the `postgres` user
(`runuser -u postgres --`) in a folder that user owns. Binaries: $RUNNER_PG_BIN, else
/usr/lib/postgresql/15/bin (Debian's postgresql-15).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import TracebackType

PG_BIN = Path(os.environ.get("RUNNER_PG_BIN", "/usr/lib/postgresql/15/bin"))


def available() -> str | None:
    """None if a cluster can be started here, else why not (one line)."""
    if not (PG_BIN / "initdb").exists():
        return f"PostgreSQL binaries not found in {PG_BIN} (apt-get install postgresql-15, or set RUNNER_PG_BIN)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no `postgres` user to run the server as"
    return None


class Cluster:
    """`with Cluster() as pg: url = pg.new_database()`.

    Args:
        fsync: keep PostgreSQL's fsync on (benchmarks, for a fair comparison with the
            FileStore's fsync); tests turn it off for speed.
        encoding: initdb's `-E` (default UTF8); "SQL_ASCII" runs `initdb --no-locale` as a
            C-locale machine's default cluster is made (encoding SQL_ASCII).
    """

    def __init__(self, *, fsync: bool = False, encoding: str = "UTF8", tcp_port: int | None = None) -> None:
        self.fsync, self.encoding, self.tcp_port = fsync, encoding, tcp_port
        self.folder = Path(tempfile.mkdtemp(prefix="runner-pg-"))
        self.data = self.folder / "data"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        cmd = [str(PG_BIN / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")

    def start(self) -> Cluster:
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
        encoding = ["--no-locale"] if self.encoding == "SQL_ASCII" else ["-E", self.encoding]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", *encoding)
        if self.tcp_port is not None:  # reachable from any address, as a server on another machine is
            with open(self.data / "pg_hba.conf", "a") as hba:
                hba.write("host all all 0.0.0.0/0 trust\nhost all all ::/0 trust\n")
        self.server("start")
        return self

    def server(self, action: str, *args: str) -> None:
        """`pg_ctl ACTION` on this cluster (start, stop, restart; e.g. `server("restart", "-m", "fast")`)."""
        listen = f"'*' -p {self.tcp_port}" if self.tcp_port is not None else "''"
        options = f"-c listen_addresses={listen} -k {self.folder} -c fsync={'on' if self.fsync else 'off'} " \
                  "-c max_connections=200 -c shared_buffers=32MB"
        extra = ["-o", options, "-l", str(self.folder / "log")] if action in ("start", "restart") else []
        self._run("pg_ctl", "-D", str(self.data), *extra, "-w", action, *args)

    def url(self, database: str = "postgres", *, host: str | None = None) -> str:
        """The database's URL over the Unix socket, or over TCP to `host` (a `tcp_port` cluster)."""
        if host is not None:
            return f"postgresql://postgres@{host}:{self.tcp_port}/{database}"
        port = f"&port={self.tcp_port}" if self.tcp_port is not None else ""
        return f"postgresql:///{database}?host={self.folder}&user=postgres{port}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its URL."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")
        except RuntimeError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
