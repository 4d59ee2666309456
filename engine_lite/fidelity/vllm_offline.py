"""Runs prompts through vLLM's offline `LLM` class and times each pass (a script).

Run by the interpreter that has vLLM (it may be another virtual environment): a JSON job on
stdin, one JSON result on stdout. Used to check that vLLM and engine_lite produce the same
greedy tokens from the same weights, and to time both on the same batch.

job: {"model": DIR, "prompts": [[ids]], "max_tokens": N, "max_model_len": N, "repeats": N,
      "engine_args": {...vllm.LLM keyword arguments...}}
result: {"token_ids": [[ids]], "seconds": [per pass], "prompt_tokens": N, "output_tokens": N}
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    job = json.load(sys.stdin)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=job["model"], max_model_len=job["max_model_len"], enable_prefix_caching=False,
        dtype="float32", seed=0, **job.get("engine_args", {}),
    )  # fmt: skip
    params = SamplingParams(max_tokens=job["max_tokens"], temperature=0.0, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in job["prompts"]]
    llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up: compile and allocate first
    seconds, outs = [], []
    for _ in range(job.get("repeats", 1)):
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
    result = {
        "token_ids": [list(o.outputs[0].token_ids) for o in outs],
        "seconds": seconds,
        "prompt_tokens": sum(len(p) for p in job["prompts"]),
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
    }
    sys.stdout.write("\nRESULT " + json.dumps(result) + "\n")


if __name__ == "__main__":  # vLLM starts its engine in a spawned process
    main()
