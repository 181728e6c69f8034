"""Benchmarks that print figures: the relay against SGLang's router (``relay``, with its load generator and
synthetic upstream), the gateway's overhead, CPU per request and per chunk, Redis, workers, the
simulator's speed, the translators, and the process helpers they share (``procs``). Imports ``sim``,
``workloads`` and the gateway's parts they measure."""
