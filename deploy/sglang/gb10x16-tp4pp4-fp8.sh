#!/usr/bin/env bash
# Kimi on a 16×GB10 (DGX Spark) cluster: tensor parallel 4 inside each group of 4 nodes, pipeline
# parallel over 4 such groups (16 nodes, one GPU each). Run this same script on every node with its
# own NODE_RANK (0..15); node 0 serves HTTP, the others only compute.
# KV capacity (reference §9.2, INT4 weights, mem fraction 0.8-0.85): each node holds the latents of
# 15-16 of the 61 layers only, so ≈ 7.4-8.1M tokens with fp8 KV (3.7-4.1M bf16): about 4× TP16
# (gb10x16-tp16-fp8.sh, ≈ 1.9M), hence the preferred layout. Simulator profile: gb10x16-tp4pp4-fp8.
# GB10 is SM121: the sm100 MLA kernels do not apply; set ATTENTION_BACKEND to one that works on your build.
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
  --nnodes "$NNODES"                   # 16 processes, one per Spark
  --node-rank "$NODE_RANK"             # this node's place; rank 0 runs the HTTP server
  --dist-init-addr "$DIST_INIT_ADDR"   # rendezvous of torch.distributed on node 0
  --tp-size 4                          # TP inside a 4-node group (over the 200 Gb/s RoCE links)
  --pp-size 4                          # 4 pipeline stages: each stage stores KV of its layers only
  --kv-cache-dtype fp8_e4m3            # ≈7.4M tokens instead of ≈3.7M
  --mem-fraction-static 0.82           # of ≈119 GiB unified memory; leave room for the OS and NCCL
  --context-length "$CONTEXT_LENGTH"   # longest prompt + answer accepted
  --chunked-prefill-size 8192          # smaller chunks: GB10 prefill is ≈10× slower than B300
  --max-running-requests 32            # cap on the decode batch
  --disable-cuda-graph                 # multi-node CUDA-graph capture deadlocks on GB10 (reference §7.3)
  --tool-call-parser kimi_k2           # Kimi's tool-call tokens -> OpenAI tool_calls
  --reasoning-parser kimi_k2           # thinking text -> reasoning_content
  --enable-metrics                     # /metrics with the sglang: series the gateway and Grafana read
  --enable-cache-report                # usage.prompt_tokens_details.cached_tokens in every response
  --enable-trace                       # join the gateway's trace (traceparent) with engine spans
  --otlp-traces-endpoint "$OTLP_TRACES_ENDPOINT" # where those spans go (the OTel collector, OTLP gRPC)
)
if [[ -n "${ATTENTION_BACKEND:-}" ]]; then
  args+=(--attention-backend "$ATTENTION_BACKEND")   # e.g. triton or flashinfer, whichever supports SM121
fi

exec python3 -m sglang.launch_server "${args[@]}" "$@"
