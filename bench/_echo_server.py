"""A trivial remote "function" for bench/runtime_e2e.py: the ceiling of the HTTP path.

Answers every ``POST /statefun`` with the same FromFunction bytes, read once from a file
(the benchmark writes a real reply of the counter function there), after reading the request
body. ``GET /health`` answers. Two servers:

  aiohttp   (default) ``web.AppRunner`` and ``web.TCPSite``: the trivial aiohttp echo
            server that the remote goal is set against, and how ``make_app`` serves functions
  builtin   ``statefun serve``'s own path (``statefun.sdk.serve``) with a handler that
            answers the fixed reply: the function server minus the SDK handler's work

    python bench/_echo_server.py --port 8123 --reply reply.bin [--server builtin]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from aiohttp import web


def make_app(reply: bytes) -> web.Application:
    async def invoke(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=reply, content_type="application/octet-stream")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/statefun", invoke)
    app.router.add_get("/health", health)
    return app


def main_builtin(host: str, port: int, reply: bytes) -> None:
    from statefun import RequestReplyHandler, StatefulFunctions
    from statefun.sdk import serve

    class Echo(RequestReplyHandler):
        def begin(self, body: bytes) -> bytes:
            return reply

    serve(Echo(StatefulFunctions()), host, port, shutdown_timeout=5.0)


async def main(host: str, port: int, reply: bytes) -> None:
    runner = web.AppRunner(make_app(reply), handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reply", type=Path, required=True, help="file holding the reply body")
    parser.add_argument("--server", choices=["aiohttp", "builtin"], default="aiohttp")
    args = parser.parse_args()
    if args.server == "builtin":
        main_builtin(args.host, args.port, args.reply.read_bytes())
    else:
        asyncio.run(main(args.host, args.port, args.reply.read_bytes()))
