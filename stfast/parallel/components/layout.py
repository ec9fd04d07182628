"""The 2-D process layout of data parallelism × component parallelism: ``world_size = dp × cp`` ranks;
rank r is stage ``r % cp`` of replica ``r // cp``. A replica (its cp ranks, consecutive: activations
move between neighbours, often on one node) runs the component plan on its shard of the global batch;
the ranks holding the same stage across replicas form a data-parallel group.

    world 4 = 2 dp × 2 cp:   replica 0: ranks 0 (stage 0), 1 (stage 1)   cp groups [0, 1], [2, 3]
                             replica 1: ranks 2 (stage 0), 3 (stage 1)   dp groups [0, 2], [1, 3]
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from ..data_parallel import DistInfo

__all__ = ["ParallelLayout"]


@dataclass
class ParallelLayout:
    """This rank's place in a dp × cp layout, with its two process groups.

    ``cp_group``: the ranks of this replica (send/recv of activations: a
    :class:`~stfast.parallel.comm.TorchCommunicator` over it has rank = stage); ``dp_group``: the ranks
    holding this rank's stage in every replica (a gradient sync of the stage's parameters over it sums
    the replicas). Groups are None when not built (``groups=False`` or torch.distributed not initialized).
    """

    rank: int
    world_size: int
    cp: int
    cp_group: object = field(default=None, repr=False)
    dp_group: object = field(default=None, repr=False)

    @property
    def dp(self) -> int:
        return self.world_size // self.cp

    @property
    def stage(self) -> int:
        return self.rank % self.cp

    @property
    def replica(self) -> int:
        return self.rank // self.cp

    def cp_ranks(self, replica: int | None = None) -> list[int]:
        r = self.replica if replica is None else replica
        return list(range(r * self.cp, (r + 1) * self.cp))

    def dp_ranks(self, stage: int | None = None) -> list[int]:
        s = self.stage if stage is None else stage
        return list(range(s, self.world_size, self.cp))

    @property
    def data_info(self) -> DistInfo:
        """Rank and world size of the DATA dimension (replica, dp): which shard of a global batch this
        replica takes (every stage of a replica takes the same shard)."""
        return DistInfo(self.replica, self.dp, 0)

    @classmethod
    def build(cls, cp: int, rank: int | None = None, world_size: int | None = None,
              groups: bool = True) -> ParallelLayout:
        """The layout of ``world_size`` ranks (default: torch.distributed's) with ``cp`` stages per
        replica; with ``groups`` (and torch.distributed initialized) creates every cp and dp group with
        ``dist.new_group`` — collectively: every rank must call with the same arguments. Raises ValueError
        when cp < 1 or does not divide the world size, or rank is out of range."""
        if world_size is None:
            world_size = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        if cp < 1 or world_size % cp:
            raise ValueError(f"component-parallel size {cp} must be ≥ 1 and divide the world size {world_size} "
                             f"(world = data-parallel replicas × stages)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        lay = cls(rank, world_size, cp)
        if groups and dist.is_initialized():
            # new_group is collective over the WHOLE world: every rank creates every group, in one order
            for r in range(lay.dp):
                g = dist.new_group(lay.cp_ranks(r))
                if r == lay.replica:
                    lay.cp_group = g
            for s in range(cp):
                g = dist.new_group(lay.dp_ranks(s))
                if s == lay.stage:
                    lay.dp_group = g
        return lay
