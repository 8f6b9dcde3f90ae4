"""Benchmark: `import runner` time and the peak RSS of `runner run` on the `plan` scenario.

Every figure comes from fresh subprocesses, measured side by side, round-robin (the order
rotates every round), medians over >= 30 rounds after a warm-up. One round runs:

    pass         python -c "pass"                       interpreter start-up, the baseline
    import       python -c "import runner"              the target (<= 200 ms)
    import_api   python -c "from runner import run, RunState, RunConfig, execute"
                 what a script needs to drive a run (loop, client, httpx, pydantic models):
                 the stricter reading of the same target (<= 200 ms)
    import_api_nopyc  the same with PYTHONDONTWRITEBYTECODE=1, so runner's own modules compile
                 from source every time (how this sandbox runs when runner/__pycache__ is absent)
    cli          runner run PROMPT --base-url URL --model scripted/plan --runs-dir TMP
                 the client process only: the scripted provider is already running
    help         runner --help                         (<= 150 ms wall)
    scenario     runner run --scenario plan --runs-dir TMP: the cold command a user types,
                 with its own scripted provider (answering in process)
    scenario_new runner run "<a prompt never seen>" --scenario plan: the same, for texts whose
                 token counts are not on record yet, so the o200k tokenizer loads
    ref_pydantic python -c "import pydantic"             the reference of import_api
    ref_cli      python -c "import httpx, pydantic, typer"  the reference of scenario
    ref_model    python -c "from pydantic import BaseModel; class M(BaseModel): ..."  one deferred
                 model and no runner: pydantic's floor under import_api, printed beside its ratio

Start-up targets are ratios to a reference measured in the same rounds (absolute times
differ ~2x between two machines of one kind): import_api <= 2.0x ref_pydantic and scenario
<= 1.5x ref_cli, both as wall times of whole commands; the ratios of times net of `pass`
(interpreter start-up left out) are printed beside them.

Import time = median(case) - median(pass), ms, with the bytecode cache warm (a normal
install). Peak RSS = ru_maxrss of the `cli` process from os.wait4 (that process only; with
--base-url it starts no children), MiB; target <= 60 MiB. The provider's own peak RSS, after
serving every round, is reported separately. `python -X importtime` (5 runs, median per
module) lists the heaviest imports of `import_api` (imported as plain `import` statements, which
importtime logs), and a check says which heavy modules each import loads (llama_cpp, huggingface_hub, tiktoken, rich).

`--candidate DIR` (repeatable) adds `import@DIR`, `import_api@DIR` and `cli@DIR` to the same
round-robin with PYTHONPATH=DIR, so a proposed change (a scratch copy of the tree holding
`runner/` and `tasks/`) is measured side by side with the installed code.

Writes runs/bench/startup.md and runs/bench/startup.json (see --out) and prints the Markdown.

    python scripts/bench_startup.py [--runs 40] [--warmup 3] [--candidate DIR ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PLAN_PROMPT = "Which log file mentions a timeout, and what does it say?"
IMPORT = "import runner"
IMPORT_API = "from runner import run, RunState, RunConfig, execute"
IMPORT_API_TREE = "import runner.state, runner.harness, runner.loop"
"""The same modules as IMPORT_API through plain imports: the package's lazy exports load theirs
with importlib.import_module, which `-X importtime` does not log."""
IMPORT_TARGET_MS = 200.0
RSS_TARGET_MIB = 60.0
HELP_TARGET_MS = 150.0
"""`runner --help`, wall of the whole command."""
SCENARIO_TARGET_MS = 1000.0
"""`runner run --scenario plan`, wall of the whole command, starting its own provider (target 3)."""
REF_PYDANTIC = "import pydantic"
REF_CLI = "import httpx, pydantic, typer"
REF_MODEL = "from pydantic import BaseModel\nclass M(BaseModel, defer_build=True): x: int = 0"
"""One deferred pydantic model, no runner: the floor under any import that defines a model."""
API_RATIO_TARGET = 2.0
"""import_api wall <= this x `python -c "import pydantic"` wall."""
SCENARIO_RATIO_TARGET = 1.5
"""`runner run --scenario plan` wall <= this x `python -c "import httpx, pydantic, typer"` wall."""
HEAVY = ("llama_cpp", "huggingface_hub", "tiktoken", "rich", "fastapi", "uvicorn", "typer", "click",
         "pygments", "httpx", "pydantic", "asyncio", "ssl")
"""Modules whose presence after an import the report checks (the first four are the heavy ones)."""

Cases = dict[str, tuple[list[str], dict[str, str]]]


def rss_mib(ru_maxrss: int) -> float:
    """ru_maxrss is KiB on Linux and bytes on macOS."""
    return ru_maxrss / (1024 * 1024) if sys.platform == "darwin" else ru_maxrss / 1024


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Run `cmd` to completion; (wall ms, peak RSS MiB of that process).

    Raises:
        RuntimeError: the command exited non-zero (its stderr tail is in the message).
    """
    began = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    ms = (time.perf_counter() - began) * 1000
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.stderr is not None
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {err[-400:]}")
    return ms, rss_mib(usage.ru_maxrss)


def envs(pycache: Path) -> tuple[dict[str, str], dict[str, str]]:
    """(warm: bytecode written to and read from `pycache`; cold: no bytecode written)."""
    warm = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    warm["PYTHONPYCACHEPREFIX"] = str(pycache)
    cold = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    cold["PYTHONDONTWRITEBYTECODE"] = "1"
    return warm, cold


def with_path(env: dict[str, str], first: Path) -> dict[str, str]:
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(first), env.get("PYTHONPATH", "")]))}


def start_provider(env: dict[str, str], cwd: Path) -> tuple[subprocess.Popen[str], str]:
    """`runner scripted serve --port 0` as a child; returns it and its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "runner", "scripted", "serve", "--port", "0"],
                            env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http"):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the scripted provider did not start: {url!r}")
    return proc, url


def stop_provider(proc: subprocess.Popen[str]) -> float:
    """Terminate the provider; its peak RSS over its whole life, MiB."""
    proc.terminate()
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return rss_mib(usage.ru_maxrss)


def runner_cli() -> list[str]:
    script = Path(sys.executable).parent / "runner"
    return [str(script)] if script.exists() else [sys.executable, "-m", "runner"]


def round_robin(cases: Cases, runs: int, warmup: int, cwd: Path) -> dict[str, dict[str, list[float]]]:
    names = list(cases)
    out: dict[str, dict[str, list[float]]] = {n: {"ms": [], "rss_mib": []} for n in names}
    for i in range(warmup + runs):
        k = i % len(names)
        for name in names[k:] + names[:k]:
            cmd, env = cases[name]
            cmd = [part.replace("{round}", f"{i}-{os.getpid()}-{time.time_ns()}") for part in cmd]
            ms, rss = timed(cmd, env, cwd)
            if i >= warmup:
                out[name]["ms"].append(ms)
                out[name]["rss_mib"].append(rss)
    return out


def importtime(code: str, env: dict[str, str], cwd: Path, runs: int = 5) -> list[dict[str, Any]]:
    """Per module: median self and cumulative µs over `runs` `-X importtime` runs, its depth in
    the import tree and the module that imported it."""
    samples: dict[str, dict[str, Any]] = {}
    for _ in range(runs):
        err = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, cwd=cwd,
                             capture_output=True, text=True, check=True).stderr
        rows = []
        for line in err.splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            self_text, cum_text, name = line[len("import time:"):].split("|")
            rows.append((name.strip(), int(self_text), int(cum_text), (len(name) - len(name.lstrip()) - 1) // 2))
        for i, (mod, self_us, cum_us, depth) in enumerate(rows):
            parent = next((r[0] for r in rows[i + 1:] if r[3] < depth), "")  # post-order: parent comes later
            s = samples.setdefault(mod, {"self": [], "cum": [], "depth": depth, "parent": parent})
            s["self"].append(self_us)
            s["cum"].append(cum_us)
    return [{"module": mod, "self_us": statistics.median(s["self"]), "cum_us": statistics.median(s["cum"]),
             "depth": s["depth"], "imported_by": s["parent"]} for mod, s in samples.items()]


def by_package(mods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Self time summed per top-level package, with the module that imported the package."""
    out: dict[str, dict[str, Any]] = {}
    for m in mods:
        top = m["module"].split(".")[0]
        p = out.setdefault(top, {"package": top, "self_us": 0.0, "modules": 0, "imported_by": ""})
        p["self_us"] += m["self_us"]
        p["modules"] += 1
        outside = m["imported_by"] and m["imported_by"].split(".")[0] != top
        if outside and (m["module"] == top or not p["imported_by"]):
            p["imported_by"] = m["imported_by"]  # the package's own importer wins
    return sorted(out.values(), key=lambda p: -p["self_us"])


def loaded_heavy(code: str, env: dict[str, str], cwd: Path) -> list[str]:
    probe = f"{code}\nimport sys, json; print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def import_figures(results: dict[str, dict[str, list[float]]], name: str) -> dict[str, Any]:
    """median(name) - median(pass), and the per-round paired differences."""
    base, case = results["pass"]["ms"], results[name]["ms"]
    return {"ms": statistics.median(case) - statistics.median(base),
            "paired": summary([b - a for a, b in zip(base, case)])}


def measure(runs: int, warmup: int, work: Path, candidates: list[Path]) -> dict[str, Any]:
    warm, cold = envs(work / "pycache")
    cwd = work  # neutral: `runner` resolves through the installed package, not a checkout in cwd
    provider, url = start_provider(warm, cwd)
    try:
        cli = [*runner_cli(), "run", PLAN_PROMPT, "--base-url", url, "--model", "scripted/plan",
               "--runs-dir", str(work / "runs")]
        scenario = [*runner_cli(), "run", "--scenario", "plan", "--runs-dir", str(work / "runs")]
        cases: Cases = {
            "pass": ([sys.executable, "-c", "pass"], warm),
            "import": ([sys.executable, "-c", IMPORT], warm),
            "import_api": ([sys.executable, "-c", IMPORT_API], warm),
            "import_api_nopyc": ([sys.executable, "-c", IMPORT_API], cold),
            "cli": (cli, warm),
            "help": ([*runner_cli(), "--help"], warm),
            "scenario": (scenario, warm),
            "scenario_new": ([*runner_cli(), "run", PLAN_PROMPT + " (round {round})", *scenario[-4:]], warm),
            "ref_pydantic": ([sys.executable, "-c", REF_PYDANTIC], warm),
            "ref_cli": ([sys.executable, "-c", REF_CLI], warm),
            "ref_model": ([sys.executable, "-c", REF_MODEL], warm),
        }
        for cand in candidates:
            cases[f"import@{cand}"] = ([sys.executable, "-c", IMPORT], with_path(warm, cand))
            cases[f"import_api@{cand}"] = ([sys.executable, "-c", IMPORT_API], with_path(warm, cand))
            cases[f"cli@{cand}"] = (cli, with_path(warm, cand))
            cases[f"help@{cand}"] = ([*runner_cli(), "--help"], with_path(warm, cand))
            cases[f"scenario@{cand}"] = (scenario, with_path(warm, cand))
        load_before = os.getloadavg()
        results = round_robin(cases, runs, warmup, cwd)
        load_after = os.getloadavg()
    finally:
        provider_rss = stop_provider(provider)
    api_modules = importtime(IMPORT_API_TREE, warm, cwd)
    report: dict[str, Any] = {
        "cases": {n: {"ms": summary(r["ms"]), "rss_mib": summary(r["rss_mib"])} for n, r in results.items()},
        "import": import_figures(results, "import"),
        "import_api": import_figures(results, "import_api"),
        "import_api_nopyc": import_figures(results, "import_api_nopyc"),
        "cli_rss_mib": statistics.median(results["cli"]["rss_mib"]),
        "help_ms": statistics.median(results["help"]["ms"]),
        "scenario_ms": statistics.median(results["scenario"]["ms"]),
        "ratios": ratios(results),
        "provider_rss_mib": provider_rss,
        "provider_served_runs": runs + warmup,
        "heaviest_modules": sorted((m for m in api_modules if not m["module"].startswith("runner")),
                                   key=lambda m: -m["cum_us"])[:20],
        "runner_modules": sorted((m for m in api_modules if m["module"].startswith("runner")),
                                 key=lambda m: -m["self_us"]),
        "packages": by_package(api_modules)[:15],
        "loaded": {"import": loaded_heavy(IMPORT, warm, cwd), "import_api": loaded_heavy(IMPORT_API, warm, cwd)},
        "loadavg_before_after": [load_before[0], load_after[0]],
        "candidates": [],
        "raw": results,
    }
    for cand in candidates:
        env = with_path(warm, cand)
        report["candidates"].append({
            "path": str(cand), "import": import_figures(results, f"import@{cand}"),
            "import_api": import_figures(results, f"import_api@{cand}"),
            "cli_rss_mib": statistics.median(results[f"cli@{cand}"]["rss_mib"]),
            "help_ms": statistics.median(results[f"help@{cand}"]["ms"]),
            "scenario_ms": statistics.median(results[f"scenario@{cand}"]["ms"]),
            "loaded": {"import": loaded_heavy(IMPORT, env, cwd), "import_api": loaded_heavy(IMPORT_API, env, cwd)},
            "heaviest_modules": sorted((m for m in importtime(IMPORT_API_TREE, env, cwd)
                                        if not m["module"].startswith("runner")), key=lambda m: -m["cum_us"])[:12],
        })
    return report


def ratios(results: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Each start-up figure over its reference: wall medians, and medians net of `pass`."""
    med = {name: statistics.median(r["ms"]) for name, r in results.items()}
    out = {}
    for case, ref, target in (("import_api", "ref_pydantic", API_RATIO_TARGET),
                              ("scenario", "ref_cli", SCENARIO_RATIO_TARGET),
                              ("scenario_new", "ref_cli", SCENARIO_RATIO_TARGET)):
        out[case] = {"ms": med[case], "ref_ms": med[ref], "wall": med[case] / med[ref],
                     "net": (med[case] - med["pass"]) / (med[ref] - med["pass"]), "target": target}
    return out


def _ratio_lines(r: dict[str, Any]) -> list[str]:
    names = {"import_api": f"`{IMPORT_API}`", "scenario": "`runner run --scenario plan` (cold, counts on record)",
             "scenario_new": "`runner run --scenario plan` (cold, a new prompt: the tokenizer loads)"}
    refs = {"import_api": f'`python -c "{REF_PYDANTIC}"`', "scenario": f'`python -c "{REF_CLI}"`',
            "scenario_new": f'`python -c "{REF_CLI}"`'}
    lines = ["| case | wall ms | reference | ref wall ms | ratio (wall) | target | ratio net of `pass` |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for key, x in r["ratios"].items():
        verdict = "meets" if x["wall"] <= x["target"] else "MISSES"
        lines.append(f"| {names[key]} | {x['ms']:.1f} | {refs[key]} | {x['ref_ms']:.1f} | **{x['wall']:.2f}x** | "
                     f"<= {x['target']:.1f}x: {verdict} | {x['net']:.2f}x |")
    model = r["cases"].get("ref_model")
    if model is not None:
        floor, api, pyd = model["ms"]["median"], r["ratios"]["import_api"]["ms"], r["ratios"]["import_api"]["ref_ms"]
        lines += ["", f"pydantic's floor, measured in the same rounds: one deferred model and no runner "
                      f"(`{REF_MODEL.replace(chr(10), '; ')}`) = {floor:.1f} ms = **{floor / pyd:.2f}x** "
                      f"`import pydantic`; the API import is {api / floor:.2f}x that floor "
                      f"({api - floor:.1f} ms over it)."]
    return lines


def _verdict(value: float, target: float, unit: str) -> str:
    return "meets" if value <= target else f"MISSES by {value - target:.1f} {unit}"


def _import_line(label: str, fig: dict[str, Any]) -> str:
    p = fig["paired"]
    return (f"{label} = {fig['ms']:.1f} ms (target ≤ {IMPORT_TARGET_MS:.0f} ms: "
            f"{_verdict(fig['ms'], IMPORT_TARGET_MS, 'ms')}; paired per-round min / median / max = "
            f"{p['min']:.1f} / {p['median']:.1f} / {p['max']:.1f} ms)")


def _module_rows(mods: list[dict[str, Any]]) -> list[str]:
    rows = ["| module | cumulative ms | self ms | imported by |", "|---|---:|---:|---|"]
    rows += [f"| {'· ' * m['depth']}{m['module']} | {m['cum_us'] / 1000:.1f} | {m['self_us'] / 1000:.1f} | "
             f"{m['imported_by']} |" for m in mods]
    return rows


def render(r: dict[str, Any]) -> str:
    rss = r["cli_rss_mib"]
    lines = [
        "# Start-up: `import runner` and peak RSS", "",
        f"- {r['runs']} timed rounds after {r['warmup']} warm-up rounds, fresh subprocesses, order rotated "
        f"each round; load average (1 min) before / after: {r['loadavg_before_after'][0]:.2f} / "
        f"{r['loadavg_before_after'][1]:.2f}",
        f"- machine: {r['machine']}; runner from `{r['runner_path']}`; bytecode cache warm unless noted", "",
        "Start-up against references measured in the same rounds:", "", *_ratio_lines(r), "",
        "**" + _import_line("`import runner`", r["import"]) + "**", "",
        _import_line(f"`{IMPORT_API}`", r["import_api"]) + f" — wall of the whole command: "
        f"{r['cases']['import_api']['ms']['median']:.1f} ms", "",
        f"**`runner --help` = {r['help_ms']:.1f} ms wall** (target ≤ {HELP_TARGET_MS:.0f} ms: "
        f"{_verdict(r['help_ms'], HELP_TARGET_MS, 'ms')})", "",
        f"**`runner run --scenario plan` = {r['scenario_ms']:.1f} ms wall**, cold: the scripted provider "
        f"answers in the same process (target ≤ {SCENARIO_TARGET_MS:.0f} ms on an idle 2-core machine: "
        f"{_verdict(r['scenario_ms'], SCENARIO_TARGET_MS, 'ms')}; check the load average above)", "",
        f"The API import with runner's modules compiled from source (PYTHONDONTWRITEBYTECODE=1): "
        f"{r['import_api_nopyc']['ms']:.1f} ms", "",
        f"**Peak RSS of `runner run` on `plan` (client process) = {rss:.1f} MiB** (median; target ≤ "
        f"{RSS_TARGET_MIB:.0f} MiB: {_verdict(rss, RSS_TARGET_MIB, 'MiB')}). The scripted provider "
        f"(`runner scripted serve`, its own process) peaked at {r['provider_rss_mib']:.1f} MiB after "
        f"serving {r['provider_served_runs']} runs.", "",
        "| case | wall min ms | wall median ms | wall max ms | RSS median MiB | RSS max MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, s in r["cases"].items():
        lines.append(f"| {name} | {s['ms']['min']:.1f} | {s['ms']['median']:.1f} | {s['ms']['max']:.1f} | "
                     f"{s['rss_mib']['median']:.1f} | {s['rss_mib']['max']:.1f} |")
    lines += ["", f"Heavy modules loaded (of {', '.join(HEAVY)}):", "",
              f"- by `{IMPORT}`: {', '.join(r['loaded']['import']) or 'none'}",
              f"- by `{IMPORT_API}`: {', '.join(r['loaded']['import_api']) or 'none'}", "",
              f"Heaviest imports under `{IMPORT_API_TREE}` (the modules `{IMPORT_API}` loads; `-X importtime`, "
              "median of 5; cumulative includes children):",
              "", *_module_rows(r["heaviest_modules"]), "",
              "Self time per top-level package:", "", "| package | self ms | modules | imported by |", "|---|---:|---:|---|"]
    lines += [f"| {p['package']} | {p['self_us'] / 1000:.1f} | {p['modules']} | {p['imported_by']} |" for p in r["packages"]]
    lines += ["", "runner's own modules (self time: module body, including pydantic model building):", "",
              "| module | self ms | cumulative ms |", "|---|---:|---:|"]
    lines += [f"| {m['module']} | {m['self_us'] / 1000:.1f} | {m['cum_us'] / 1000:.1f} |" for m in r["runner_modules"]]
    for cand in r["candidates"]:
        lines += ["", f"## Candidate `{cand['path']}` (same round-robin)", "",
                  "- " + _import_line("`import runner`", cand["import"]),
                  "- " + _import_line(f"`{IMPORT_API}`", cand["import_api"]),
                  f"- peak RSS of `runner run` = {cand['cli_rss_mib']:.1f} MiB (installed: {rss:.1f} MiB)",
                  f"- `runner --help` = {cand['help_ms']:.1f} ms wall (installed: {r['help_ms']:.1f} ms)",
                  f"- `runner run --scenario plan` = {cand['scenario_ms']:.1f} ms wall (installed: {r['scenario_ms']:.1f} ms)",
                  f"- loaded by `{IMPORT_API}`: {', '.join(cand['loaded']['import_api']) or 'none'}", "",
                  *_module_rows(cand["heaviest_modules"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="timed rounds (>= 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "bench")
    parser.add_argument("--candidate", type=Path, action="append", default=[],
                        help="a tree holding a changed runner/ (and tasks/) to compare (repeatable)")
    parser.add_argument("--trial", action="store_true", help="allow --runs below 30 (not a reportable figure)")
    args = parser.parse_args()
    if args.runs < 30 and not args.trial:
        parser.error("--runs must be >= 30 --trial allows fewer, for a quick look")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="startup-", dir=args.out))
    try:
        report = measure(args.runs, args.warmup, work, [c.resolve() for c in args.candidate])
        located = subprocess.run([sys.executable, "-c", "import runner, os; print(os.path.dirname(runner.__file__))"],
                                 cwd=work, capture_output=True, text=True, check=True).stdout.strip()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.update(runs=args.runs, warmup=args.warmup, runner_path=located,
                  machine=f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
                  targets={"import_ms": IMPORT_TARGET_MS, "rss_mib": RSS_TARGET_MIB, "help_ms": HELP_TARGET_MS,
                           "scenario_ms": SCENARIO_TARGET_MS},
                  meets={"import": report["import"]["ms"] <= IMPORT_TARGET_MS,
                         "import_api": report["import_api"]["ms"] <= IMPORT_TARGET_MS,
                         "rss": report["cli_rss_mib"] <= RSS_TARGET_MIB,
                         "help": report["help_ms"] <= HELP_TARGET_MS,
                         "scenario": report["scenario_ms"] <= SCENARIO_TARGET_MS,
                         **{f"{k}_ratio": v["wall"] <= v["target"] for k, v in report["ratios"].items()}})
    text = render(report)
    (args.out / "startup.md").write_text(text, encoding="utf-8")
    (args.out / "startup.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(text)
    print(f"wrote {args.out / 'startup.md'} and {args.out / 'startup.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
