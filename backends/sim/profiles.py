"""Engine profiles: Kimi K2-class deployments as constants of the engine model.

Every constant is derived here, in code, from memory size, bandwidth and FLOP/s (reference
``sglang-and-kimi.md`` §6, §9) and a stated utilisation; nothing is fitted to the published
good/bad curves (§11). ``Profile.doc`` holds each profile's derivation with the numbers this
module computed, so the text can never disagree with the constants.

Model facts (Kimi K2 / K2.5, §6): 61 layers, MLA latent (512 + 64) × 61 = 35,136 elements per
token (70,272 B bf16, 35,136 B fp8), 32 B active params (6.4e10 linear FLOPs per token), 384 routed
experts with top-8, INT4 (W4A16) weights ≈ 595 GB of which ≈ 571 GB are routed experts
(60 MoE layers × 384 × 3 × 7168 × 2048 params at ≈ 4.5 bits), the rest (≈ 24 GB) attention, shared
expert, dense layer and embeddings in bf16; the attention weights alone are ≈ 12.3 GB (replicated on
every GPU under DP attention). Prefill attention (MHA form, 64 heads × (192 + 128)) costs
2 × 64 × 320 × 61 ≈ 2.5e6 FLOPs per (token, context token) pair.

Utilisations (fraction of peak), one set for every B300 profile:

- ``U_BW = 0.75`` of HBM bandwidth for decode streams (weights and KV latents): FlashMLA-class
  decode kernels reach 85-90 % of peak on long contexts, INT4 MoE GEMV kernels 60-70 %; 0.75 is
  the blend.
- ``U_LIN = 0.15`` of dense bf16 FLOP/s for the linear/MoE part of prefill (W4A16 runs on bf16
  tensor cores): ≈ 35 % grouped-GEMM efficiency on thin TP8 expert shards (2048 / 8 = 256 wide)
  × ≈ 0.75 for non-overlapped TP all-reduces × ≈ 0.6 for routing, norms and other kernels.
- ``U_ATTN = 0.30`` of dense bf16 FLOP/s for prefill attention: causal masking, only 8 heads
  per GPU under TP8, head dim 192 and the per-chunk up-projection of cached latents keep it well
  below the 60-70 % FlashAttention reaches on plain MHA.
- Fixed per-step overhead 6 ms: the published H200 TPOT at batch 1 (9.2 ms, §8) minus its weight
  streaming time (≈ 4.5 GB per GPU at 4.8 TB/s × U_BW ≈ 1.3 ms) and rounded down for NVLink 5
  (TP all-reduces, launches, sampling, MoE routing).

bf16 and fp8 KV differ only in bytes per token (capacity and decode ``k_kv``): prefill attention
computes in bf16 either way, so the B300 profiles share every compute constant and
``prefill_efficiency`` is 1.0 for all of them.

Engine options (issue 12), each a ``Profile`` field with its derivation in ``_b300``:

- **DP attention defaults** (SGLang ``srt/arg_groups/parallel_hook.py`` ``handle_data_parallelism``,
  ``_handle_data_parallelism`` in older ``server_args.py``): ``chunked_prefill_size //= dp_size``
  (16384 → 2048 per rank) and ``schedule_conservativeness *= 0.3`` (initial new-token ratio
  0.7 × 0.3 = 0.21).
- **FP8 prefill attention** (``attn_fp8``): the sm100 FP8 attention kernels run at twice the bf16
  peak (B300 dense FP8 ≈ 4.5 PF), so ``k_attn`` halves at the same utilisation.
- **Context-parallel prefill attention** (``prefill_cp_size``; SGLang's ``mla_use_prefill_cp``): a
  rank's prefill attention is spread over a CP group of GPUs, so ``k_attn`` is divided by the group
  size; the group's GPUs are shared, so the engine sums the attention time of every rank of a group
  that prefills in the same pass.
- **``kv_b_proj`` prefix re-expansion** (``k_kvb``): Blackwell's ``trtllm_mla`` extend path
  (``MHA_CHUNKED_KV``) re-expands the whole cached prefix through ``kv_b_proj`` for every chunk:
  2 · 512 · 64·(128 + 128) · 61 ≈ 1.0e9 FLOPs per prefix token per chunk, at the attention FLOP
  rate (+20 % of attention at 2048-token chunks, +2.5 % at 16384).
- **Speculative decoding** (``spec_draft_tokens`` d, ``spec_accept_length`` L): a verify step
  carries d + 1 tokens per request, reads the KV once (``spec_kv_factor`` 1.1 for the extra
  queries), pays ``spec_draft_overhead`` × ``a`` per draft token for the MTP/EAGLE draft passes,
  and yields L tokens per request; off by default (d = 0, L = 1).
- **``max_running_requests``** per rank: SGLang's default formula, or a deployment's
  ``--max-running-requests`` divided by ``dp_size`` under DP attention (``pool_configurator.py``).
- **Per-request fixed overhead** (``request_overhead_s`` + prompt / ``tokenize_tokens_per_s``):
  TokenizerManager tokenises every prompt and the HTTP layer parses it before the scheduler sees
  it; 0 (not modelled) except where fitted.
- **Mixed chunk** (``--enable-mixed-chunk``) and the **prefill delayer** (``--enable-prefill-delayer``,
  ``prefill_delayer_max_delay_passes`` 30 in ``srt/arg_groups/fields/schedule.py``): both off by
  default, as in SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

# ---- model (Kimi K2 / K2.5) -------------------------------------------------------------
LAYERS = 61
LATENT_ELEMS = (512 + 64) * LAYERS  # 35,136 elements per token, all layers
LINEAR_FLOPS = 2 * 32e9  # per token, 32 B active params
ATTN_FLOPS = 2 * 64 * (192 + 128) * LAYERS  # per (token, context token) pair, MHA-form prefill
ATTN_PROJ_FLOPS = 2 * 6.2e9  # per token: the attention projections (≈ 6.2 B params)
W_TOTAL = 595e9  # INT4 checkpoint bytes
W_EXPERTS = 571e9  # routed experts (INT4 + group scales)
W_ATTN = 12.3e9  # attention weights, bf16
NUM_EXPERTS = 384
EXPERTS_PER_TOKEN = 8

# ---- hardware -----------------------------------------------------------------------------
B300_HBM = 288e9
B300_BW = 8e12
B300_BF16 = 2.25e15  # dense bf16 FLOP/s per GPU
GB10_MEM = 119 * 2**30  # usable unified memory per node
GB10_BW = 273e9
GB10_BF16 = 125e12  # 1 PFLOP FP4 sparse -> 0.5 dense FP4 -> 0.125 dense bf16

KVB_FLOPS = 2 * 512 * 64 * (128 + 128) * LAYERS  # kv_b_proj re-expansion per prefix token per chunk

U_BW = 0.75
U_LIN = 0.15
U_ATTN = 0.30
FP8_ATTN_SPEEDUP = 2.0  # B300 dense FP8 ≈ 4.5 PF against 2.25 PF bf16
STEP_OVERHEAD = 6e-3
DP_CONSERVATIVENESS = 0.3  # SGLang handle_data_parallelism: schedule_conservativeness *= 0.3
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
HOST_LOAD_BW = 50e9  # bytes/s per GPU, host DRAM -> HBM (HiCache)

# GB10 (issue 12, re-derived against the 16×GB10 post: 750 tok/s prefill, 20 tok/s average decode,
# 38 peak; vLLM and K3, so a target with that caveat). SM121 has no sm100 MLA kernels and bf16 MMA
# with FP32 accumulate runs at half rate (62 TF effective, not 125); prefill then runs at the
# utilisation the post measured (the only GB10 measurement): TP all-reduces over 200 Gb/s RoCE,
# serialised with compute without CUDA graphs, and generic W4A16 MoE kernels.
GB10_BF16_EFFECTIVE = GB10_BF16 / 2
U_LIN_GB10 = 0.06
U_ATTN_GB10 = 0.10
# Decode overhead per pipeline stage, no CUDA graphs (multi-node capture deadlocks, §7.3): 1.5 ms
# of launches plus 2 all-reduces per layer, each log2(tp) RoCE hops of ~25 µs.
GB10_LAUNCH_OVERHEAD = 1.5e-3
GB10_ALLREDUCE_HOP = 25e-6


def _gb10_stage_overhead(tp: int, layers: int) -> float:
    hops = max(1, (tp - 1).bit_length())
    return GB10_LAUNCH_OVERHEAD + 2 * layers * hops * GB10_ALLREDUCE_HOP


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
    doc: str = field(default="", compare=False, repr=False)

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


def _coverage_note(t_exp: float) -> str:
    return (
        f"t_experts = {t_exp * 1e3:.1f} ms (the step's routed-expert bytes at full coverage); at B=1 "
        f"a step streams {EXPERTS_PER_TOKEN}/{NUM_EXPERTS} of them, saturating towards B≈100-200"
    )


def _max_running(kv_tokens: int, context_length: int) -> int:
    # SGLang model_runner default when --max-running-requests is unset.
    return min(max(int(kv_tokens / context_length * 512), 2048), 4096)


@dataclass(frozen=True)
class Fit:
    """Constants of the one fitted profile (``b300-dp8-fp8-cp``), from ``loadtest/fit_good.py``."""

    u_attn: float
    u_lin: float
    max_running_total: int
    tokenize_tokens_per_s: float
    request_overhead_s: float
    spec_draft_tokens: int = 0
    spec_accept_length: float = 1.0


# Fitted to the published good deployment (reference §11) by ``python -m loadtest.fit_good``; the
# residuals are in docs/calibration.md. The one place the "derive, never fit" rule is broken.
GOOD_FIT = Fit(u_attn=0.6, u_lin=0.45, max_running_total=40, tokenize_tokens_per_s=1.0e6, request_overhead_s=0.05,
               spec_draft_tokens=1, spec_accept_length=1.3)


def _b300(
    name: str,
    *,
    kv_dtype_bytes: int,
    dp: int = 1,
    host_tokens: int = 0,
    attn_fp8: bool = False,
    cp: int = 1,
    fit: Fit | None = None,
) -> Profile:
    gpus = 8
    kv_bytes = LATENT_ELEMS * kv_dtype_bytes  # replicated on every TP rank; per rank under DP
    mem = 0.90 * B300_HBM  # default mem_fraction_static on a 288 GB GPU (§3.1)
    w_gpu = W_TOTAL / gpus
    attn_tp = gpus // dp  # GPUs of one attention-DP rank (1 under DP8)
    if dp > 1:
        w_gpu += W_ATTN * (1 / attn_tp - 1 / gpus)  # attention weights replicated per DP rank
    kv_gpu = mem - w_gpu
    page = 64
    c = int(kv_gpu // kv_bytes) // page * page
    ebw = B300_BW * U_BW
    t_exp = (W_EXPERTS / gpus) / ebw
    u_lin = fit.u_lin if fit else U_LIN
    u_attn = fit.u_attn if fit else U_ATTN
    attn_peak = B300_BF16 * (FP8_ATTN_SPEEDUP if attn_fp8 else 1.0)
    if dp == 1:
        w_dense = (W_TOTAL - W_EXPERTS) / gpus
        r_lin = gpus * B300_BF16 * u_lin / LINEAR_FLOPS
        attn_gpus = gpus
    else:
        # DP attention: a rank's attention projections and attention run on its own GPU (or its
        # context-parallel group's); the MoE is expert-parallel over all eight.
        w_dense = W_ATTN / attn_tp + (W_TOTAL - W_EXPERTS - W_ATTN) / gpus
        per_tok = (ATTN_PROJ_FLOPS / (attn_tp * B300_BF16 * u_lin)
                   + (LINEAR_FLOPS - ATTN_PROJ_FLOPS) / (gpus * B300_BF16 * u_lin))
        r_lin = 1 / per_tok
        attn_gpus = cp if cp > 1 else attn_tp
    k_attn = ATTN_FLOPS / (attn_gpus * attn_peak * u_attn)
    k_kvb = KVB_FLOPS / (attn_gpus * attn_peak * u_attn)  # the re-expansion GEMM runs where attention does
    a = STEP_OVERHEAD + w_dense / ebw
    t0 = a + t_exp  # a prefill pass touches every expert
    k_kv = kv_bytes / ebw  # per rank, times that rank's own Σctx
    b = LINEAR_FLOPS / (gpus * B300_BF16 * u_lin)  # per-request linear compute in a decode step
    host_rate = HOST_LOAD_BW / kv_bytes if host_tokens else 0.0
    dtype = "bf16" if kv_dtype_bytes == 2 else "fp8"
    dp_ = dp > 1
    chunk = 16384 // dp  # SGLang handle_data_parallelism: chunked_prefill_size // dp_size
    conservativeness = DP_CONSERVATIVENESS if dp_ else 1.0  # ... and schedule_conservativeness *= 0.3
    max_running = _max_running(c, 262144) if fit is None else fit.max_running_total // dp
    attn_where = f"{cp} GPUs (context-parallel group)" if cp > 1 else str(attn_tp)
    peak_txt = f"{attn_peak / 1e15:.2f} PF {'FP8' if attn_fp8 else 'bf16'}"
    lines = [
        f"{name}: Kimi K2-class INT4 weights on one 8×B300 node, {f'DP{dp} attention' if dp_ else 'TP8'}, {dtype} KV"
        + (f", FP8 context-parallel (CP{cp}) prefill attention." if cp > 1 else "."),
        f"KV bytes per token per GPU = 35,136 × {kv_dtype_bytes} = {kv_bytes:,} B "
        f"({'each rank holds only its own requests' if dp_ else 'replicated on all 8 TP ranks'}).",
        f"Capacity: 0.90 × 288 GB = {mem / 1e9:.0f} GB per GPU − weights {w_gpu / 1e9:.1f} GB"
        f"{' (incl. replicated attention)' if dp_ else ''} = {kv_gpu / 1e9:.1f} GB",
        f"  → C = {c:,} tokens per {'rank' if dp_ else 'server'} (page {page}: trtllm_mla on SM100 needs 32/64).",
        "Prefill: r_lin = "
        + (
            f"1 / (6.2B-param attention projections on the rank's {attn_tp} GPU(s) + the rest EP over 8)"
            if dp_
            else "8 × 2.25 PF × U_LIN / 6.4e10"
        )
        + f" = {r_lin:,.0f} tok/s at U_LIN = {u_lin};",
        f"  k_attn = 2.5e6 / ({attn_where} × {peak_txt} × U_ATTN) = {k_attn:.3g} s per token·ctx"
        f" at U_ATTN = {u_attn}" + (" (all 64 heads on the rank's GPU);" if dp_ and cp == 1 else ";"),
        f"  k_kvb = 1.0e9 / (same rate) = {k_kvb:.3g} s per cached-prefix token per chunk (kv_b_proj"
        f" re-expansion on trtllm_mla: +{KVB_FLOPS / (ATTN_FLOPS * chunk):.1%} of attention at {chunk}-token chunks);",
        f"  t0 = a + t_experts = {t0 * 1e3:.1f} ms (a prefill pass streams every expert once); prefill_efficiency 1.0.",
        f"Decode: a = {STEP_OVERHEAD * 1e3:.0f} ms overhead + {w_dense / 1e9:.1f} GB non-expert weights"
        f" / ({B300_BW / 1e12:.0f} TB/s × U_BW {U_BW}) = {a * 1e3:.2f} ms;",
        f"  {_coverage_note(t_exp)}; b = {b * 1e6:.1f} µs per request (its 6.4e10 linear FLOPs);",
        f"  k_kv = {kv_bytes:,} B / ({B300_BW / 1e12:.0f} TB/s × {U_BW}) = {k_kv * 1e9:.2f} ns per context token"
        + (f" of the rank's own requests (≈ k_kv/{dp} over the server's Σctx)." if dp_ else "."),
        f"chunked_prefill_size {chunk} per "
        + ("rank (SGLang DP attention: 16384 // 8)," if dp_ else "server (SGLang default for ≥ 160 GB GPUs),")
        + f" schedule_conservativeness {conservativeness:g}"
        f" (initial new-token ratio {INIT_NEW_TOKEN_RATIO * conservativeness:.2f}),"
        " max_prefill_tokens 16384, context 262,144,",
        f"max_running_requests {max_running} per rank"
        + (
            " (SGLang's default formula; KV binds first)."
            if fit is None
            else f" (--max-running-requests {fit.max_running_total} // dp_size {dp})."
        ),
    ]
    if host_tokens:
        lines += [
            f"Host tier (HiCache): {host_tokens:,} tokens of evicted KV in host DRAM; a hit loads at 50 GB/s per GPU",
            f"  (each TP rank loads its own replica in parallel) = 50e9 / {kv_bytes:,} B = {host_rate:,.0f} tokens/s,",
            "  instead of recomputing.",
        ]
    fitted: tuple[str, ...] = ()
    overhead = 0.0
    tok_rate = 0.0
    if fit is not None:
        fitted = ("U_ATTN", "U_LIN", "max_running_requests", "tokenize_tokens_per_s", "request_overhead_s",
                  "spec_accept_length")
        overhead, tok_rate = fit.request_overhead_s, fit.tokenize_tokens_per_s
        lines += [
            f"FITTED (python -m loadtest.fit_good): U_ATTN {fit.u_attn} of the FP8 peak, U_LIN {fit.u_lin},"
            f" --max-running-requests {fit.max_running_total},",
            f"  per-request overhead {overhead * 1e3:.0f} ms + prompt / {tok_rate:,.0f} tokens/s (tokenisation, HTTP);"
            " every other constant is derived as above;",
            f"  MTP speculative decoding with {fit.spec_draft_tokens} draft token(s),"
            f" accept length {fit.spec_accept_length}.",
        ]
    doc = "\n".join(lines)
    return Profile(
        name=name,
        kv_tokens=c,
        page_size=page,
        chunked_prefill_size=chunk,
        max_prefill_tokens=16384,
        max_running_requests=max_running,
        context_length=262144,
        dp_size=dp,
        t0=t0,
        r_lin=r_lin,
        k_attn=k_attn,
        prefill_efficiency=1.0,
        a=a,
        t_experts=t_exp,
        b=b,
        b_cap=4096,
        k_kv=k_kv,
        tp_size=gpus,
        host_tier_tokens=host_tokens,
        host_load_tokens_per_s=host_rate,
        init_new_token_ratio=INIT_NEW_TOKEN_RATIO * conservativeness,
        schedule_conservativeness=conservativeness,
        kv_bytes_per_token_per_gpu=kv_bytes,
        attn_fp8=attn_fp8,
        prefill_cp_size=cp,
        k_kvb=k_kvb,
        request_overhead_s=overhead,
        tokenize_tokens_per_s=tok_rate,
        fitted=fitted,
        spec_draft_tokens=fit.spec_draft_tokens if fit else 0,
        spec_accept_length=fit.spec_accept_length if fit else 1.0,
        doc=doc,
    )


def _gb10(name: str, *, tp: int, pp: int) -> Profile:
    nodes = tp * pp
    layers_max = -(-LAYERS // pp)  # the stage holding the most layers binds the pool
    kv_bytes = LATENT_ELEMS // LAYERS * layers_max  # fp8, one node holds its stage's layers
    mem = 0.82 * GB10_MEM  # mem_fraction_static within 0.80-0.85: unified memory shared with the OS
    w_node = W_TOTAL / nodes
    kv_node = mem - w_node
    page = 64
    c = int(kv_node // kv_bytes) // page * page
    ebw = GB10_BW * U_BW
    stage_overhead = _gb10_stage_overhead(tp, layers_max)
    a = pp * (stage_overhead + (W_TOTAL - W_EXPERTS) / nodes / ebw)
    t_exp = pp * (W_EXPERTS / nodes) / ebw
    k_kv = kv_bytes / ebw  # per stage; micro-batches keep every stage busy (see Profile)
    r_lin = nodes * GB10_BF16_EFFECTIVE * U_LIN_GB10 / LINEAR_FLOPS
    k_attn = ATTN_FLOPS / (nodes * GB10_BF16_EFFECTIVE * U_ATTN_GB10)
    t0 = a + t_exp / pp  # chunks pipeline across stages, so each stage's expert read overlaps
    b = LINEAR_FLOPS / (nodes * GB10_BF16_EFFECTIVE * U_LIN_GB10)
    lines = [
        f"{name}: Kimi K2-class INT4 on 16 DGX Spark (GB10) nodes, TP{tp}×PP{pp}, fp8 KV.",
        f"Memory: 0.82 × 119 GiB = {mem / 1e9:.0f} GB per node − weights {w_node / 1e9:.1f} GB"
        f" = {kv_node / 1e9:.1f} GB;",
        f"  KV bytes per token per node = 35,136 × {layers_max}/61 = {kv_bytes:,} B",
        f"  (latents replicated across TP, split across PP stages) → C = {c:,} tokens.",
        f"Prefill over all {nodes} nodes (chunks pipelined across stages):",
        f"  r_lin = {nodes} × 62 TF (bf16, FP32 accumulate) × {U_LIN_GB10} / 6.4e10 = {r_lin:,.0f} tok/s,",
        f"  k_attn = 2.5e6 / ({nodes} × 62 TF × {U_ATTN_GB10}) = {k_attn:.3g}; utilisation from the 16×GB10 post",
        "  (750 tok/s prefill): TP all-reduces over 200 Gb/s RoCE without CUDA graphs, no sm100 MLA kernels on SM121;",
        f"  t0 = a + t_experts / {pp} = {t0 * 1e3:.0f} ms.",
        f"Decode: LPDDR5x {GB10_BW / 1e9:.0f} GB/s × U_BW {U_BW}; a = {pp} stage(s) ×",
        f"  ({stage_overhead * 1e3:.1f} ms = 1.5 ms launches + 2 × {layers_max} layers ×"
        f" {max(1, (tp - 1).bit_length())} RoCE hops × 25 µs, no CUDA graphs; + non-expert weights)"
        f" = {a * 1e3:.1f} ms;",
        f"  {_coverage_note(t_exp)};",
        f"  k_kv = {kv_bytes:,} B / {ebw / 1e9:.0f} GB/s = {k_kv * 1e9:.0f} ns per context token per stage",
        f"  (with {pp} stage(s) and B < {pp} the stages run one after another; see the engine).",
        "chunked_prefill_size 8192 (SGLang default for 60-160 GB GPUs), context 262,144.",
    ]
    doc = "\n".join(lines)
    return Profile(
        name=name,
        kv_tokens=c,
        page_size=page,
        chunked_prefill_size=8192,
        max_prefill_tokens=16384,
        max_running_requests=_max_running(c, 262144),
        context_length=262144,
        dp_size=1,
        t0=t0,
        r_lin=r_lin,
        k_attn=k_attn,
        prefill_efficiency=1.0,
        a=a,
        t_experts=t_exp,
        b=b,
        b_cap=4096,
        k_kv=k_kv,
        pp=pp,
        tp_size=tp,
        kv_bytes_per_token_per_gpu=kv_bytes,
        doc=doc,
    )


def _tiny() -> Profile:
    doc = """tiny: a toy server for live tests on a 2-core machine, not a hardware model.
64k tokens of KV, page 16, 2048-token chunks, contexts up to ~8k (context_length 32768). Constants are chosen
so that one step is tens of milliseconds (a Python twin keeps up) and a full 8k recompute costs ~0.5 s while a
cached turn costs ~50 ms: the same cached/uncached contrast as the B300 node, ~20× shorter. 16 conversations
of ~4-8k context sent round-robin over 4 backends put every conversation on every backend: 64-128k of
history per 64k pool, so each backend evicts within the first minute."""
    return Profile(
        name="tiny",
        kv_tokens=65536,
        page_size=16,
        chunked_prefill_size=2048,
        max_prefill_tokens=4096,
        max_running_requests=64,
        context_length=32768,
        dp_size=1,
        t0=0.01,
        r_lin=40_000.0,
        k_attn=5e-9,
        prefill_efficiency=1.0,
        a=0.012,
        t_experts=0.004,
        b=2e-5,
        b_cap=64,
        k_kv=1e-7,
        doc=doc,
    )


def _build() -> dict[str, Profile]:
    profiles = [
        _b300("b300-tp8-bf16", kv_dtype_bytes=2),
        _b300("b300-tp8-fp8", kv_dtype_bytes=1),
        _b300("b300-tp8-fp8-hicache", kv_dtype_bytes=1, host_tokens=8_000_000),
        _b300("b300-dp8-fp8", kv_dtype_bytes=1, dp=8),
        _b300("b300-dp2-bf16", kv_dtype_bytes=2, dp=2),
        _b300("b300-dp8-fp8-cp", kv_dtype_bytes=1, dp=8, attn_fp8=True, cp=8, fit=GOOD_FIT),
        _gb10("gb10x16-tp4pp4-fp8", tp=4, pp=4),
        _gb10("gb10x16-tp16-fp8", tp=16, pp=1),
        _tiny(),
    ]
    return {p.name: p for p in profiles}


PROFILES: dict[str, Profile] = _build()


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}") from None


# ---- issue 15: the live demo's twin profile, kept in its own module (backends/sim/demo_profile.py) ----
from backends.sim.demo_profile import DEMO_FIELDS  # noqa: E402

PROFILES[DEMO_FIELDS["name"]] = Profile(**DEMO_FIELDS)
