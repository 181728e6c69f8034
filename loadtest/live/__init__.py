"""The live load client: a workload against any OpenAI-compatible URL in wall-clock time (``client``).
Imports ``workloads`` and ``results``."""
