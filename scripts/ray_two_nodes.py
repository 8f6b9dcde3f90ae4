"""Start a two-node Ray cluster on this machine (a head and a worker node on loopback), run
`runner suite --executor ray` against it, print the suite's table and where each run was
driven, then stop both nodes.

    python scripts/ray_two_nodes.py [--store DIR|URL] [--repeat N] [-- extra `runner suite` options]

The suite's runs go to a PostgreSQL store, so any node may drive any run: by default a
throwaway cluster this script starts (tests/pgcluster.py: a Unix socket in a temp folder, as
the `postgres` user when run as root), or the store given with `--store` (a postgresql:// URL,
or a runs directory, which both nodes reach here because they share this machine's
filesystem). The reports go to runs/ray-two-nodes/. Ray 2.60 turns token auth on, so
both nodes and the driver run with RAY_AUTH_MODE=token (the token is Ray's, in ~/.ray). The
nodes get their own temporary folder and free ports, and are stopped by terminating the two
`ray start --block` processes this script started (never `ray stop`, which stops every Ray
on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).parent / "ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive_nodes(address: str, env: dict[str, str]) -> int:
    """Alive nodes of the cluster at `address` (0 when it does not answer yet)."""
    probe = "import ray; ray.init(address=%r, log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
    proc = subprocess.run([sys.executable, "-c", probe % address], capture_output=True, text=True, env=env, timeout=60)
    return int(proc.stdout.strip() or 0) if proc.returncode == 0 else 0


def start_node(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env)


def wait_for(address: str, nodes: int, env: dict[str, str], procs: list[subprocess.Popen[bytes]],
             timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while alive_nodes(address, env) < nodes:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise SystemExit(f"the Ray cluster at {address} did not reach {nodes} node(s)")
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", default=None,
                        help="run store: a postgresql:// URL or a runs directory [default: a throwaway PostgreSQL]")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cpus-per-node", type=int, default=1)
    parser.add_argument("suite_args", nargs="*", help="extra `runner suite` options (after --)")
    opts = parser.parse_args(argv)

    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    if (ROOT / "runner").is_dir():  # the nodes' workers and the driver import this checkout's runner
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    temp = Path(tempfile.mkdtemp(prefix="ray2n-"))
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    began = time.perf_counter()
    cluster = None
    if opts.store is None:
        sys.path.insert(0, str(ROOT))
        from tests import pgcluster

        why_not = pgcluster.available()
        if why_not:
            print(f"error: {why_not}; give --store DIR to use a runs directory", file=sys.stderr)
            return 2
        cluster = pgcluster.Cluster(fsync=True).start()
        opts.store = cluster.new_database()
        print(f"run store: a throwaway PostgreSQL 15 cluster, {opts.store}", flush=True)
    try:
        procs.append(start_node(["--head", f"--port={port}", f"--num-cpus={opts.cpus_per_node}",
                                 "--include-dashboard=false", f"--temp-dir={temp}"], temp / "head.log", env))
        wait_for(address, 1, env, procs)
        procs.append(start_node([f"--address={address}", f"--num-cpus={opts.cpus_per_node}"], temp / "worker.log", env))
        wait_for(address, 2, env, procs)
        print(f"two-node Ray cluster at {address} up in {time.perf_counter() - began:.1f} s "
              f"(head + worker, {opts.cpus_per_node} CPU each, RAY_AUTH_MODE=token)", flush=True)
        is_url = opts.store.startswith(("postgresql://", "postgres://"))
        store = ROOT / "runs" / "ray-two-nodes" if is_url else Path(opts.store)  # where the reports go
        before = set(store.glob("suite-*.json"))
        cmd = [sys.executable, "-m", "runner", "suite", "--executor", "ray", "--address", address,
               "--provider", "scripted", "--repeat", str(opts.repeat), "--runs-dir", str(store),
               *(["--store", opts.store] if is_url else []), *opts.suite_args]
        print("$ runner " + " ".join(cmd[3:]), flush=True)
        suite_began = time.perf_counter()
        code = subprocess.run(cmd, env={**env, "COLUMNS": env.get("COLUMNS", "100")}).returncode
        print(f"suite: exit code {code}, {time.perf_counter() - suite_began:.1f} s wall "
              f"(load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
        reports = sorted(set(store.glob("suite-*.json")) - before)
        if reports:
            results = json.loads(reports[-1].read_text())["results"]
            nodes = Counter(r["driven_by"].split(" pid ")[0] for r in results)
            procs_seen = Counter(r["driven_by"] for r in results)
            print(f"runs by node: {dict(nodes)}; by actor process: {dict(procs_seen)}")
            print(f"report: {reports[-1]}")
        return code
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(temp, ignore_errors=True)
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    raise SystemExit(main())
