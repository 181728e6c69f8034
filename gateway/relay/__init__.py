"""Reading an upstream answer and relaying it: what the hop learns from an answer (``proxy``) and the SSE
relay loop every surface's stream runs on (``events``). Imports ``http``."""
