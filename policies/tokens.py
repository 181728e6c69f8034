"""Estimating prompt tokens from bytes, with a ratio learned from the usage backends report."""

from __future__ import annotations


class TokenEstimator:
    """tokens ≈ bytes × ratio, the ratio an exponentially weighted mean of reported tokens/bytes.

    Formula: ``ratio ← (1 − alpha)·ratio + alpha·(prompt_tokens / prompt_bytes)`` for each completed
    request with at least ``min_bytes`` bytes. Parameters: ``initial`` 0.25 tokens per byte (about 4
    bytes per token, typical of code and English under Kimi's tokenizer), ``alpha`` 0.05,
    ``min_bytes`` 256 (tiny requests are dominated by the chat template's own tokens).
    """

    def __init__(self, initial: float = 0.25, alpha: float = 0.05, min_bytes: int = 256) -> None:
        self.ratio = initial
        self.alpha = alpha
        self.min_bytes = min_bytes

    def estimate(self, prompt_bytes: int) -> int:
        return max(1, round(prompt_bytes * self.ratio))

    def observe(self, prompt_bytes: int, prompt_tokens: int) -> None:
        if prompt_bytes >= self.min_bytes and prompt_tokens > 0:
            self.ratio += self.alpha * (prompt_tokens / prompt_bytes - self.ratio)
