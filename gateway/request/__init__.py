"""One request's path: authentication (``auth``), the overload guard (``overload``), the waiting room
(``dispatch``), the lifecycle from parse to release (``lifecycle``), upstream attempts and failover
(``upstream``), the prefill hop of a disaggregated pair (``pd_hop``) and a held stream's early response
(``held``). Imports every gateway package below it."""
