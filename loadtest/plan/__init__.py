"""``cachegate plan``: how many servers and which team limits for N developers at a target TTFT
(``recommend``), the teams' sections (``teams``) and what it prints and writes (``report``). Imports
``sim``, ``workloads`` and ``results``."""
