"""Where a rank sits among the runtime's nodes, for the kernels that cross them (the ``"2d"``
methods): nodes are contiguous blocks of ``LOCAL`` ranks (``tdist.local_world_size()``, passed
by the host as a constant, not recomputed in the kernel)."""

import triton
import triton.language as tl

from ... import language as dl


@triton.jit
def node_position(LOCAL: tl.constexpr):
    """``(me, node_first, local)``: this rank, the first rank of its node and its index there."""
    me = dl.rank()
    return me, (me // LOCAL) * LOCAL, me % LOCAL


@triton.jit
def same_local_rank(node_first, d, local, LOCAL: tl.constexpr, WORLD: tl.constexpr):
    """The rank of local index ``local`` on the node ``d`` nodes after the one starting at
    ``node_first`` (wrapping around the world)."""
    return (node_first + d * LOCAL + local) % WORLD
