"""Collective communication times under the alpha-beta model.

Arrays in, arrays out: every argument broadcasts against the others, so a
term is computed on exactly the axes its inputs span.

References
----------
[1] Patarasuk, P. and Yuan, X. (2009), "Bandwidth optimal all-reduce
    algorithms for clusters of workstations", J. Parallel Distrib. Comput. 69(2).
[2] Thakur, R., Rabenseifner, R. and Gropp, W. (2005), "Optimization of
    collective communication operations in MPICH", IJHPCA 19(1).
[3] mlsysim 0.3.0, ``mlsysim/physics/communication.py`` (the reference this
    module reproduces term by term).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "ring_allreduce_time",
    "all_to_all_time",
    "hierarchical_allreduce_time",
    "HIERARCHICAL_INTRA_NODE_LATENCY",
]

#: Per-hop intra-node latency the reference's hierarchical all-reduce uses by
#: default [s]; ``DistributedModel`` never overrides it.
HIERARCHICAL_INTRA_NODE_LATENCY = 500e-9


def ring_allreduce_time(message_bytes, n_ranks, *, bandwidth, latency):
    """Ring all-reduce time.

    Parameters
    ----------
    message_bytes : array_like [B]
        Buffer reduced by every rank.
    n_ranks : array_like of int [1]
        Ranks in the ring; one rank costs nothing.
    bandwidth : array_like [B/s]
        One-way link bandwidth between neighbours.
    latency : array_like [s]
        Per-hop latency.

    Returns
    -------
    numpy.ndarray [s]
        Exactly 0 where ``n_ranks`` is 1 (both terms carry the factor n - 1).
    """
    n = np.asarray(n_ranks)
    # Eq. (2) of [1]: T = 2 (n-1)/n * M / beta + 2 (n-1) * alpha
    return 2 * (n - 1) / n * message_bytes / bandwidth + 2 * (n - 1) * latency


def all_to_all_time(message_bytes, n_ranks, *, bandwidth, latency):
    """Ring all-to-all (personalized exchange) time.

    Parameters
    ----------
    message_bytes : array_like [B]
        Buffer each rank holds; (n-1)/n of it leaves the rank.
    n_ranks : array_like of int [1]
    bandwidth : array_like [B/s]
    latency : array_like [s]

    Returns
    -------
    numpy.ndarray [s]
        Exactly 0 where ``n_ranks`` is 1.
    """
    n = np.asarray(n_ranks)
    # Sec. 3.5 of [2]: T = (n-1)/n * M / beta + (n-1) * alpha
    return (n - 1) / n * message_bytes / bandwidth + (n - 1) * latency


def hierarchical_allreduce_time(message_bytes, n_nodes, ranks_per_node, *,
                                intra_node_bandwidth, inter_node_bandwidth,
                                inter_node_latency,
                                intra_node_latency=HIERARCHICAL_INTRA_NODE_LATENCY):
    """Hierarchical all-reduce: reduce-scatter in the node, ring across nodes, all-gather.

    Parameters
    ----------
    message_bytes : array_like [B]
    n_nodes : array_like of int [1]
        Nodes the group spans.
    ranks_per_node : array_like of int [1]
        Ranks of the group on each node (g).
    intra_node_bandwidth, inter_node_bandwidth : array_like [B/s]
    inter_node_latency : array_like [s]
    intra_node_latency : array_like [s], optional
        Defaults to 500 ns, as in the reference.

    Returns
    -------
    numpy.ndarray [s]
    """
    g = np.asarray(ranks_per_node)
    # Phases 1 and 3 of [3]: reduce-scatter and all-gather inside the node,
    # each (g-1)/g * M / beta_intra + (g-1) * alpha_intra.
    intra_phase = (g - 1) / g * message_bytes / intra_node_bandwidth + (g - 1) * intra_node_latency
    # Phase 2: ring all-reduce of the M/g chunk each node owns, across nodes.
    inter_phase = ring_allreduce_time(message_bytes / g, n_nodes,
                                      bandwidth=inter_node_bandwidth, latency=inter_node_latency)
    return intra_phase + inter_phase + intra_phase
