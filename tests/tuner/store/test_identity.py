"""A study's identity: what two workers must share to pool their measurements."""

from __future__ import annotations

from tuner.store.identity import device_of, engine_of, mismatch, model_of
from tuner.targets.base import TargetFacts, TargetKind


def facts(kind: TargetKind, device: str = "cpu", model: str = "tiny") -> TargetFacts:
    return TargetFacts(kind, "engine_lite tiny", model, device, 8192, 4096, 16, False)


def test_the_first_difference_is_named_with_both_values():
    stored = {"slo": "tpot_p99=30ms", "device": "cuda:NVIDIA H200", "model": "llama"}
    mine = {"slo": "tpot_p99=30ms", "device": "cuda:NVIDIA L4", "model": "qwen"}
    why = mismatch("fleet", stored, mine)
    assert why is not None and why.startswith("this worker's device differs from study 'fleet'")
    assert "'cuda:NVIDIA H200'" in why and "'cuda:NVIDIA L4'" in why


def test_agreeing_workers_join_and_keys_an_older_study_lacks_are_not_checked():
    stored = {"slo": "tpot_p99=30ms", "space": {"fixed": {}, "searched": {"a": "1..2"}}}
    mine = {"slo": "tpot_p99=30ms", "space": {"searched": {"a": "1..2"}, "fixed": {}},
            "device": "cuda:NVIDIA H200"}  # fmt: skip
    assert mismatch("s", stored, mine) is None


def test_one_gpu_kind_is_one_device_whichever_index_a_node_uses():
    a = device_of(facts(TargetKind.BUILTIN, "cuda:0 (NVIDIA H200)"))
    b = device_of(facts(TargetKind.BUILTIN, "cuda:3 (NVIDIA H200)"))
    assert a == b == "cuda:NVIDIA H200"
    assert device_of(facts(TargetKind.BUILTIN, "cpu")).startswith("cpu:")


def test_a_model_folder_is_known_by_its_name_and_the_engine_by_its_versions(tmp_path):
    folder = tmp_path / "models" / "Llama-3.1-8B-Instruct"
    folder.mkdir(parents=True)
    assert model_of(facts(TargetKind.BUILTIN, model=str(folder))) == "Llama-3.1-8B-Instruct"
    assert engine_of(facts(TargetKind.BUILTIN), None).startswith("engine_lite ")
    assert "torch" in engine_of(facts(TargetKind.BUILTIN), None)
    launched = engine_of(facts(TargetKind.LAUNCH), "/opt/venv/bin/vllm serve M --port {port}")
    assert launched.startswith("vllm")
