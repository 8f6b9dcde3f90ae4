"""Benchmark: requests per second the scripted provider serves.

The provider runs as `runner scripted serve --port 0` in its own process (one process, one
event loop, uvicorn). Client processes (--client-procs, default 2) each keep --concurrency
kept-alive `httpx.AsyncClient` connections busy for --seconds, cycling through the three
requests of the `plan` scenario exactly as runner sends them (same messages, same tool
schemas, so each is "plan-sized": 0.9-1.6 KB of JSON, usage counted with o200k_base). Every
reply is checked (status 200, the expected finish_reason for its turn).

Figures: requests/s = replies / wall seconds of the measured window, and requests per
provider CPU-second (utime+stime of the provider process from /proc over the same window):
the second does not depend on how fast the clients on the other core can send.

`--client raw` sends the same bytes from plain asyncio streams instead of httpx, which costs
the clients far less CPU, so on 2 cores the provider rather than its clients is the limit.

`--tree DIR` (repeatable) measures the provider of another checkout (a tree holding runner/
and tasks/) the same way, one after the other, e.g. the FastAPI-era main for comparison.
Target: >= 1,000 requests/s from one provider process.

    python scripts/bench_provider.py [--seconds 5] [--concurrency 8] [--client-procs 2] [--tree DIR ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGET_RPS = 1000.0


def plan_requests() -> list[dict[str, Any]]:
    """The three request bodies runner sends for `plan` (taken from an in-memory run)."""
    from runner import catalog, harness
    from runner.endpoints import Endpoint
    from runner.scripted import PROMPTS, ScriptedServer
    from runner.state import RunConfig, new_run

    with ScriptedServer() as server:
        state = new_run(PROMPTS["plan"], RunConfig(endpoint=Endpoint(model="scripted/plan", base_url=server.base_url)))
        state = asyncio.run(harness.drive(state, server.base_url, None))
    assert state.status == "completed" and state.turns == 3, state.status
    schemas = [t.schema() for t in catalog.build(state.config)]
    bodies, upto = [], 1
    for i, m in enumerate(state.messages):
        if m.role == "assistant":
            bodies.append({"model": "scripted/plan", "messages": [x.to_api() for x in state.messages[:i]],
                           "temperature": 0, "seed": 0, "tools": schemas})
            upto = i
    assert len(bodies) == 3 and upto
    return bodies


def _raw_client_proc(url: str, bodies: list[dict[str, Any]], concurrency: int, start_at: float, stop_at: float,
                     out: Any) -> None:
    """The same load from asyncio streams: pre-built HTTP/1.1 keep-alive requests, replies read by
    Content-Length. ~10x less client CPU per request than httpx, so two client processes can
    saturate the provider's core on a 2-core machine."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    requests = []
    for b in bodies:
        data = json.dumps(b).encode()
        requests.append(f"POST {parts.path}/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
                        f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)
    expect = [b'"finish_reason": "tool_calls"', b'"finish_reason": "tool_calls"', b'"finish_reason": "stop"']

    async def one(counts: list[int]) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        i = 0
        while time.time() < stop_at:
            k = i % 3
            writer.write(requests[k])
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200") or expect[k] not in body:
                counts[1] += 1
            elif time.time() >= start_at:
                counts[0] += 1
            i += 1
        writer.close()

    async def main() -> list[int]:
        counts = [0, 0]
        await asyncio.gather(*(one(counts) for _ in range(concurrency)))
        return counts

    out.put(asyncio.run(main()))


def _client_proc(url: str, bodies: list[dict[str, Any]], concurrency: int, start_at: float, stop_at: float,
                 out: Any) -> None:
    import httpx

    raw = [json.dumps(b).encode() for b in bodies]
    expect = ["tool_calls", "tool_calls", "stop"]

    async def one(http: httpx.AsyncClient, counts: list[int]) -> None:
        i = 0
        while time.time() < stop_at:
            k = i % 3
            r = await http.post(url + "/chat/completions", content=raw[k],
                                headers={"content-type": "application/json"})
            if r.status_code != 200 or r.json()["choices"][0]["finish_reason"] != expect[k]:
                counts[1] += 1
            elif time.time() >= start_at:
                counts[0] += 1
            i += 1

    async def main() -> list[int]:
        counts = [0, 0]
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=30) as http:
            await asyncio.gather(*(one(http, counts) for _ in range(concurrency)))
        return counts

    out.put(asyncio.run(main()))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(tree: Path, bodies: list[dict[str, Any]], seconds: float, concurrency: int, procs: int,
            warmup_s: float, client: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    began = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "runner", "scripted", "serve", "--port", "0"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        import httpx

        httpx.get(url + "/models", timeout=30).raise_for_status()
        ready_ms = (time.perf_counter() - began) * 1000
        start_at = time.time() + warmup_s + 0.5
        stop_at = start_at + seconds
        queue: Any = multiprocessing.Queue()
        target = _client_proc if client == "httpx" else _raw_client_proc
        clients = [multiprocessing.Process(target=target, args=(url, bodies, concurrency, start_at, stop_at, queue))
                   for _ in range(procs)]
        for c in clients:
            c.start()
        while time.time() < start_at:
            time.sleep(0.001)
        cpu0, load0 = _cpu_s(server.pid), os.getloadavg()[0]
        while time.time() < stop_at:
            time.sleep(0.001)
        cpu1 = _cpu_s(server.pid)
        results = [queue.get(timeout=60) for _ in clients]
        for c in clients:
            c.join()
    finally:
        server.terminate()
        server.wait()
    ok, bad = sum(r[0] for r in results), sum(r[1] for r in results)
    return {"tree": str(tree), "client": client, "requests": ok, "errors": bad, "seconds": seconds, "rps": ok / seconds,
            "provider_cpu_s": cpu1 - cpu0, "rps_per_cpu_s": ok / max(cpu1 - cpu0, 1e-9),
            "provider_cpu_share": (cpu1 - cpu0) / seconds, "ready_ms": ready_ms, "loadavg": load0}


def render(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    sizes = ", ".join(f"{len(json.dumps(b))} B" for b in args.bodies)
    lines = [
        "# Scripted provider throughput", "",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        f"- workload: the 3 `plan` requests runner sends ({sizes}), round-robin; {args.client_procs} client "
        f"processes x {args.concurrency} kept-alive connections; {args.seconds:.0f} s measured after "
        f"{args.warmup:.0f} s warm-up; every reply checked", "",
        "| provider tree | client | requests/s | requests per provider CPU-s | provider CPU share | errors | "
        "start to first reply ms | load avg (1 min) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['tree']} | {r['client']} | **{r['rps']:,.0f}** | {r['rps_per_cpu_s']:,.0f} | {r['provider_cpu_share']:.2f} | "
                     f"{r['errors']} | {r['ready_ms']:.0f} | {r['loadavg']:.2f} |")
    best = max((r for r in rows if r["tree"] == str(REPO)), key=lambda r: r["rps"])
    verdict = "meets" if best["rps"] >= TARGET_RPS else "MISSES"
    lines += ["", f"Target ≥ {TARGET_RPS:,.0f} requests/s from one process: {verdict} ({best['rps']:,.0f}/s with the "
              f"{best['client']} client; {best['rps_per_cpu_s']:,.0f} requests per provider CPU-second)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=8, help="connections per client process")
    parser.add_argument("--client-procs", type=int, default=2)
    parser.add_argument("--client", choices=["httpx", "raw"], action="append",
                        help="load generator (repeatable; default both)")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another checkout to compare")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench")
    args = parser.parse_args()
    args.client = args.client or ["httpx", "raw"]
    args.bodies = plan_requests()
    rows = [measure(t.resolve(), args.bodies, args.seconds, args.concurrency, args.client_procs, args.warmup, c)
            for t in [REPO, *args.tree] for c in args.client]
    text = render(rows, args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "provider.md").write_text(text, encoding="utf-8")
    (args.out / "provider.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
