#!/usr/bin/env bash
# Kimi on one 8×B300 node with vLLM 0.33.0: attention data-parallel over 8 engines with expert
# parallelism (vLLM's counterpart of SGLang's DP attention, deploy/sglang/b300-dp8-fp8.sh). One API
# server balances over the 8 engines (internal load balancing): give the cachegate backend `dp_size: 8`
# and it pins each conversation to one engine with the header X-data-parallel-rank.
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
  --data-parallel-size 8               # 8 engines, each with its own KV cache and prefix cache
  --enable-expert-parallel             # MoE experts sharded over the 8 GPUs instead of replicated
  --kv-cache-dtype fp8                 # fp8 KV: twice the tokens of bf16
  --gpu-memory-utilization 0.90        # weights + KV share of GPU memory
  --max-model-len "$MAX_MODEL_LEN"     # longest prompt + answer accepted (Kimi's 262,144)
  --enable-prefix-caching              # reuse a conversation's prefix blocks (16 tokens each)
  --max-num-seqs 32                    # cap on each engine's running batch
  --enable-auto-tool-choice            # let the model call tools when the request offers them
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls (ids functions.NAME:N)
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-prompt-tokens-details       # usage.prompt_tokens_details.cached_tokens in every response
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT" # engine spans joined to the gateway's trace (traceparent)
)

exec vllm "${args[@]}" "$@"
