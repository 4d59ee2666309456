"""Next-token sampling: greedy, or temperature + top-p with a generator per seeded request."""

from __future__ import annotations

import torch

from engine_lite.request import Request

# vLLM V1 treats a temperature below this as greedy: dividing by it would overflow to inf/NaN.
_SAMPLING_EPS = 1e-5


class Sampler:
    """Turns one logits row per request into a token id.

    A request with `seed` draws from its own `torch.Generator`, so its tokens do not depend on
    what else shares the batch (vLLM's per-request seed semantics); requests without one share a
    generator seeded once from the engine seed.
    """

    def __init__(self, device: torch.device, seed: int, eos_token_id: int | None) -> None:
        self.device = device
        self.eos_token_id = eos_token_id
        self._shared = torch.Generator(device=device).manual_seed(seed)
        self._seeded: dict[str, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        """logits: [len(requests), vocab]; returns one token id per request."""
        self._block_early_stops(logits, requests)
        greedy = [r.sampling_params.temperature < _SAMPLING_EPS for r in requests]
        if all(greedy):
            return logits.argmax(dim=-1).tolist()
        tokens = logits.argmax(dim=-1).tolist() if any(greedy) else [0] * len(requests)
        for row, req in enumerate(requests):
            if not greedy[row]:
                tokens[row] = self._draw(logits[row], req)
        return tokens

    def release(self, request_id: str) -> None:
        """Forgets a finished request's generator."""
        self._seeded.pop(request_id, None)

    def _block_early_stops(self, logits: torch.Tensor, requests: list[Request]) -> None:
        # vLLM's min_tokens: until a request has min_tokens outputs, its stop tokens (EOS unless
        # ignore_eos, plus stop_token_ids) cannot be sampled at all.
        for row, req in enumerate(requests):
            params = req.sampling_params
            if len(req.output_token_ids) >= params.min_tokens:
                continue
            banned = list(params.stop_token_ids)
            if self.eos_token_id is not None and not params.ignore_eos:
                banned.append(self.eos_token_id)
            banned = [t for t in banned if t < logits.shape[1]]
            if banned:
                logits[row, banned] = float("-inf")

    def _draw(self, row: torch.Tensor, req: Request) -> int:
        params = req.sampling_params
        probs = torch.softmax(row.float() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            probs = _top_p(probs, params.top_p)
        if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0.0:
            # Every token banned (min_tokens with stop ids covering the vocabulary) or an
            # underflow: no distribution is left, so take the best remaining logit rather than
            # let multinomial raise and take the whole batch down with it.
            return int(row.argmax().item())
        token = torch.multinomial(probs, 1, generator=self._generator(req))
        return int(token.item())

    def _generator(self, req: Request) -> torch.Generator:
        seed = req.sampling_params.seed
        if seed is None:
            return self._shared
        gen = self._seeded.get(req.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device).manual_seed(seed)
            self._seeded[req.request_id] = gen
        return gen


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al. 2020): keep the smallest set with mass >= top_p."""
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    sorted_probs[mass_before >= top_p] = 0.0  # the top token always survives (mass_before 0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
