"""The figures of a run, from per-request records (``metrics``: the definitions every table follows),
and how they are printed and written (``tables``: the terminal table and the report folder). Imports
nothing else of ``loadtest``."""
