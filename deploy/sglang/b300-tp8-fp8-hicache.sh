#!/usr/bin/env bash
# Kimi on one 8×B300 node, TP8 with fp8 KV plus a host-memory cache tier (HiCache): prefixes evicted
# from HBM are kept in host DRAM and reloaded over PCIe (≈50 GB/s) instead of being recomputed.
# KV capacity: GPU ≈ 5.27M tokens (reference §9.2, fp8) plus the host tier below; at the default
# 280 GB per rank that tier holds ≈ 8.0M tokens (280e9 B / 35,136 B per token).
# Simulator profile: b300-tp8-fp8-hicache. Gateway config: one backend, dp_size 1.
set -euo pipefail

MODEL_PATH="${MODEL_PATH:-moonshotai/Kimi-K2.5}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL_PATH}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-30000}"
OTLP_TRACES_ENDPOINT="${OTLP_TRACES_ENDPOINT:-otel-collector:4317}"
CONTEXT_LENGTH="${CONTEXT_LENGTH:-262144}"
# Host pool per TP rank, in GB. Under TP every rank keeps its own copy of the (replicated) MLA latent,
# so the node needs 8 × this much free DRAM (2.24 TB at 280): lower it to fit the machine.
# tokens held = HICACHE_SIZE_GB × 1e9 / 35,136.
HICACHE_SIZE_GB="${HICACHE_SIZE_GB:-280}"

args=(
  --model-path "$MODEL_PATH"           # weights: a Hugging Face id or a local path
  --served-model-name "$SERVED_MODEL_NAME" # the model name in responses and /v1/models
  --trust-remote-code                  # Kimi ships its tokenizer and config code with the weights
  --host "$HOST" --port "$PORT"        # listen address and port of the HTTP API (and /metrics)
  --tp-size 8                          # tensor parallel width
  --kv-cache-dtype fp8_e4m3            # ≈5.27M tokens in HBM
  --mem-fraction-static 0.90           # weights + KV pool share of GPU memory that the capacity above assumes
  --context-length "$CONTEXT_LENGTH"   # longest prompt + answer accepted
  --chunked-prefill-size 16384         # bound one prefill step so decode keeps flowing during long prompts
  --max-running-requests 256           # cap on the decode batch
  --enable-hierarchical-cache          # GPU radix cache backed by a host-memory tier
  --hicache-size "$HICACHE_SIZE_GB"    # host tier size per rank (overrides --hicache-ratio)
  --hicache-write-policy write_through # copy to host as pages fill, so eviction from HBM costs nothing
  --hicache-io-backend kernel          # GPU copy kernels for host<->device transfers
  --hicache-mem-layout page_first      # host layout the kernel IO backend reads fastest
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-metrics                     # adds the HiCache series (evicted/load-back tokens)
  --enable-cache-report                # cached_tokens counts host-tier hits too
  --enable-trace                       # join the gateway's trace (traceparent) with engine spans
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT" # where those spans go (the OTel collector, OTLP gRPC)
)

exec python3 -m sglang.launch_server "${args[@]}" "$@"
