#!/usr/bin/env bash
# Kimi on a 16×GB10 cluster with vLLM 0.33.0 (the engine the GB10 write-up ran): TP4 inside groups of
# four nodes, PP4 across the groups, fp8 KV; vLLM's multiprocessing backend over nodes. Run on every
# node with its NODE_RANK; node 0 serves the HTTP API, the others run headless workers. Simulator
# profile: gb10x16-tp4pp4-fp8 (its engine model is SGLang's scheduler: docs/engines.md).
set -euo pipefail

NODE_RANK="${NODE_RANK:?set NODE_RANK to the rank of this node, 0..15}"
MASTER_ADDR="${MASTER_ADDR:?set MASTER_ADDR to the address of node 0, e.g. spark-0}"
MASTER_PORT="${MASTER_PORT:-29501}"
NNODES="${NNODES:-16}"
MODEL_PATH="${MODEL_PATH:-moonshotai/Kimi-K2.5}"
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
  --distributed-executor-backend mp    # vLLM's own multi-node workers (no Ray)
  --nnodes "$NNODES"                   # number of machines in this engine
  --node-rank "$NODE_RANK"             # this node's place; rank 0 runs the HTTP server
  --master-addr "$MASTER_ADDR"         # rendezvous of torch.distributed on node 0
  --master-port "$MASTER_PORT"         # and its port
  --tensor-parallel-size 4             # TP inside a group of four nodes
  --pipeline-parallel-size 4           # four such groups, one stage of the layers each
  --kv-cache-dtype fp8                 # fp8 KV: twice the tokens of bf16
  --gpu-memory-utilization 0.82        # weights + KV share of the GB10's unified memory
  --max-model-len "$MAX_MODEL_LEN"     # longest prompt + answer accepted (Kimi's 262,144)
  --enable-prefix-caching              # reuse a conversation's prefix blocks (16 tokens each)
  --max-num-batched-tokens 8192        # bound one step's prefill so decode keeps flowing during long prompts
  --max-num-seqs 16                    # cap on the running batch
  --enable-auto-tool-choice            # let the model call tools when the request offers them
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls (ids functions.NAME:N)
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-prompt-tokens-details       # usage.prompt_tokens_details.cached_tokens in every response
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT" # engine spans joined to the gateway's trace (traceparent)
)
if [[ "$NODE_RANK" != "0" ]]; then
  args+=(--headless)                   # workers only: the API server runs on node 0
fi

exec vllm "${args[@]}" "$@"
