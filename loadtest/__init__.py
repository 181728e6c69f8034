"""Workloads, the load client, the simulator, the planner, the demo and the benchmarks: everything that
drives or measures the gateway, none of it imported by the running service. This package's own
modules are the commands (``cli``, ``compare_cli``), on top of its subpackages; from the bottom:
``workloads``, ``results``, ``sim``, ``live``, ``analysis``, ``plan``, ``docs``, ``demo``, ``bench``,
``chaos`` (the arrows each may follow: ``docs/architecture.md``, held by ``tests/gateway/test_layers.py``)."""
