#!/usr/bin/env bash
# Kimi on a 16×GB10 cluster, plain TP16 over all nodes (the layout of Moonshot's multi-node TP
# recipe), kept for comparison with gb10x16-tp4pp4-fp8.sh. Run on every node with its NODE_RANK.
# KV capacity (reference §9.2): every rank replicates the MLA latent of all 61 layers, so only
# ≈ 1.85-2.0M tokens with fp8 KV (0.93-1.0M bf16), a quarter of TP4×PP4. Simulator profile:
# gb10x16-tp16-fp8.
set -euo pipefail

NODE_RANK="${NODE_RANK:?set NODE_RANK to the rank of this node, 0..15}"
DIST_INIT_ADDR="${DIST_INIT_ADDR:?set DIST_INIT_ADDR to host:port of node 0, e.g. spark-0:50000}"
NNODES="${NNODES:-16}"
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
  --nnodes "$NNODES"                   # number of machines in this engine
  --node-rank "$NODE_RANK"             # this node's place; rank 0 runs the HTTP server
  --dist-init-addr "$DIST_INIT_ADDR"   # rendezvous of torch.distributed on node 0
  --tp-size 16                         # one TP group over 16 nodes: every step all-reduces over RoCE
  --kv-cache-dtype fp8_e4m3            # fp8 KV: 34.3 KiB/token instead of 68.6, twice the tokens
  --mem-fraction-static 0.82           # weights + KV pool share of GPU memory that the capacity above assumes
  --context-length "$CONTEXT_LENGTH"   # longest prompt + answer accepted
  --chunked-prefill-size 8192          # bound one prefill step so decode keeps flowing during long prompts
  --max-running-requests 16            # cap on the decode batch
  --disable-cuda-graph                 # multi-node CUDA-graph capture deadlocks on GB10 (reference §7.3)
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-metrics                     # /metrics with the sglang: series the gateway and Grafana read
  --enable-cache-report                # usage.prompt_tokens_details.cached_tokens in every response
  --enable-trace                       # join the gateway's trace (traceparent) with engine spans
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT" # where those spans go (the OTel collector, OTLP gRPC)
)
if [[ -n "${ATTENTION_BACKEND:-}" ]]; then
  args+=(--attention-backend "$ATTENTION_BACKEND")
fi

exec python3 -m sglang.launch_server "${args[@]}" "$@"
