"""How a parallel run (``pytest -n N``, pytest-xdist) deals out the tests to its workers.

Each test is a unit of its own, handed to the next worker with room (as xdist's ``load``), but
the tests of a module in :data:`ONE_WORKER` form one unit: one worker runs them all, one after
another, and never two of them at once. xdist's own grouping (``--dist loadgroup`` with the
``xdist_group`` mark) renames test ids, which pytest 9.2 no longer lets it do: it then groups
nothing, silently.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

#: Modules whose tests must not run beside each other: the documents' commands use the
#: README's fixed ports (8000, 8090, 8091, 9092).
ONE_WORKER = frozenset({"tests/docs/test_readme_commands.py"})


class OneWorkerModules(LoadScopeScheduling):
    """xdist's ``loadscope`` scheduling, with a unit per test except for :data:`ONE_WORKER`.

    Units are dealt out largest first (xdist's ``--loadscope-reorder``, on by default), so a
    grouped module starts at once rather than last; the rest go in the order of collection.
    """

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in ONE_WORKER else nodeid
