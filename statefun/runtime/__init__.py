"""The runtime: plan a module into a job and run it."""

from statefun.runtime._job import REPLY_TYPENAME, Job

__all__ = ["REPLY_TYPENAME", "Job"]
