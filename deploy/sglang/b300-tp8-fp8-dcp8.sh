#!/usr/bin/env bash
# Kimi on one 8×B300 node: TP8 with fp8 KV and decode context parallelism over the 8 TP ranks.
# Under plain TP the MLA latent is replicated on every rank; `--dcp-size 8` interleaves each request's
# latent token by token over the ranks instead, so the node holds 8 × what one GPU holds:
#   ≈ 42.1M tokens with fp8 KV (8 × 5.26M rows; SGLang's logical_token_capacity), and a decode step reads
#   an eighth of every context per GPU. The cost: two collectives per layer per decode step and a gather
#   of the cached prefix for each prefill chunk (backends/sim/profile_dcp.py).
# Simulator profile: b300-tp8-fp8-dcp8. Gateway config: one backend, dp_size 1.
set -euo pipefail

MODEL_PATH="${MODEL_PATH:-moonshotai/Kimi-K2.5}"            # K2.5 / K2-Thinking: native INT4 experts
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL_PATH}"       # what the gateway's upstream_model must say
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-30000}"
OTLP_TRACES_ENDPOINT="${OTLP_TRACES_ENDPOINT:-otel-collector:4317}"   # host:port, OTLP gRPC
CONTEXT_LENGTH="${CONTEXT_LENGTH:-262144}"                 # K2-0905 / K2-Thinking / K2.5 context

args=(
  --model-path "$MODEL_PATH"           # weights: a Hugging Face id or a local path
  --served-model-name "$SERVED_MODEL_NAME" # the model name in responses and /v1/models
  --trust-remote-code                  # Kimi ships its tokenizer and config code with the weights
  --host "$HOST" --port "$PORT"        # listen address and port of the HTTP API (and /metrics)
  --tp-size 8                          # one scheduler, weights sharded over 8 GPUs (`--tp 8`)
  --dcp-size 8                         # decode context parallelism: the latent sharded over the 8 TP ranks
  --kv-cache-dtype fp8_e4m3            # 34.3 KiB/token instead of 68.6: with DCP8 ≈ 42M tokens on the node
  --mem-fraction-static 0.90           # weights + KV pool share of HBM that §9.2's capacity assumes
  --context-length "$CONTEXT_LENGTH"   # longest prompt + answer accepted
  --chunked-prefill-size 16384         # bound one prefill step so decode keeps flowing during 160k prompts
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-metrics                     # /metrics with the sglang: series the gateway and Grafana read
  --enable-cache-report                # usage.prompt_tokens_details.cached_tokens in every response
  --enable-trace                       # join the gateway's trace (traceparent) with engine spans
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT"   # where those spans go (the OTel collector)
)

exec python3 -m sglang.launch_server "${args[@]}" "$@"
