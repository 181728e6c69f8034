"""Reliability runs against real processes (``runs``): the stack they drive (``stack``: a private Redis,
twins behind fault proxies, gateway replicas), the faults injected (``faults``) and the fault-injecting
proxy (``proxy``). Imports the gateway's Redis scripts and the twins."""
