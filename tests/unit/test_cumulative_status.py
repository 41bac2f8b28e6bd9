"""The counters of /status carried from one job to the next (a cluster worker's jobs, one per
assignment): counters add up, a function or endpoint only an earlier job had stays, gauges
and text are the current job's."""

from __future__ import annotations

from statefun.runtime._status import CumulativeStatus


def _status(invocations: int, mailbox: int, **functions: int) -> dict[str, object]:
    return {
        "invocations": invocations,
        "messages_in_flight": mailbox,
        "checkpoints": {"completed": 2, "last": "/cp/2"},
        "functions": {
            name: {"invocations": n, "messages_in": n, "mailbox": mailbox}
            for name, n in functions.items()
        },
        "dead_letters": 1,
    }


def test_counters_add_up_across_jobs_gauges_do_not() -> None:
    carried = CumulativeStatus()
    carried.fold(_status(10, 5, **{"shop/cart": 10}))
    carried.fold(_status(3, 7, **{"shop/cart": 2, "shop/audit": 1}))
    shown = carried.added(_status(4, 9, **{"shop/audit": 4}))
    assert shown["invocations"] == 17 and shown["dead_letters"] == 3
    assert shown["messages_in_flight"] == 9  # a gauge: the current job's
    assert shown["checkpoints"] == {"completed": 6, "last": "/cp/2"}
    assert shown["functions"]["shop/audit"] == {"invocations": 5, "messages_in": 5, "mailbox": 9}
    assert shown["functions"]["shop/cart"] == {"invocations": 12, "messages_in": 12}
    assert list(shown) == list(_status(0, 0))  # the order of the current status
