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

U_BW = 0.75
U_LIN = 0.15
U_ATTN = 0.30
STEP_OVERHEAD = 6e-3
HOST_LOAD_BW = 50e9  # bytes/s per GPU, host DRAM -> HBM (HiCache)

# GB10: the same kernels minus NVLink: TP all-reduces run over 200 Gb/s RoCE and the sm100 MLA
# kernels do not exist on SM121, so compute utilisation is lower and the fixed cost higher.
U_LIN_GB10 = 0.12
U_ATTN_GB10 = 0.20
STEP_OVERHEAD_GB10_STAGE = 8e-3  # per pipeline stage: RoCE all-reduces, no CUDA graphs


@dataclass(frozen=True)
class Profile:
    """One deployment as the engine model sees it (one SGLang server; ``dp_size`` ranks).

    Prefill pass over chunks with u uncached tokens on top of c computed ones, per rank:
    ``(t0 + Σu/r_lin + k_attn·Σu·(c + u/2)) / prefill_efficiency`` (+ host-tier load time).
    Decode step, per rank: ``a + t_experts·coverage(B_total/pp) + b·min(B, b_cap) + k_kv·Σctx``
    where coverage(n) = 1 − (1 − experts_per_token/num_experts)^n is the fraction of routed
    experts whose weights a step must stream. Under DP the ranks step together: a pass lasts the
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
    doc: str = field(default="", compare=False, repr=False)

    def solo_prefill_s(self, u: int, c: int) -> float:
        """Prefill time of ``u`` new tokens on top of ``c`` cached ones, alone on an idle rank: the
        engine's chunked passes (``chunked_prefill_size`` each) with nothing else in them. No
        routing or admission can give a request a smaller time to first token."""
        t = 0.0
        while u > 0:
            n = min(u, self.chunked_prefill_size)
            t += (self.t0 + n / self.r_lin + self.k_attn * n * (c + n / 2)) / self.prefill_efficiency
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


def _b300(name: str, *, kv_dtype_bytes: int, dp: int = 1, host_tokens: int = 0) -> Profile:
    gpus = 8
    kv_bytes = LATENT_ELEMS * kv_dtype_bytes  # replicated on every TP rank; per rank under DP
    mem = 0.90 * B300_HBM  # default mem_fraction_static on a 288 GB GPU (§3.1)
    w_gpu = W_TOTAL / gpus
    if dp > 1:
        w_gpu += W_ATTN * (1 - 1 / gpus)  # attention weights replicated per DP rank
    kv_gpu = mem - w_gpu
    page = 64
    c = int(kv_gpu // kv_bytes) // page * page
    ebw = B300_BW * U_BW
    t_exp = (W_EXPERTS / gpus) / ebw
    if dp == 1:
        w_dense = (W_TOTAL - W_EXPERTS) / gpus
        r_lin = gpus * B300_BF16 * U_LIN / LINEAR_FLOPS
        k_attn = ATTN_FLOPS / (gpus * B300_BF16 * U_ATTN)
    else:
        # DP attention: a rank's attention projections and attention run on its own GPU; the MoE
        # is expert-parallel over all eight.
        w_dense = W_ATTN + (W_TOTAL - W_EXPERTS - W_ATTN) / gpus
        per_tok = ATTN_PROJ_FLOPS / (B300_BF16 * U_LIN) + (LINEAR_FLOPS - ATTN_PROJ_FLOPS) / (gpus * B300_BF16 * U_LIN)
        r_lin = 1 / per_tok
        k_attn = ATTN_FLOPS / (B300_BF16 * U_ATTN)
    a = STEP_OVERHEAD + w_dense / ebw
    t0 = a + t_exp  # a prefill pass touches every expert
    k_kv = kv_bytes / ebw  # per rank, times that rank's own Σctx
    b = LINEAR_FLOPS / (gpus * B300_BF16 * U_LIN)  # per-request linear compute in a decode step
    host_rate = HOST_LOAD_BW / kv_bytes if host_tokens else 0.0
    dtype = "bf16" if kv_dtype_bytes == 2 else "fp8"
    dp_ = dp > 1
    lines = [
        f"{name}: Kimi K2-class INT4 weights on one 8×B300 node, {'DP8 attention' if dp_ else 'TP8'}, {dtype} KV.",
        f"KV bytes per token per GPU = 35,136 × {kv_dtype_bytes} = {kv_bytes:,} B "
        f"({'each rank holds only its own requests' if dp_ else 'replicated on all 8 TP ranks'}).",
        f"Capacity: 0.90 × 288 GB = {mem / 1e9:.0f} GB per GPU − weights {w_gpu / 1e9:.1f} GB"
        f"{' (incl. replicated attention)' if dp_ else ''} = {kv_gpu / 1e9:.1f} GB",
        f"  → C = {c:,} tokens per {'rank' if dp_ else 'server'} (page {page}: trtllm_mla on SM100 needs 32/64).",
        "Prefill: r_lin = "
        + (
            "1 / (6.2B-param attention projections on one GPU + the rest EP over 8)"
            if dp_
            else "8 × 2.25 PF × U_LIN / 6.4e10"
        )
        + f" = {r_lin:,.0f} tok/s at U_LIN = {U_LIN};",
        f"  k_attn = 2.5e6 / ({'1' if dp_ else '8'} × 2.25 PF × U_ATTN) = {k_attn:.3g} s per token·ctx"
        f" at U_ATTN = {U_ATTN}" + (" (all 64 heads on the rank's GPU);" if dp_ else ";"),
        f"  t0 = a + t_experts = {t0 * 1e3:.1f} ms (a prefill pass streams every expert once); prefill_efficiency 1.0.",
        f"Decode: a = {STEP_OVERHEAD * 1e3:.0f} ms overhead + {w_dense / 1e9:.1f} GB non-expert weights"
        f" / ({B300_BW / 1e12:.0f} TB/s × U_BW {U_BW}) = {a * 1e3:.2f} ms;",
        f"  {_coverage_note(t_exp)}; b = {b * 1e6:.1f} µs per request (its 6.4e10 linear FLOPs);",
        f"  k_kv = {kv_bytes:,} B / ({B300_BW / 1e12:.0f} TB/s × {U_BW}) = {k_kv * 1e9:.2f} ns per context token"
        + (" of the rank's own requests (≈ k_kv/8 over the server's Σctx)." if dp_ else "."),
        "chunked_prefill_size 16384 (SGLang default for ≥ 160 GB GPUs), max_prefill_tokens 16384, context 262,144,",
        f"max_running_requests {_max_running(c, 262144)} per rank (SGLang's default formula; KV binds first).",
    ]
    if host_tokens:
        lines += [
            f"Host tier (HiCache): {host_tokens:,} tokens of evicted KV in host DRAM; a hit loads at 50 GB/s per GPU",
            f"  (each TP rank loads its own replica in parallel) = 50e9 / {kv_bytes:,} B = {host_rate:,.0f} tokens/s,",
            "  instead of recomputing.",
        ]
    doc = "\n".join(lines)
    return Profile(
        name=name,
        kv_tokens=c,
        page_size=page,
        chunked_prefill_size=16384,
        max_prefill_tokens=16384,
        max_running_requests=_max_running(c, 262144),
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
        kv_bytes_per_token_per_gpu=kv_bytes,
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
    stage_overhead = STEP_OVERHEAD_GB10_STAGE
    a = pp * (stage_overhead + (W_TOTAL - W_EXPERTS) / nodes / ebw)
    t_exp = pp * (W_EXPERTS / nodes) / ebw
    k_kv = kv_bytes / ebw  # per stage; micro-batches keep every stage busy (see Profile)
    r_lin = nodes * GB10_BF16 * U_LIN_GB10 / LINEAR_FLOPS
    k_attn = ATTN_FLOPS / (nodes * GB10_BF16 * U_ATTN_GB10)
    t0 = a + t_exp / pp  # chunks pipeline across stages, so each stage's expert read overlaps
    b = LINEAR_FLOPS / (nodes * GB10_BF16 * U_LIN_GB10)
    lines = [
        f"{name}: Kimi K2-class INT4 on 16 DGX Spark (GB10) nodes, TP{tp}×PP{pp}, fp8 KV.",
        f"Memory: 0.82 × 119 GiB = {mem / 1e9:.0f} GB per node − weights {w_node / 1e9:.1f} GB"
        f" = {kv_node / 1e9:.1f} GB;",
        f"  KV bytes per token per node = 35,136 × {layers_max}/61 = {kv_bytes:,} B",
        f"  (latents replicated across TP, split across PP stages) → C = {c:,} tokens.",
        f"Prefill over all {nodes} nodes (chunks pipelined across stages):",
        f"  r_lin = {nodes} × 125 TF × {U_LIN_GB10} / 6.4e10 = {r_lin:,.0f} tok/s,",
        f"  k_attn = 2.5e6 / ({nodes} × 125 TF × {U_ATTN_GB10}) = {k_attn:.3g}; lower utilisation than B300",
        "  because TP all-reduces cross 200 Gb/s RoCE and SM121 lacks the sm100 MLA kernels;",
        f"  t0 = a + t_experts / {pp} = {t0 * 1e3:.0f} ms.",
        f"Decode: LPDDR5x {GB10_BW / 1e9:.0f} GB/s × U_BW {U_BW}; a = {pp} stage(s) ×",
        f"  ({stage_overhead * 1e3:.0f} ms RoCE/launch overhead without CUDA graphs + non-expert weights)"
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
from backends.sim.demo_profile import demo_profile  # noqa: E402

PROFILES[demo_profile().name] = demo_profile()
