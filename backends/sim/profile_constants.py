"""The figures every profile is derived from: the model (Kimi K2 / K2.5) and the hardware (B300, GB10).

The utilisations and overheads and where each comes from: the ``profiles.py`` docstring.
"""

from __future__ import annotations

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
NVLINK_BW = 900e9  # bytes/s per GPU per direction: NVLink 5, 1.8 TB/s bidirectional
# Decode context parallelism (``--dcp-size``): one small collective's latency on NVLink inside a CUDA
# graph (the query all-gather and the partial-output reduction, each once per layer per decode step).
DCP_COLLECTIVE_S = 10e-6

# GB10 (re-derived against the 16×GB10 post: 750 tok/s prefill, 20 tok/s average decode,
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
