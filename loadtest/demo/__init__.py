"""``cachegate demo``: simulated SGLang servers, the gateway and a sweep across the caches' edge
(``run``), its verdict and report (``report``), the full-scale virtual-time runs beside it
(``fullscale``), and the mixed fleet live (``mixed_live``). Imports ``live``, ``docs``, ``sim`` and
``results``."""
