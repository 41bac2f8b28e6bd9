"""The runtime: plan a module into a job and run it.

``Job`` is imported on first use, so that the checkpoint package (which the job uses) can
import the runtime's small modules without a cycle.
"""

from typing import TYPE_CHECKING, Any

__all__ = ["REPLY_TYPENAME", "Job"]

if TYPE_CHECKING:
    from statefun.runtime._job import REPLY_TYPENAME, Job


def __getattr__(name: str) -> Any:
    if name in __all__:
        from statefun.runtime import _job

        return getattr(_job, name)
    raise AttributeError(f"module 'statefun.runtime' has no attribute {name!r}")
