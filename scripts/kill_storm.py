"""Kill storm: SIGKILL `runner` processes at random moments, on the FileStore or PostgreSQL,
and check that nothing was lost, nothing paid twice, and no second driver was admitted.

Four lanes (`--lanes`, the "workers") work in parallel on one store. Each lane takes runs one
after another: it starts `runner run` (or, once the run exists, `runner resume`) as a real
process and SIGKILLs it after a random delay, again and again, until a process lets the run
finish; the resumes are killed too. Now and then (`--pairs`) a lane starts two `runner resume`
of the same run at once (and sometimes kills one of them). When enough kills were delivered
(`--kills`), every run left unfinished is resumed once more without a kill, and every run is
checked from its trace and its state:

- lost: the run does not complete, or its turns are not exactly 1..N, or a committed
  transition is missing (the state's turns, per-turn records and tool results disagree).
- paid twice: a turn committed twice (the same turn number twice in the trace: the model asked
  again for a turn the run already had), a cost that is not the sum of its turns, or a tool
  that writes run twice (the workspace's delete ledger holds more than one entry).
- second drivers: two processes driving one run at once: a pair of resumes, neither killed,
  that both resumed the run (two `run_resumed` events for one pair); on PostgreSQL also any
  event written with an older lease epoch after a newer one (a fenced-out driver writing).

A kill counts only if it hit a live process. Requests the scripted provider answered more
often than the runs' turns are reported apart: a kill between the provider's reply and its
commit makes the next process ask for that turn again (the provider charged it, the run
never recorded it): no harness can avoid that, and it is not a turn committed twice.

    python scripts/kill_storm.py --store files --kills 1000
    python scripts/kill_storm.py --store postgres --kills 1000     # a throwaway cluster
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runner.scripted import PROMPTS, ScriptedServer, ScriptedSettings  # noqa: E402
from runner.store import RunStore, open_store  # noqa: E402
from runner.tools import deleted_files  # noqa: E402

SCENARIOS = {"plan": 3, "destructive": 3}
"""Scenario -> turns a finished run has (destructive runs with --auto-approve: list, delete, answer)."""


@dataclass
class Tally:
    kills: int = 0
    kills_after_claim: int = 0
    pairs: int = 0
    pairs_unkilled: int = 0
    processes: int = 0
    second_drivers: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Lane:
    number: int
    args: argparse.Namespace
    env: dict[str, str]
    base_url: str
    store: RunStore
    tally: Tally
    stop: threading.Event
    runs: dict[str, str] = field(default_factory=dict)
    """run id -> scenario, of the runs this lane created."""
    rng: random.Random = field(default_factory=random.Random)
    lifetime_s: float = 3.0
    """How long a `runner` process that is not killed lives here (a moving average)."""

    def _start(self, *argv: str) -> subprocess.Popen[str]:
        with self.tally.lock:
            self.tally.processes += 1
        return subprocess.Popen([sys.executable, "-m", "runner", *argv, "--json"], env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _kill_later(self, proc: subprocess.Popen[str], wrote: Callable[[], bool]) -> bool:
        """SIGKILL `proc` at a random moment unless it ended first; True if killed. Half the
        time the moment is 0.3 .. 1.15 x how long a process that is not killed lives (as last
        seen on this loaded machine: start-up takes most of it), half the time 0 .. 0.6 s after
        it first wrote to the run. `wrote()` says whether it has written to the run."""
        began = time.monotonic()
        try:
            if self.rng.random() < 0.5:  # half the kills: anywhere in the process's life
                proc.wait(timeout=self.rng.uniform(0.3, 1.15) * self.lifetime_s)
            else:  # the other half: once it has started writing to the run, within 0.6 s
                while proc.poll() is None and not wrote():
                    time.sleep(0.02)
                proc.wait(timeout=self.rng.uniform(0.0, 0.6))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
            wrote_to_run = wrote()
            with self.tally.lock:
                self.tally.kills += 1
                self.tally.kills_after_claim += int(wrote_to_run)
                if self.tally.kills >= self.args.kills:
                    self.stop.set()
            return True
        proc.communicate()
        if proc.returncode == 0:
            self.lifetime_s = 0.7 * self.lifetime_s + 0.3 * (time.monotonic() - began)
        return False

    def _wrote(self, run_id: str) -> Callable[[], bool]:
        """A probe: has the run's trace grown since now?"""
        before = _event_count(self.store, run_id)
        return lambda: _event_count(self.store, run_id) > before

    def _find(self, prompt: str) -> str | None:
        for info in self.store.list_runs():
            if any(m.role == "user" and m.content == prompt for m in info.state.messages[:2]):
                return info.state.run_id
        return None

    def drive_one(self, n: int) -> None:
        scenario = "plan" if n % 2 == 0 else "destructive"
        prompt = f"storm {self.number}-{n}: {PROMPTS[scenario]}"
        run_id: str | None = None
        while not self.stop.is_set():
            if run_id is None:  # create it: `runner run`, killed at random too
                proc = self._start("run", prompt, "--base-url", self.base_url, "--model", f"scripted/{scenario}",
                                   "--auto-approve", "delete_file")
                killed = self._kill_later(proc, lambda: self._find(prompt) is not None)
                run_id = self._find(prompt)
                if run_id is not None:
                    self.runs[run_id] = scenario
                if not killed and proc.returncode == 0:
                    return
                continue
            if self.rng.random() < self.args.pairs:
                self._pair(run_id)
            else:
                self._kill_later(self._start("resume", run_id), self._wrote(run_id))
            if self.store.info(run_id).shown_status == "completed":
                return

    def _pair(self, run_id: str) -> None:
        before = _resumed_count(self.store, run_id)
        procs = [self._start("resume", run_id), self._start("resume", run_id)]
        kill_one = self.rng.random() < 0.5
        with self.tally.lock:
            self.tally.pairs += 1
        if kill_one:
            self._kill_later(self.rng.choice(procs), self._wrote(run_id))
        for proc in procs:
            proc.communicate()
        if not kill_one:
            with self.tally.lock:
                self.tally.pairs_unkilled += 1
            added = _resumed_count(self.store, run_id) - before
            if added > 1:
                with self.tally.lock:
                    self.tally.second_drivers.append(f"{run_id}: {added} run_resumed events from one pair of resumes")

    def loop(self) -> None:
        n = 0
        while not self.stop.is_set():
            self.drive_one(n)
            n += 1


def _resumed_count(store: RunStore, run_id: str) -> int:
    return sum(1 for e in store.read_trace(run_id) if e.type == "run_resumed")


def _event_count(store: RunStore, run_id: str) -> int:
    return len(store.read_trace(run_id))


def check(store: RunStore, runs: dict[str, str]) -> dict[str, list[str]]:
    """Per-run findings: lost, paid twice, second drivers (PostgreSQL epochs)."""
    lost: list[str] = []
    twice: list[str] = []
    second: list[str] = []
    for run_id, scenario in sorted(runs.items()):
        state = store.load(run_id)
        turns = SCENARIOS[scenario]
        events = store.read_trace(run_id)
        numbers = [e.turn for e in events if e.type == "turn"]
        dup = [t for t, c in Counter(numbers).items() if c > 1]
        if dup:
            twice.append(f"{run_id}: turn(s) {dup} committed twice")
        if state.status != "completed" or sorted(set(numbers)) != list(range(1, turns + 1)):
            lost.append(f"{run_id}: status {state.status}, turns in trace {numbers}")
        if state.turns != turns or [t.turn for t in state.per_turn] != list(range(1, turns + 1)):
            lost.append(f"{run_id}: state turns {state.turns}, per-turn {[t.turn for t in state.per_turn]}")
        answered = [m.tool_call_id for m in state.messages if m.role == "tool"]
        if len(answered) != len(set(answered)) or len(answered) != turns - 1:
            lost.append(f"{run_id}: tool results for {answered}")
        if abs(state.cost_usd - sum(t.cost_usd for t in state.per_turn)) > 1e-9:
            twice.append(f"{run_id}: cost {state.cost_usd} is not the sum of its turns")
        if scenario == "destructive":
            ws = store.existing_workspace(run_id)
            deleted = deleted_files(ws) if ws is not None else []
            if deleted != ["access.log"]:
                (twice if len(deleted) > 1 else lost).append(f"{run_id}: deleted {deleted}")
        if hasattr(store, "trace_rows"):
            epochs = [row[1] for row in store.trace_rows(run_id) if row[1] is not None]
            if any(b < a for a, b in itertools.pairwise(epochs)):
                second.append(f"{run_id}: an event of an older lease epoch after a newer one: {epochs}")
    return {"lost": lost, "paid twice": twice, "second drivers": second}


def storm(args: argparse.Namespace, url: str, runs_dir: Path) -> dict[str, Any]:
    settings = ScriptedSettings(latency_ms=args.latency_ms)
    with ScriptedServer(settings) as server:
        env = {**os.environ, "RUNNER_RUNS_DIR": str(runs_dir), "RUNNER_STORE": url, "RUNNER_LEASE_S": "5"}
        store = open_store(url)
        tally, stop = Tally(), threading.Event()
        lanes = [Lane(i, args, env, server.base_url, open_store(url), tally, stop, rng=random.Random(args.seed + i))
                 for i in range(args.lanes)]
        began = time.monotonic()
        threads = [threading.Thread(target=lane.loop, daemon=True) for lane in lanes]
        for t in threads:
            t.start()
        last = 0
        while any(t.is_alive() for t in threads):
            time.sleep(2)
            if tally.kills >= last + 100:
                last = tally.kills - tally.kills % 100
                print(f"  {tally.kills} kills, {sum(len(x.runs) for x in lanes)} runs, "
                      f"{time.monotonic() - began:.0f} s, a process lives ~{lanes[0].lifetime_s:.1f} s",
                      file=sys.stderr, flush=True)
        runs: dict[str, str] = {}
        for lane in lanes:
            runs |= lane.runs
        finish_env = dict(env)
        for run_id in runs:  # each unfinished run: one resume more, nobody kills it
            if store.info(run_id).shown_status != "completed":
                subprocess.run([sys.executable, "-m", "runner", "resume", run_id, "--json"], env=finish_env,
                               capture_output=True, text=True, timeout=300)
        found = check(store, runs)
        found["second drivers"] += tally.second_drivers
        asked = len(server.requests)
        turns = sum(SCENARIOS[s] for s in runs.values())
        for lane in lanes:
            lane.store.close()
        store.close()
    return {"runs": len(runs), "kills": tally.kills, "kills_after_claim": tally.kills_after_claim,
            "processes": tally.processes, "pairs": tally.pairs, "pairs_unkilled": tally.pairs_unkilled,
            "requests": asked, "turns": turns, "re_asked_after_a_kill": asked - turns,
            "wall_s": round(time.monotonic() - began, 1), "findings": found}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=["files", "postgres"], default="files")
    parser.add_argument("--kills", type=int, default=100, help="stop once this many SIGKILLs hit a live process")
    parser.add_argument("--lanes", type=int, default=4, help="runs driven (and killed) in parallel")
    parser.add_argument("--pairs", type=float, default=0.15, help="share of resumes started as a concurrent pair")
    parser.add_argument("--latency-ms", type=float, default=150.0, help="scripted provider latency per reply")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kill-storm-") as tmp:
        runs_dir = Path(tmp) / "runs"
        if args.store == "postgres":
            from tests.pgcluster import Cluster, available

            missing = available()
            if missing:
                print(f"kill_storm: {missing}", file=sys.stderr)
                return 2
            with Cluster() as pg:
                result = storm(args, pg.new_database(), runs_dir)
        else:
            result = storm(args, str(runs_dir), runs_dir)
    result |= {"store": args.store, "lanes": args.lanes, "load_before": [round(x, 2) for x in load],
               "load_after": [round(x, 2) for x in os.getloadavg()]}
    found = result["findings"]
    if args.json:
        print(json.dumps(result))
    else:
        print(f"kill storm on the {'FileStore' if args.store == 'files' else 'PostgresStore'}, {args.lanes} lanes, "
              f"load {result['load_before'][0]:.2f} before, {result['load_after'][0]:.2f} after, {result['wall_s']} s")
        print(f"{result['runs']} runs, {result['kills']} kills, {len(found['lost'])} lost, "
              f"{len(found['paid twice'])} paid twice, {len(found['second drivers'])} second drivers")
        print(f"  kills after the run was claimed: {result['kills_after_claim']}; processes started: "
              f"{result['processes']}; concurrent resume pairs: {result['pairs']} ({result['pairs_unkilled']} with no kill)")
        print(f"  provider requests {result['requests']} for {result['turns']} turns: "
              f"{result['re_asked_after_a_kill']} asked again after a kill caught a reply before its commit")
        for kind, lines in found.items():
            for line in lines[:20]:
                print(f"  {kind}: {line}")
    return 0 if not any(found.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
