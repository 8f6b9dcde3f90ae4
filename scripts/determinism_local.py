"""Measurement: does a warm server answer like a fresh one? Stock prefix reuse vs runner's.

For each suite task: turn 1 is generated on a model instance, then turn 2 (turn 1's reply plus
"Are you sure?") on the same, now warm, instance and on a fresh one. "stock" renders the same
prompt and generates with llama-cpp-python's ``create_completion`` (its own prefix reuse: the
longest common token prefix, including tokens it generated one at a time); "runner" uses
`runner.engine.Engine` (whole prompt messages reused, the rest evaluated per message).
Prints, per task, whether the warm and fresh turn-2 replies are identical. A third column,
"runner, prefix from disk", starts a cold engine from the system turn's saved KV entries
(`runner.kvprefix`, saved by an earlier engine, loaded by `Engine.warm_up`) and compares its
turn-1 and turn-2 replies with those of a fresh engine that evaluates everything.

Usage: ``python scripts/determinism_local.py [--model NAME|PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from runner import models
from runner.chat_adapter import render_prompt
from runner.engine import ChatRequest, Engine
from runner.kvprefix import PrefixStore, file_sha256
from runner.local_app import complete
from runner.suite import load_suite
from runner.tools import BASIC_TOOLS

TOOLS = [cls().schema() for cls in BASIC_TOOLS]


def conversation(system: str, prompt: str, reply: str | None = None) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
    if reply is not None:
        messages += [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "Are you sure? Answer again in one sentence."}]
    return messages


def stock(llama: Any, messages: list[dict[str, Any]]) -> str:
    tokens = llama.tokenize(render_prompt(messages, TOOLS).encode(), add_bos=False, special=True)
    out = llama.create_completion(prompt=tokens, max_tokens=64, temperature=0, stop=["<|im_end|>"])
    return str(out["choices"][0]["text"]).strip()


def ours(engine: Engine, messages: list[dict[str, Any]]) -> str:
    reply = complete(engine.stream(ChatRequest(messages=messages, tools=TOOLS, max_tokens=64), threading.Event()),
                     "m", 0, "x")["choices"][0]["message"]
    return str(reply["content"] or json.dumps(reply.get("tool_calls")))


def main() -> int:
    from llama_cpp import Llama

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    _, path = models.resolve_choice(args.model)
    suite = load_suite()

    def load() -> Any:
        return Llama(model_path=str(path), n_ctx=4096, n_threads=2, verbose=False)

    folder = Path(tempfile.mkdtemp(prefix="kv-prefix-"))
    store = PrefixStore(folder, file_sha256(path, folder), 4096)

    def from_disk() -> Engine:
        engine = Engine(load())
        engine.prefix_store = store
        engine.warm_up()
        return engine

    ours(from_disk(), conversation(suite.system, suite.tasks[0].prompt))  # saves the system turn
    print("| task | stock: warm == fresh | runner: warm == fresh | runner, prefix from disk: == fresh |\n"
          "|---|---|---|---|")
    totals = {"stock": 0, "runner": 0, "disk": 0}
    for task in suite.tasks:
        row = []
        for name in ("stock", "runner"):
            generate: Any = stock if name == "stock" else ours
            wrap: Any = (lambda llama: llama) if name == "stock" else Engine
            warm = wrap(load())
            turn1 = generate(warm, conversation(suite.system, task.prompt))
            second = conversation(suite.system, task.prompt, turn1)
            same = generate(warm, second) == generate(wrap(load()), second)
            totals[name] += same
            row.append("yes" if same else "**no**")
        hits = store.hits
        disk, fresh = from_disk(), Engine(load())
        loaded = store.hits == hits + 1  # the saved system turn was loaded
        first = ours(disk, conversation(suite.system, task.prompt))
        same = loaded and first == ours(fresh, conversation(suite.system, task.prompt))
        second = conversation(suite.system, task.prompt, first)
        same = same and ours(disk, second) == ours(fresh, second)
        totals["disk"] += same
        row.append("yes" if same else "**no**")
        print(f"| {task.id} | {row[0]} | {row[1]} | {row[2]} |", flush=True)
    n = len(suite.tasks)
    print(f"| **identical** | {totals['stock']}/{n} | {totals['runner']}/{n} | {totals['disk']}/{n} |")
    print(f"\nprefix folder: {store.usage()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
