"""What replicas must agree on: team leases, live replicas and runtime limits in memory or in Redis
(``replicas``, ``redis_state`` and its Lua scripts and fields), and the engines' cache learnt from SGLang's
KV events (``kv_learn``). Imports ``backends`` and ``policies``; nothing else of the gateway."""
