"""Pure translation between client surfaces and the chat completions API every SGLang serves.

- ``common``: SSE encoding and decoding, ids, reading an upstream error body in any of its shapes.
- ``responses`` / ``responses_stream``: OpenAI Responses API ⇄ chat completions.
- ``messages`` / ``messages_stream``: Anthropic Messages API ⇄ chat completions.

Nothing here does I/O, reads a clock or touches asyncio: bodies in, bodies (or SSE bytes) out, time
passed in. Bad input raises ``gateway.http.errors.GatewayError`` (status 400); each surface renders it
in its own envelope.
"""
