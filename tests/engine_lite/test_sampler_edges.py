"""Sampling inputs that overflow or leave no token must not take the engine down."""

from engine_lite import LLM, SamplingParams


def test_degenerate_sampling_params_still_generate():
    llm = LLM(model="tiny", max_num_seqs=8)
    prompts = [[5, 6, 7, 8]] * 3
    params = [
        SamplingParams(max_tokens=4, temperature=1e-40, seed=1),  # 1/T overflows to inf
        SamplingParams(max_tokens=4, temperature=1.0, top_p=1e-300, seed=2),
        # every token is a stop id until min_tokens: nothing is left to sample
        SamplingParams(max_tokens=4, min_tokens=4, stop_token_ids=tuple(range(4096)), seed=3),
    ]
    outs = llm.generate(prompts, params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [4, 4, 4]
    # A near-zero temperature is greedy, as in vLLM.
    greedy = llm.generate([prompts[0]], SamplingParams(max_tokens=4, temperature=0.0))
    assert outs[0].outputs[0].token_ids == greedy[0].outputs[0].token_ids
