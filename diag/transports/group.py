"""A subgroup of the job's ranks that runs one step together (docs/inplace.md).

One launch of K ranks measures every N = 2..K: the first N ranks of the job (in the job's spread order) form
the subgroup of N. Every transport of a step lives on its subgroup: torch.distributed on the subgroup's own
process group, diag's raw meshes on a store namespace of their own. Ranks are the group's (0..N-1); the
group's rank 0 is the job's rank 0, which writes the records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GroupContext:
    """``ranks``: the members' global ranks, indexed by group rank; ``rank``: this process's group rank;
    ``process_group``: torch's group for the members (None: the default group, i.e. the whole job);
    ``store``: a store namespace only this group's raw meshes use (their rendezvous keys never meet another
    group's); ``control_group``: a gloo group of the same members for the small messages beside the
    measurement (a trial's stop votes, its CPU samples), where ``process_group`` is a backend that lacks
    gather (diag_tcp); None: ``process_group`` itself."""

    ranks: tuple[int, ...]
    rank: int
    process_group: Any = None
    store: Any = None
    label: str = ""
    control_group: Any = None

    @property
    def control(self) -> Any:
        return self.control_group if self.control_group is not None else self.process_group

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def global_rank(self, group_rank: int) -> int:
        return self.ranks[group_rank]


__all__ = ["GroupContext"]
