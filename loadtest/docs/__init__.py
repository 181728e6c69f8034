"""Generators of the docs' tables: the simulated ones of ``docs/calibration.md`` and
``docs/benchmarks.md`` (``sim_tables``) and the gateway's admission and routing tables
(``gateway_tables``). Imports ``analysis``, ``sim`` and ``workloads``."""
