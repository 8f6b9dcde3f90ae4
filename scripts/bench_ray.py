"""Benchmark: the scripted suite, 6 tasks x 20 repeats, on the local executor and on
Ray, wall time side by side.

Cases, run in one process, round-robin (the order rotates every round), median over rounds:

    local        runner.suite.run_suite on the default LocalExecutor: this process, one run
                 after another, one scripted provider (in process)
    ray x2       RayExecutor with 2 actors (the default on one node), each with its own
                 scripted provider and HTTP client, driving 4 runs at a time; the cluster is
                 already up, the actors start inside the case
    ray x4       the same with 4 actors
    ray x4 started  4 actors started ahead (`RayExecutor.start`: endpoint up, as a long-lived
                 pool serves suite after suite), outside the timed case

Each is timed twice: with the scripted provider answering at once (latency 0: the harness's
own CPU cost, which 2 cores bound), and with every reply delayed `--latency-ms` (default 50 ms,
a stand-in for waiting on a model, where fan-out pays). The wall time of a case includes
creating the 120 runs in the store, starting the actors and their providers, and writing the
report (for "ray x4 started", all but starting the actors). Ray's own start-up
(`ray.init(num_cpus=2, include_dashboard=False)`) is timed once, apart. Every case must give
120 correct runs. Targets: at 50 ms, ray x4 >= 3x local; at 0 ms, >= 0.9x.

Writes runs/bench/ray.md and runs/bench/ray.json (see --out) and prints the Markdown.

    python scripts/bench_ray.py [--repeats 20] [--rounds 3] [--latency-ms 50]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench")
    opts = parser.parse_args(argv)

    import ray

    from runner import fanout
    from runner.endpoints import Endpoint
    from runner.fanout import Executor, LocalExecutor, RayExecutor
    from runner.store import StoreAt
    from runner.suite import run_suite

    load_before = load()
    began = time.perf_counter()
    fanout.ray_init(None, num_cpus=2)
    ray_init_s = time.perf_counter() - began

    cases: dict[str, Any] = {"local": LocalExecutor, "ray x2": lambda: RayExecutor(actors=2),
                             "ray x4": lambda: RayExecutor(actors=4), "ray x4 started": lambda: RayExecutor(actors=4)}
    walls: dict[tuple[str, float], list[float]] = {(c, lat): [] for lat in (0.0, opts.latency_ms) for c in cases}
    runs = 6 * opts.repeats
    with tempfile.TemporaryDirectory(prefix="bench-ray-") as tmp:
        for rnd in range(opts.rounds):
            order = list(walls)
            order = order[rnd % len(order):] + order[:rnd % len(order)]
            for case, latency in order:
                executor: Executor = cases[case]()
                runs_dir = Path(tmp) / f"{case}-{latency}-{rnd}".replace(" ", "-")
                if case.endswith("started"):
                    assert isinstance(executor, RayExecutor)
                    executor.start([Endpoint(model="scripted", latency_ms=latency)], StoreAt(str(runs_dir.resolve())))
                start = time.perf_counter()
                report = run_suite("scripted", runs_dir, repeats=opts.repeats, latency_ms=latency, executor=executor)
                wall = time.perf_counter() - start
                if isinstance(executor, RayExecutor):
                    executor.close()
                correct = sum(r.correct for r in report.results)
                if correct != runs:
                    raise SystemExit(f"{case} at latency {latency}: {correct}/{runs} correct")
                walls[(case, latency)].append(wall)
                print(f"round {rnd + 1}: {case:<7} latency {latency:>4.0f} ms: {wall:6.2f} s", file=sys.stderr,
                      flush=True)
    ray.shutdown()
    load_after = load()

    median = {k: statistics.median(v) for k, v in walls.items()}
    lines = [
        "# The suite on Ray: local executor vs Ray actors",
        "",
        f"- scripted suite, 6 tasks x {opts.repeats} repeats = {runs} runs per case; {opts.rounds} rounds, "
        "order rotated each round; median wall time per case",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"Ray {ray.__version__}; load average (1/5/15 min) before: {load_before}, after: {load_after}",
        f"- Ray start-up, `ray.init(num_cpus=2, include_dashboard=False)`: {ray_init_s:.1f} s (not in the cases)",
        "",
        "| provider latency | case | wall s (median) | min | max | ms per run | vs local |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for latency in (0.0, opts.latency_ms):
        base = median[("local", latency)]
        for case in cases:
            v = walls[(case, latency)]
            lines.append(f"| {latency:.0f} ms | {case} | {median[(case, latency)]:.2f} | {min(v):.2f} | {max(v):.2f} | "
                         f"{median[(case, latency)] / runs * 1000:.1f} | {base / median[(case, latency)]:.2f}x |")
    lines += ["", "`vs local` = local wall / case wall (above 1: faster than the local executor); targets: "
              f"ray x4 >= 3x at {opts.latency_ms:.0f} ms, >= 0.9x at 0 ms."]
    text = "\n".join(lines) + "\n"
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "ray.md").write_text(text)
    (opts.out / "ray.json").write_text(json.dumps({
        "repeats": opts.repeats, "runs_per_case": runs, "rounds": opts.rounds, "ray_init_s": round(ray_init_s, 2),
        "ray_version": ray.__version__, "load_before": load_before, "load_after": load_after,
        "wall_s": {f"{case} @ {lat:.0f} ms": [round(x, 3) for x in v] for (case, lat), v in walls.items()},
    }, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
