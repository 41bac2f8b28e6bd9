"""Serves a functions file with an SDK's own RequestReplyHandler over aiohttp.

Run with a peer virtualenv's python (official apache-flink-statefun, or the fork):

    python official_server.py path/to/functions.py PORT

Prints ``ready <port>`` once listening on 127.0.0.1; stops on SIGTERM.
"""

import asyncio
import importlib.util
import signal
import sys

from aiohttp import web

from statefun import RequestReplyHandler


def load_functions(path):
    spec = importlib.util.spec_from_file_location("peer_functions", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.functions


async def main(path, port):
    handler = RequestReplyHandler(load_functions(path))

    async def invoke(request):
        body = await request.read()
        return web.Response(
            body=await handler.handle_async(body), content_type="application/octet-stream"
        )

    app = web.Application()
    app.router.add_post("/statefun", invoke)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"ready {bound}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
