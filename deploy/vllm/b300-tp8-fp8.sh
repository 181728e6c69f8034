#!/usr/bin/env bash
# Kimi on one 8×B300 node with vLLM 0.33.0: TP8, fp8 KV, prefix caching (the vLLM counterpart of
# deploy/sglang/b300-tp8-fp8.sh). cachegate reads its capacity from vllm:cache_config_info on /metrics
# (docs/engines.md); set `engine: vllm` (or leave `auto`) on the backend.
set -euo pipefail

MODEL_PATH="${MODEL_PATH:-moonshotai/Kimi-K2-Instruct}"
SERVED_MODEL_NAME="${SERVED_MODEL_NAME:-$MODEL_PATH}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8000}"
OTLP_TRACES_ENDPOINT="${OTLP_TRACES_ENDPOINT:-http://otel-collector:4317}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-262144}"

args=(
  serve "$MODEL_PATH"                  # weights: a Hugging Face id or a local path
  --served-model-name "$SERVED_MODEL_NAME" # the model name in responses and /v1/models
  --trust-remote-code                  # Kimi ships its tokenizer and config code with the weights
  --host "$HOST" --port "$PORT"        # listen address and port of the HTTP API (and /metrics)
  --tensor-parallel-size 8             # one TP group over the node's 8 GPUs
  --kv-cache-dtype fp8                 # fp8 KV: twice the tokens of bf16
  --gpu-memory-utilization 0.90        # weights + KV share of GPU memory
  --max-model-len "$MAX_MODEL_LEN"     # longest prompt + answer accepted (Kimi's 262,144)
  --enable-prefix-caching              # reuse a conversation's prefix blocks (16 tokens each)
  --max-num-seqs 64                    # cap on the running batch (vLLM does not publish it: cachegate sizes by KV)
  --enable-auto-tool-choice            # let the model call tools when the request offers them
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls (ids functions.NAME:N)
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-prompt-tokens-details       # usage.prompt_tokens_details.cached_tokens in every response
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT" # engine spans joined to the gateway's trace (traceparent)
)

exec vllm "${args[@]}" "$@"
