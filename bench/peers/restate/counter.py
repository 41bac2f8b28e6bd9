"""The counter of bench/restate_vs_pystatefun.py as a Restate Virtual Object (restate-sdk).

``Counter/{key}/add`` increments the key's count and answers the new count; ``Counter/{key}/get``
(a shared handler: reads only) answers the count. Restate journals each step and keeps the
state change durable before the answer leaves the server (its default).

Served with hypercorn (HTTP/2 without TLS, as Restate calls its services):

    python -m hypercorn --bind 127.0.0.1:9080 counter:app
"""

import restate

counter = restate.VirtualObject("Counter")


@counter.handler()
async def add(ctx: restate.ObjectContext) -> int:
    count = (await ctx.get("count", type_hint=int)) or 0
    count += 1
    ctx.set("count", count)
    return count


@counter.handler(kind="shared")
async def get(ctx: restate.ObjectSharedContext) -> int:
    return (await ctx.get("count", type_hint=int)) or 0


app = restate.app(services=[counter])
