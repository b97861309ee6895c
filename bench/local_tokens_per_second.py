"""Tokens per second of the local backend on this machine, with the tiny test model.

Builds the same 2-layer Llama as the tests (tests/support/tiny_model.py) in a temporary directory, then
times LocalBackend.generate (the whole path: worker thread, sampling, detokenization, events)
and, for reference, transformers' own `generate` on the same model.

    python bench/local_tokens_per_second.py [--tokens 256] [--runs 5] [--threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from backends.local.backend import LocalBackend
from gateway.core.canonical import ChatRequest, Usage
from tests.support.tiny_model import save_tiny_model

MESSAGES = [{"role": "user", "content": "Tell me a story about the café by the river."}]


async def backend_rate(backend: LocalBackend, tokens: int, runs: int, **params) -> float:
    """Completion tokens per second over `runs` requests (after one warm-up request)."""
    eos = {str(i): -100 for i in backend.eos_ids}  # every request runs to max_tokens
    request = ChatRequest(model="tiny", messages=MESSAGES, max_tokens=tokens, logit_bias=eos, **params)
    generated, elapsed = 0, 0.0
    for run in range(runs + 1):
        started = time.perf_counter()
        events = [e async for e in backend.generate(request)]
        usage = next(e for e in events if isinstance(e, Usage))
        if run:  # the first run warms up
            elapsed += time.perf_counter() - started
            generated += usage.completion_tokens
    return generated / elapsed


def transformers_rate(backend: LocalBackend, tokens: int, runs: int) -> float:
    prompt = backend.prompt_ids(MESSAGES)
    input_ids = torch.tensor([prompt])
    bad = [[i] for i in backend.eos_ids]
    elapsed = 0.0
    for run in range(runs + 1):
        started = time.perf_counter()
        backend.model.generate(
            input_ids, do_sample=True, max_new_tokens=tokens, min_new_tokens=tokens, bad_words_ids=bad
        )
        if run:
            elapsed += time.perf_counter() - started
    return tokens * runs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="completion tokens per request")
    parser.add_argument("--runs", type=int, default=5, help="timed requests per case")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as directory:
        model_dir = save_tiny_model(Path(directory) / "tiny")
        backend = LocalBackend(model="tiny", path=str(model_dir), device="cpu")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, device cpu, tiny Llama")
    cases = {
        "local backend, n=1, sampled": {"seed": 1},
        "local backend, n=1, greedy": {"temperature": 0},
        "local backend, n=1, logprobs + 5 top": {"seed": 1, "logprobs": True, "top_logprobs": 5},
        "local backend, n=4 (one batch)": {"seed": 1, "n": 4},
    }
    for name, params in cases.items():
        rate = asyncio.run(backend_rate(backend, args.tokens, args.runs, **params))
        print(f"{name:40s} {rate:8.0f} tokens/s")
    rate = transformers_rate(backend, args.tokens, args.runs)
    print(f"{'transformers generate (reference), n=1':40s} {rate:8.0f} tokens/s")


if __name__ == "__main__":
    main()
