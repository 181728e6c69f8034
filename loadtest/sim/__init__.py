"""The discrete-event simulator: workload × decision core × engine model, in virtual time (``simulate``),
with the live path's plumbing around the decision core (``driver``, ``live``) and the precise cache view
fed by the engine model's own KV events (``kv_view``). Imports ``workloads``, ``results``, the gateway's
config and the simulated SGLang (``backends.sim``)."""
