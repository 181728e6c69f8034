"""Decode context parallelism (SGLang ``--dcp-size``): what it changes in a TP deployment's constants.

Read in SGLang 0.5.23: the TP ranks of a DCP group keep every request's MLA latent interleaved token
by token (``layers/dcp/layout.py``) instead of each holding a replica, so the server's pool is one GPU's
rows × ``attn_dcp_size`` (``kv_cache_configurator.logical_token_capacity``; ``/get_server_info``'s
``max_total_num_tokens`` is that logical figure) and a decode step reads 1/``dcp_size`` of every context
per GPU. The price, per ``forward_mla``:

- decode: per layer, an all-gather of the other ranks' query heads (``all_gather_q_for_mla_decode``:
  bf16 ``q_nope`` + ``q_pe``, 576 per head) and an LSE-weighted reduction of the partial outputs (512 per
  head): two small collectives per layer per step (``DCP_COLLECTIVE_S`` each, on the fixed overhead ``a``)
  and their bytes over NVLink per request (on ``b``);
- extend: each prefill chunk gathers its cached prefix's latent from the other ranks
  (``all_gather_kv_cache_for_mha_extend``), dequantised to bf16 for ``kv_b_proj`` (on ``k_kvb``).

Prefill attention is unchanged: each rank still computes its own heads over the whole gathered context.
Off by default (``--dcp-size 1``), as in SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.sim.profile_constants import DCP_COLLECTIVE_S, LATENT_ELEMS, LAYERS, NVLINK_BW, U_BW

HEADS = 64
Q_DIM, OUT_DIM = 512 + 64, 512  # per head: the gathered query (nope + rope), the reduced partial output


@dataclass(frozen=True)
class DcpCost:
    """What ``--dcp-size`` adds to a TP profile's step overhead, per-request and per-prefix-token terms."""

    dcp: int
    a: float
    """Seconds per decode step: two collectives per layer."""
    b: float
    """Seconds per request per decode step: its query heads and partial outputs over NVLink."""
    k_kvb: float
    """Seconds per cached-prefix token per prefill chunk: the prefix latent gathered in bf16."""

    @classmethod
    def of(cls, dcp: int) -> DcpCost:
        nvl = NVLINK_BW * U_BW
        share = (dcp - 1) / dcp  # what a rank receives from the others
        return cls(
            dcp=dcp,
            a=2 * LAYERS * DCP_COLLECTIVE_S,
            b=LAYERS * HEADS * share * (Q_DIM + OUT_DIM) * 2 / nvl,
            k_kvb=LATENT_ELEMS * 2 * share / nvl,
        )

    def doc(self, a: float, b: float, k_kv: float, k_kvb: float) -> list[str]:
        """The derivation lines of a profile with this cost; ``a``, ``b``, ``k_kv``, ``k_kvb`` are its totals."""
        d = self.dcp
        return [
            f"Decode context parallelism (SGLang --dcp-size {d}, forward_mla): k_kv / {d} = {k_kv * 1e9:.2f} ns"
            " (each GPU reads its shard of every context);",
            f"  a + 2 collectives × {LAYERS} layers × {DCP_COLLECTIVE_S * 1e6:.0f} µs = {a * 1e3:.2f} ms per step"
            " (query all-gather, partial-output reduction);",
            f"  b + {self.b * 1e6:.1f} µs = {b * 1e6:.1f} µs per request ({LAYERS} layers × {HEADS} heads × {d - 1}/{d}"
            f" × ({Q_DIM} + {OUT_DIM}) bf16 over NVLink {NVLINK_BW / 1e9:.0f} GB/s × U_BW);",
            f"  k_kvb + {self.k_kvb:.3g} = {k_kvb:.3g} s per cached-prefix token per chunk (the prefix latent"
            " all-gathered in bf16 for every extend chunk).",
        ]
