"""Studies run in the simulator: the comparison with the bare engine and SGLang's router (``compare``),
the routing family (``routing_family``), mixed fleets, the bounds no policy can beat (``kv_bound``,
``ttft_floor``, ``order_ceiling``, ``wait_frontier``), the collapse's anatomy (``collapse_probe``),
single-request speed (``single``) and the fitted profile's fit (``fit_good``). Imports ``sim``,
``workloads`` and ``results``."""
