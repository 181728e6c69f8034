#!/usr/bin/env bash
# Kimi disaggregated, the DECODE side: one 8×B300 node (TP8, fp8 KV) that receives a prompt's KV from
# the prefill node named in the request (bootstrap_host/port/room, written by cachegate) and generates.
# Its KV pool (≈ 5.27M tokens) holds every running turn's whole context: cachegate admits on it.
# Gateway config: {url: http://THIS:30000, role: decode} (docs/disaggregation.md).
set -euo pipefail

MODEL_PATH="${MODEL_PATH:-moonshotai/Kimi-K2.5}"            # K2.5 / K2-Thinking: native INT4 experts
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL_PATH}"       # what the gateway's upstream_model must say
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-30000}"
OTLP_TRACES_ENDPOINT="${OTLP_TRACES_ENDPOINT:-otel-collector:4317}"   # host:port, OTLP gRPC
CONTEXT_LENGTH="${CONTEXT_LENGTH:-262144}"                 # K2-0905 / K2-Thinking / K2.5 context
TRANSFER_BACKEND="${TRANSFER_BACKEND:-mooncake}"           # mooncake or nixl: the same on both sides


args=(
  --model-path "$MODEL_PATH"           # weights: a Hugging Face id or a local path
  --served-model-name "$SERVED_MODEL_NAME" # the model name in responses and /v1/models
  --trust-remote-code                  # Kimi ships its tokenizer and config code with the weights
  --host "$HOST" --port "$PORT"        # listen address and port of the HTTP API (and /metrics)
  --tp-size 8                          # one scheduler, weights sharded over 8 GPUs
  --kv-cache-dtype fp8_e4m3            # the same KV dtype on both sides (the transfer copies pages as they are)
  --mem-fraction-static 0.90           # weights + KV pool share of HBM that §9.2's capacity assumes
  --context-length "$CONTEXT_LENGTH"   # longest prompt + answer accepted
  --disaggregation-mode decode        # decode-only server: waits for the room's KV, then generates
  --max-running-requests 256           # cap on the decode batch
  --disaggregation-transfer-backend "$TRANSFER_BACKEND" # the KV transfer engine (RDMA)
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-metrics                     # /metrics with the sglang: series the gateway and Grafana read
  --enable-cache-report                # usage.prompt_tokens_details.cached_tokens (decode reports the prefill's)
  --enable-trace                       # join the gateway's trace (traceparent) with engine spans
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT"   # where those spans go (the OTel collector)
)
if [[ -n "${IB_DEVICE:-}" ]]; then
  args+=(--disaggregation-ib-device "$IB_DEVICE")   # the RDMA NICs the transfer uses (e.g. mlx5_0,mlx5_1)
fi

exec python3 -m sglang.launch_server "${args[@]}" "$@"
