#!/usr/bin/env bash
# Kimi on one 8×B300 node with data-parallel attention: 8 attention ranks (one scheduler, one KV pool
# and one radix cache each), MoE/FFN still tensor parallel over the 8 GPUs. fp8 KV cache.
# KV capacity (reference §9.2, INT4 weights, attention weights replicated ≈ 11 GB more per GPU):
#   ≈ 39.7M tokens aggregate with fp8 KV, ≈ 4.9-5M per rank (bf16: 19.8M, ≈ 2.5M per rank).
#   Each rank caches only the requests it ran, so prefix affinity per rank matters: SGLang's own
#   dispatcher is round-robin (no affinity); cachegate pins a rank with routed_dp_rank.
# Simulator profile: b300-dp8-fp8. Gateway config: this backend with dp_size: 8.
set -euo pipefail

MODEL_PATH="${MODEL_PATH:-moonshotai/Kimi-K2.5}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL_PATH}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-30000}"
OTLP_TRACES_ENDPOINT="${OTLP_TRACES_ENDPOINT:-otel-collector:4317}"
CONTEXT_LENGTH="${CONTEXT_LENGTH:-262144}"

args=(
  --model-path "$MODEL_PATH"           # weights: a Hugging Face id or a local path
  --served-model-name "$SERVED_MODEL_NAME" # the model name in responses and /v1/models
  --trust-remote-code                  # Kimi ships its tokenizer and config code with the weights
  --host "$HOST" --port "$PORT"        # listen address and port of the HTTP API (and /metrics)
  --tp-size 8                          # tensor parallel width
  # 0.5.23 spelling of the older `--dp-size 8 --enable-dp-attention` (still accepted, deprecated):
  --attn-dp-size 8                     # 8 attention DP ranks inside the TP8 group
  --enable-dp-lm-head                  # vocab-parallel LM head inside each rank: no all-gather across ranks
  --kv-cache-dtype fp8_e4m3            # halves bytes per token: ≈5M tokens per rank instead of ≈2.5M
  --mem-fraction-static 0.88           # a little below TP8's 0.90: DP buffers need headroom
  --context-length "$CONTEXT_LENGTH"   # longest prompt + answer accepted
  --chunked-prefill-size 16384         # ranks step together: a big chunk on one rank stalls all decodes
  --max-running-requests 256           # cap on the decode batch
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-metrics                     # sglang: series, labelled dp_rank
  --enable-cache-report                # usage.prompt_tokens_details.cached_tokens in every response
  --enable-trace                       # join the gateway's trace (traceparent) with engine spans
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT" # where those spans go (the OTel collector, OTLP gRPC)
)

exec python3 -m sglang.launch_server "${args[@]}" "$@"
