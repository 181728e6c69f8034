"""What an engine profile is: the ``Profile`` dataclass, its time formulas, and two derivation helpers
every deployment uses (SGLang's default running cap, the expert-coverage note)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from backends.sim.profile_constants import EXPERTS_PER_TOKEN, NUM_EXPERTS


@dataclass(frozen=True)
class Profile:
    """One deployment as the engine model sees it (one SGLang server; ``dp_size`` ranks).

    Prefill pass over chunks with u uncached tokens on top of c computed ones, per rank:
    ``(t0 + Σu/r_lin + k_attn·Σu·(c + u/2) + k_kvb·Σc) / prefill_efficiency`` (+ host-tier load time).
    Decode step, per rank: ``a + t_experts·coverage(max(B_total/pp, 1)) + b·min(B, b_cap) + k_kv·Σctx``
    where coverage(n) = 1 − (1 − experts_per_token/num_experts)^n is the fraction of routed
    experts whose weights a step must stream (a pipeline stage sees B/pp requests per micro-batch,
    or one request at a time when B < pp). Under DP the ranks step together: a pass lasts the
    longest rank's time.
    """

    name: str
    kv_tokens: int
    """C: KV pool tokens per rank."""
    page_size: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int
    """Per rank."""
    context_length: int
    dp_size: int
    t0: float
    r_lin: float
    k_attn: float
    prefill_efficiency: float
    a: float
    t_experts: float
    b: float
    b_cap: int
    k_kv: float
    pp: int = 1
    tp_size: int = 1
    """GPUs per pipeline stage (SGLang's ``--tp``; under DP attention the server's tp, 8)."""
    num_experts: int = NUM_EXPERTS
    experts_per_token: int = EXPERTS_PER_TOKEN
    host_tier_tokens: int = 0
    host_load_tokens_per_s: float = 0.0
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    clip_max_new_tokens: int = 4096
    retract_decode_steps: int = 20
    schedule_policy: Literal["fcfs", "lpm"] = "fcfs"
    kv_bytes_per_token_per_gpu: int = 0
    schedule_conservativeness: float = 1.0
    """SGLang's ``--schedule-conservativeness`` after its DP handling (× 0.3 under DP attention)."""
    attn_fp8: bool = False
    """FP8 prefill attention kernels (``k_attn`` derived at the FP8 peak)."""
    prefill_cp_size: int = 1
    """Context-parallel prefill attention group (ranks whose attention shares the group's GPUs)."""
    dcp_size: int = 1
    """Decode context parallelism (SGLang ``--dcp-size``): every request's KV interleaved token by token
    over this many TP ranks, so the pool holds ``dcp_size`` × one GPU's rows and a decode step reads
    1/``dcp_size`` of each context per GPU (folded into ``kv_tokens``, ``k_kv``, ``a``, ``b`` and ``k_kvb``)."""
    kv_cache_dtype: str = "auto"
    """SGLang's ``--kv-cache-dtype`` (``auto``: the model's bf16)."""
    weight_bytes_per_gpu: float = 0.0
    """Weight bytes on each GPU (reported in ``memory_usage.weight``; 0 for the toy profiles)."""
    k_kvb: float = 0.0
    """Seconds per cached-prefix token per prefill chunk: ``kv_b_proj`` re-expansion (trtllm_mla)."""
    spec_draft_tokens: int = 0
    spec_accept_length: float = 1.0
    spec_draft_overhead: float = 0.1
    """Draft cost per draft token, as a fraction of ``a`` (one MTP layer per draft token)."""
    spec_kv_factor: float = 1.1
    """KV-read cost of a verify step against a plain step (d + 1 queries over one read)."""
    mixed_chunk: bool = False
    prefill_delayer_max_passes: int = 0
    """0: off (SGLang's default). SGLang's value when enabled: 30."""
    prefill_delayer_max_delay_s: float = 5.0
    request_overhead_s: float = 0.0
    """Fixed per-request time before the scheduler sees a request (HTTP, chat template)."""
    tokenize_tokens_per_s: float = 0.0
    """Tokeniser rate; 0: tokenisation not modelled."""
    fitted: tuple[str, ...] = ()
    """Names of the constants fitted to published figures (empty: every constant derived)."""
    eviction: Literal["lru", "lrf"] = "lru"
    """Which unreferenced prefix blocks go first when the pool is full: ``lru`` (SGLang's radix cache:
    least recently accessed leaf) or ``lrf`` (vLLM's free block queue: least recently freed, a freed
    request's tail block first)."""
    doc: str = field(default="", compare=False, repr=False)

    @property
    def kv_gb_per_gpu(self) -> float:
        """The KV pool's size on each GPU (GB): one rank's tokens, a ``dcp_size``-th of them under DCP."""
        return self.kv_tokens // self.dcp_size * self.kv_bytes_per_token_per_gpu / 1e9

    def chunk_prefill_s(self, n: int, c: int) -> float:
        """One chunk of ``n`` new tokens over ``c`` computed ones, alone in its pass."""
        return (self.t0 + n / self.r_lin + self.k_attn * n * (c + n / 2) + self.k_kvb * c) / self.prefill_efficiency

    def overhead_s(self, prompt_tokens: int) -> float:
        """Time from submit until the scheduler may queue the request (tokenisation, HTTP)."""
        t = self.request_overhead_s
        if self.tokenize_tokens_per_s > 0:
            t += prompt_tokens / self.tokenize_tokens_per_s
        return t

    def solo_prefill_s(self, u: int, c: int) -> float:
        """Prefill time of ``u`` new tokens on top of ``c`` cached ones, alone on an idle rank: the
        engine's chunked passes (``chunked_prefill_size`` each) with nothing else in them, plus the
        per-request overhead. No routing or admission can give a request a smaller time to first token."""
        t = self.overhead_s(u + c)
        while u > 0:
            n = min(u, self.chunked_prefill_size)
            t += self.chunk_prefill_s(n, c)
            c += n
            u -= n
        return t

    def with_(self, **changes: object) -> Profile:
        return replace(self, **changes)  # type: ignore[arg-type]


def coverage_note(t_exp: float) -> str:
    return (
        f"t_experts = {t_exp * 1e3:.1f} ms (the step's routed-expert bytes at full coverage); at B=1 "
        f"a step streams {EXPERTS_PER_TOKEN}/{NUM_EXPERTS} of them, saturating towards B≈100-200"
    )


def default_max_running(kv_tokens: int, context_length: int) -> int:
    # SGLang model_runner default when --max-running-requests is unset.
    return min(max(int(kv_tokens / context_length * 512), 2048), 4096)
