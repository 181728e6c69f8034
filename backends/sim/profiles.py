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

Engine options, each a ``Profile`` field with its derivation in ``_b300``:

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
- **Decode context parallelism** (``dcp_size``; SGLang ``--dcp-size``, ``profile_dcp.py``): the TP ranks
  interleave every request's latent instead of each holding a replica: pool × ``dcp_size``, ``k_kv`` /
  ``dcp_size``, plus its collectives and prefix gathers; ``b300-tp8-fp8-dcp8`` is the TP8 fp8 node with it on.
- **Speculative decoding** (``spec_draft_tokens`` d, ``spec_accept_length`` L): a verify step
  carries d + 1 tokens per request, reads the KV once (``spec_kv_factor`` 1.1 for the extra
  queries), pays ``spec_draft_overhead`` × ``a`` per draft token for the MTP/EAGLE draft passes,
  and yields L tokens per request; off by default (d = 0, L = 1).
- **``max_running_requests``** per rank: SGLang's default formula, or a deployment's
  ``--max-running-requests`` divided by ``dp_size`` under DP attention (``pool_configurator.py``).
- **Per-request fixed overhead** (``request_overhead_s`` + prompt / ``tokenize_tokens_per_s``):
  TokenizerManager tokenises every prompt and the HTTP layer parses it before the scheduler sees
  it; 0 (not modelled) except where fitted.
- **Plain data parallelism** (``gpus`` < 8: ``--tp 4 --dp 2`` without DP attention): each replica is
  a whole TP4 server on half the node (full weights, so 3.14M fp8 tokens of KV each), simulated as
  ``--backends 2 --policy direct`` because SGLang's DataParallelController round-robins requests
  over the replicas by default (``load_balance_method`` ``auto`` resolves to ``round_robin`` outside PD
  disaggregation): the named miss source of ``b300-tp4-fp8``, the collapsing profile. Every conversation
  ends up resident on both replicas, so the pair's effective capacity is one replica's pool (3.14M fp8
  tokens: 16 mature conversations fit, 32 do not). Its collapse is measured in the steady state
  (``--warm-start``, mature conversations as in the published runs; ``docs/calibration.md``).
- **Mixed chunk** (``--enable-mixed-chunk``) and the **prefill delayer** (``--enable-prefill-delayer``,
  ``prefill_delayer_max_delay_passes`` 30 in ``srt/arg_groups/fields/schedule.py``): both off by
  default, as in SGLang.
"""

from __future__ import annotations

from backends.sim.profile_constants import (
    ATTN_FLOPS,
    ATTN_PROJ_FLOPS,
    B300_BF16,
    B300_BW,
    B300_HBM,
    DP_CONSERVATIVENESS,
    FP8_ATTN_SPEEDUP,
    HOST_LOAD_BW,
    INIT_NEW_TOKEN_RATIO,
    KVB_FLOPS,
    LATENT_ELEMS,
    LINEAR_FLOPS,
    STEP_OVERHEAD,
    U_ATTN,
    U_BW,
    U_LIN,
    W_ATTN,
    W_EXPERTS,
    W_TOTAL,
)
from backends.sim.profile_dcp import DcpCost
from backends.sim.profile_fit import GOOD_FIT, Fit
from backends.sim.profile_model import Profile, coverage_note, default_max_running
from backends.sim.profiles_gb10 import gb10, vllm_variant

# Re-exported: the profile type and the constants the tests and the fit read from here.
__all__ = [
    "ATTN_FLOPS",
    "B300_BF16",
    "B300_BW",
    "GOOD_FIT",
    "KVB_FLOPS",
    "PROFILES",
    "U_ATTN",
    "U_BW",
    "U_LIN",
    "Fit",
    "Profile",
    "get_profile",
]


def _b300(
    name: str,
    *,
    kv_dtype_bytes: int,
    dp: int = 1,
    host_tokens: int = 0,
    attn_fp8: bool = False,
    cp: int = 1,
    fit: Fit | None = None,
    gpus: int = 8,
    front_end: Fit | None = None,
    dcp: int = 1,
) -> Profile:
    if dcp > 1 and (dp > 1 or gpus % dcp):
        raise ValueError("decode context parallelism shards a TP group's KV: dp 1 and dcp dividing the GPUs")
    kv_bytes = LATENT_ELEMS * kv_dtype_bytes  # replicated on every TP rank; per rank under DP
    mem = 0.90 * B300_HBM  # default mem_fraction_static on a 288 GB GPU (§3.1)
    w_gpu = W_TOTAL / gpus
    attn_tp = gpus // dp  # GPUs of one attention-DP rank (1 under DP8)
    if dp > 1:
        w_gpu += W_ATTN * (1 / attn_tp - 1 / gpus)  # attention weights replicated per DP rank
    kv_gpu = mem - w_gpu
    page = 64
    rows = int(kv_gpu // kv_bytes) // page * page  # tokens one GPU's pool holds
    c = rows * dcp  # SGLang logical_token_capacity: rows × attn_dcp_size (token-interleaved over the group)
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
        per_tok = ATTN_PROJ_FLOPS / (attn_tp * B300_BF16 * u_lin) + (LINEAR_FLOPS - ATTN_PROJ_FLOPS) / (
            gpus * B300_BF16 * u_lin
        )
        r_lin = 1 / per_tok
        attn_gpus = cp if cp > 1 else attn_tp
    k_attn = ATTN_FLOPS / (attn_gpus * attn_peak * u_attn)
    k_kvb = kvb_proj = KVB_FLOPS / (attn_gpus * attn_peak * u_attn)  # the re-expansion runs where attention does
    a = STEP_OVERHEAD + w_dense / ebw
    k_kv = kv_bytes / ebw  # per rank, times that rank's own Σctx
    b = LINEAR_FLOPS / (gpus * B300_BF16 * u_lin)  # per-request linear compute in a decode step
    a_tp, b_tp, k_kv_tp = a, b, k_kv  # before decode context parallelism
    dcp_cost = DcpCost.of(dcp) if dcp > 1 else None
    if dcp_cost is not None:  # each GPU reads 1/dcp of every context, for its collectives and gathers
        a, b, k_kv, k_kvb = a + dcp_cost.a, b + dcp_cost.b, k_kv / dcp, k_kvb + dcp_cost.k_kvb
    t0 = a + t_exp  # a prefill pass touches every expert
    host_rate = HOST_LOAD_BW / kv_bytes if host_tokens else 0.0
    dtype = "bf16" if kv_dtype_bytes == 2 else "fp8"
    dp_ = dp > 1
    chunk = 16384 // dp  # SGLang handle_data_parallelism: chunked_prefill_size // dp_size
    conservativeness = DP_CONSERVATIVENESS if dp_ else 1.0  # ... and schedule_conservativeness *= 0.3
    max_running = default_max_running(c, 262144) if fit is None else fit.max_running_total // dp
    attn_where = f"{cp} GPUs (context-parallel group)" if cp > 1 else str(attn_tp)
    peak_txt = f"{attn_peak / 1e15:.2f} PF {'FP8' if attn_fp8 else 'bf16'}"
    lines = [
        f"{name}: Kimi K2-class INT4 weights on {'one 8×B300 node' if gpus == 8 else f'{gpus} B300 GPUs'},"
        f" {f'DP{dp} attention' if dp_ else f'TP{gpus}'}, {dtype} KV"
        + (f", FP8 context-parallel (CP{cp}) prefill attention" if cp > 1 else "")
        + (f", decode context parallelism (--dcp-size {dcp})." if dcp > 1 else "."),
        f"KV bytes per token per GPU = 35,136 × {kv_dtype_bytes} = {kv_bytes:,} B "
        + (
            "(each rank holds only its own requests)."
            if dp_
            else f"(interleaved token by token over the {dcp} DCP ranks: each GPU holds 1/{dcp} of every request)."
            if dcp > 1
            else f"(replicated on all {gpus} TP ranks)."
        ),
        f"Capacity: 0.90 × 288 GB = {mem / 1e9:.0f} GB per GPU − weights {w_gpu / 1e9:.1f} GB"
        f"{' (incl. replicated attention)' if dp_ else ''} = {kv_gpu / 1e9:.1f} GB",
        f"  → C = {c:,} tokens per {'rank' if dp_ else 'server'} (page {page}: trtllm_mla on SM100 needs 32/64)"
        + (f" = {rows:,} rows per GPU × {dcp} (SGLang's logical_token_capacity under DCP)." if dcp > 1 else "."),
        "Prefill: r_lin = "
        + (
            f"1 / (6.2B-param attention projections on the rank's {attn_tp} GPU(s) + the rest EP over 8)"
            if dp_
            else f"{gpus} × 2.25 PF × U_LIN / 6.4e10"
        )
        + f" = {r_lin:,.0f} tok/s at U_LIN = {u_lin};",
        f"  k_attn = 2.5e6 / ({attn_where} × {peak_txt} × U_ATTN) = {k_attn:.3g} s per token·ctx"
        f" at U_ATTN = {u_attn}" + (" (all 64 heads on the rank's GPU);" if dp_ and cp == 1 else ";"),
        f"  k_kvb = 1.0e9 / (same rate) = {kvb_proj:.3g} s per cached-prefix token per chunk (kv_b_proj"
        f" re-expansion on trtllm_mla: +{KVB_FLOPS / (ATTN_FLOPS * chunk):.1%} of attention at {chunk}-token chunks);",
        f"  t0 = a + t_experts = {t0 * 1e3:.1f} ms (a prefill pass streams every expert once); prefill_efficiency 1.0.",
        f"Decode: a = {STEP_OVERHEAD * 1e3:.0f} ms overhead + {w_dense / 1e9:.1f} GB non-expert weights"
        f" / ({B300_BW / 1e12:.0f} TB/s × U_BW {U_BW}) = {a_tp * 1e3:.2f} ms;",
        f"  {coverage_note(t_exp)}; b = {b_tp * 1e6:.1f} µs per request (its 6.4e10 linear FLOPs);",
        f"  k_kv = {kv_bytes:,} B / ({B300_BW / 1e12:.0f} TB/s × {U_BW}) = {k_kv_tp * 1e9:.2f} ns per context token"
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
    if dcp_cost is not None:
        lines += dcp_cost.doc(a, b, k_kv, k_kvb)
    if gpus < 8:
        lines += [
            f"One of {8 // gpus} replicas on the node: SGLang's plain data parallelism (--tp {gpus} --dp {8 // gpus},"
            " no DP attention) runs",
            "  independent schedulers, each with the whole model and its own radix cache, and the",
            "  DataParallelController's default load_balance_method round_robin sends each request to the next",
            f"  one: simulate with --backends {8 // gpus} --policy direct. A turn lands on the replica that served the",
            "  conversation's previous turn about half the time; otherwise it recomputes every turn since its last",
            "  visit there (the miss source of the collapsing deployment), and each replica holds every conversation,",
            f"  so the pair's effective capacity is one replica's {c:,} tokens.",
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
        fitted = (
            "U_ATTN",
            "U_LIN",
            "max_running_requests",
            "tokenize_tokens_per_s",
            "request_overhead_s",
            "spec_accept_length",
        )
        overhead, tok_rate = fit.request_overhead_s, fit.tokenize_tokens_per_s
        lines += [
            f"FITTED (python -m loadtest.analysis.fit_good): U_ATTN {fit.u_attn} of the FP8 peak, U_LIN {fit.u_lin},"
            f" --max-running-requests {fit.max_running_total},",
            f"  per-request overhead {overhead * 1e3:.0f} ms + prompt / {tok_rate:,.0f} tokens/s (tokenisation, HTTP);"
            " every other constant is derived as above;",
            f"  MTP speculative decoding with {fit.spec_draft_tokens} draft token(s),"
            f" accept length {fit.spec_accept_length}.",
        ]
    elif front_end is not None:
        # The same SGLang front end (TokenizerManager, HTTP) on the same prompts: the good deployment's
        # fitted tokenisation constants, not re-fitted here.
        fitted = ("tokenize_tokens_per_s", "request_overhead_s")
        overhead, tok_rate = front_end.request_overhead_s, front_end.tokenize_tokens_per_s
        lines += [
            f"Front end: per-request overhead {overhead * 1e3:.0f} ms + prompt / {tok_rate:,.0f} tokens/s"
            " (tokenisation, HTTP), the constants FITTED on b300-dp8-fp8-cp (same SGLang front end),",
            "  not re-fitted; every other constant is derived as above.",
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
        kv_cache_dtype="fp8_e4m3" if kv_dtype_bytes == 1 else "auto",
        weight_bytes_per_gpu=w_gpu,
        attn_fp8=attn_fp8,
        prefill_cp_size=cp,
        dcp_size=dcp,
        k_kvb=k_kvb,
        request_overhead_s=overhead,
        tokenize_tokens_per_s=tok_rate,
        fitted=fitted,
        spec_draft_tokens=fit.spec_draft_tokens if fit else 0,
        spec_accept_length=fit.spec_accept_length if fit else 1.0,
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
        _b300("b300-tp8-fp8-dcp8", kv_dtype_bytes=1, dcp=8),
        _b300("b300-dp2-bf16", kv_dtype_bytes=2, dp=2),
        _b300("b300-tp4-fp8", kv_dtype_bytes=1, gpus=4, front_end=GOOD_FIT),
        _b300("b300-dp8-fp8-cp", kv_dtype_bytes=1, dp=8, attn_fp8=True, cp=8, fit=GOOD_FIT),
        gb10("gb10x16-tp4pp4-fp8", tp=4, pp=4),
        gb10("gb10x16-tp16-fp8", tp=16, pp=1),
        vllm_variant(gb10("gb10x16-tp4pp4-fp8", tp=4, pp=4)),
        vllm_variant(gb10("gb10x16-tp16-fp8", tp=16, pp=1)),
        _tiny(),
    ]
    return {p.name: p for p in profiles}


PROFILES: dict[str, Profile] = _build()


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of: {', '.join(PROFILES)}") from None


# ---- the live demo's twin profile, kept in its own module (backends/sim/demo_profile.py) ----
from backends.sim.demo_profile import DEMO_FIELDS  # noqa: E402

PROFILES[DEMO_FIELDS["name"]] = Profile(**DEMO_FIELDS)
