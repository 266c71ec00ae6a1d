"""NCCL collectives over a scale-up (NVLink) domain and the scale-out fabric.

Times are in the bus-bandwidth form NCCL's own tests report: a collective of
``n`` ranks on an ``M``-byte buffer moves ``factor(n) * M`` bytes through each
rank's links, at the *bus bandwidth* ``busbw`` the library achieves, plus a
latency per algorithm step. A group that does not fit in one scale-up domain
runs in two levels: inside each domain over NVLink, then across domains, each
rank on its own NIC (rail-optimized fat tree).

References
----------
[1] NVIDIA nccl-tests, ``doc/PERFORMANCE.md``: bus bandwidth; all-reduce moves
    2 (n-1)/n M per rank, reduce-scatter and all-gather (n-1)/n M, where M is
    the full (gathered) buffer.
[2] Patarasuk, P. and Yuan, X. (2009), "Bandwidth optimal all-reduce algorithms
    for clusters of workstations", JPDC 69(2) (ring steps: 2 (n-1)).
[3] Thakur, R., Rabenseifner, R. and Gropp, W. (2005), "Optimization of
    collective communication operations in MPICH", IJHPCA 19(1)
    (hierarchical reduce-scatter / all-reduce / all-gather; pairwise all-to-all).
[4] docs.alayanew.com, "NCCL-tests in practice" (2026): all-reduce busbw at
    large sizes, 8x A100 SXM4 NVLink 230-250 GB/s, 8x H100 SXM5 460-480 GB/s.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "allreduce_time",
    "reduce_scatter_time",
    "all_gather_time",
    "p2p_time",
    "all_to_all_time",
    "two_level_time",
    "split_all_to_all_time",
    "FACTORS",
]

#: Bytes per rank per buffer byte [1] by collective (``n`` ranks).
FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}
#: Sequential latency steps of a ring collective of ``n`` ranks [2].
STEPS = {
    "all_reduce": lambda n: 2.0 * (n - 1),
    "reduce_scatter": lambda n: 1.0 * (n - 1),
    "all_gather": lambda n: 1.0 * (n - 1),
    "all_to_all": lambda n: 1.0 * (n - 1),
}


def _collective(kind, message_bytes, n_ranks, bus_bandwidth, latency):
    n = np.asarray(n_ranks, dtype=np.float64)
    # [1]: T = factor(n) * M / busbw, plus [2]: steps(n) * alpha. Exactly 0 at n = 1.
    return FACTORS[kind](n) * message_bytes / bus_bandwidth + STEPS[kind](n) * latency


def allreduce_time(message_bytes, n_ranks, *, bus_bandwidth, latency):
    """All-reduce of an ``M``-byte buffer over ``n`` ranks [s].

    Parameters
    ----------
    message_bytes : array_like [B]
    n_ranks : array_like [1]
    bus_bandwidth : array_like [B/s]
        Achieved NCCL bus bandwidth of the links used.
    latency : array_like [s]
        Per ring step.
    """
    return _collective("all_reduce", message_bytes, n_ranks, bus_bandwidth, latency)


def reduce_scatter_time(message_bytes, n_ranks, *, bus_bandwidth, latency):
    """Reduce-scatter of an ``M``-byte buffer (each rank keeps M/n) [s]."""
    return _collective("reduce_scatter", message_bytes, n_ranks, bus_bandwidth, latency)


def all_gather_time(message_bytes, n_ranks, *, bus_bandwidth, latency):
    """All-gather into an ``M``-byte buffer (each rank contributes M/n) [s]."""
    return _collective("all_gather", message_bytes, n_ranks, bus_bandwidth, latency)


def all_to_all_time(message_bytes, n_ranks, *, bus_bandwidth, latency):
    """All-to-all of ``M`` bytes per rank, (n-1)/n of which leave the rank [s] ([3])."""
    return _collective("all_to_all", message_bytes, n_ranks, bus_bandwidth, latency)


def p2p_time(message_bytes, *, bandwidth, latency):
    """One point-to-point send of ``M`` bytes [s] (``M / bandwidth + latency``)."""
    return np.asarray(message_bytes) / bandwidth + latency


def two_level_time(kind, message_bytes, n_ranks, ranks_per_domain, *, scale_up_bandwidth,
                   scale_up_latency, scale_out_bandwidth, scale_out_latency):
    """A collective over ``n`` ranks, ``g`` of which share each scale-up domain [s].

    Reduce-scatter inside the domain, the collective on ``M/g`` across the
    ``n/g`` domains (each rank on its own NIC), all-gather inside the domain
    [3]. With ``g == n`` it is the one-domain collective; with ``g == 1`` the
    scale-out one.

    Parameters
    ----------
    kind : {"all_reduce", "reduce_scatter", "all_gather"}
    message_bytes : array_like [B]
    n_ranks, ranks_per_domain : array_like [1]
    scale_up_bandwidth, scale_out_bandwidth : array_like [B/s]
        Achieved bus bandwidths inside a domain and per rank across domains.
    scale_up_latency, scale_out_latency : array_like [s]
    """
    n = np.asarray(n_ranks, dtype=np.float64)
    g = np.minimum(np.asarray(ranks_per_domain, dtype=np.float64), n)
    domains = n / g
    inner = _collective(kind, message_bytes, g, scale_up_bandwidth, scale_up_latency)
    outer = _collective(kind, np.asarray(message_bytes) / g, domains, scale_out_bandwidth,
                        scale_out_latency)
    return inner + outer


def split_all_to_all_time(message_bytes, n_ranks, ranks_near, *, scale_up_bandwidth,
                          scale_up_latency, scale_out_bandwidth, scale_out_latency):
    """An all-to-all over ``n`` ranks, ``g`` of which (the sender's included) share its domain [s].

    Each rank sends ``M / n`` to every peer [3], to the ``g - 1`` near ones over NVLink
    and to the ``n - g`` far ones over its NIC, at once: the slower of the two, plus
    ``n - 1`` steps of the far link's latency (the near one's where all are near). With
    ``g == n`` it is :func:`all_to_all_time` on the scale-up link, to the bit.

    Parameters
    ----------
    message_bytes : array_like [B]
        The rank's whole send buffer ``M``.
    n_ranks, ranks_near : array_like [1]
    scale_up_bandwidth, scale_out_bandwidth : array_like [B/s]
    scale_up_latency, scale_out_latency : array_like [s]
    """
    n = np.asarray(n_ranks, dtype=np.float64)
    g = np.minimum(np.asarray(ranks_near, dtype=np.float64), n)
    near = (g - 1) / n * message_bytes / scale_up_bandwidth
    far = (n - g) / n * message_bytes / scale_out_bandwidth
    return np.maximum(near, far) + (n - 1) * np.where(g < n, scale_out_latency, scale_up_latency)
