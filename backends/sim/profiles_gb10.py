"""The GB10 deployments (16 × DGX Spark class nodes), derived like the B300 ones (``profiles.py``)."""

from __future__ import annotations

from backends.sim.profile_constants import (
    ATTN_FLOPS,
    GB10_BF16_EFFECTIVE,
    GB10_BW,
    GB10_MEM,
    LATENT_ELEMS,
    LAYERS,
    LINEAR_FLOPS,
    U_ATTN_GB10,
    U_BW,
    U_LIN_GB10,
    W_EXPERTS,
    W_TOTAL,
    _gb10_stage_overhead,
)
from backends.sim.profile_model import Profile, coverage_note, default_max_running


def gb10(name: str, *, tp: int, pp: int) -> Profile:
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
        f"  {coverage_note(t_exp)};",
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
        max_running_requests=default_max_running(c, 262144),
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
        kv_cache_dtype="fp8_e4m3",
        weight_bytes_per_gpu=w_node,
        doc=doc,
    )


def vllm_variant(p: Profile) -> Profile:
    """``p`` served by vLLM (the GB10 write-up's engine): 16-token KV blocks hashed for prefix caching,
    least recently freed blocks evicted first. The rest (scheduler, speeds) stays SGLang's model."""
    name = f"{p.name}-vllm"
    note = (
        f"{name}: {p.name} served by vLLM 0.33.0 (deploy/vllm/): the pool in 16-token blocks"
        f" (C = {p.kv_tokens // 16 * 16:,} tokens), prefix caching by block hash, eviction of the least"
        " recently freed blocks (a request's tail first); the scheduler and speeds are SGLang's model."
    )
    return p.with_(name=name, page_size=16, kv_tokens=p.kv_tokens // 16 * 16, eviction="lrf", doc=f"{note}\n{p.doc}")
