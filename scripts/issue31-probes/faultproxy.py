#!/usr/bin/env python3
"""A TCP proxy in front of Redis for start-up probes: every chunk is held DELAY_MS each way (a
Redis that far away), and with --cut-percent P each reply chunk from Redis is, with probability
P %, cut in the middle: its first half is sent, then the connection is closed both ways (a reply
cut short, "Unexpected end of input"). Seeded, so a run is repeatable.

usage: faultproxy.py LISTEN_PORT UPSTREAM_PORT [--delay-ms N] [--cut-percent P] [--seed S]
"""
import argparse
import asyncio
import random


async def pump(reader, writer, delay, cut, rng, peer_writer):
    """Copies reader to writer, each chunk `delay` s after it was read, in order."""
    queue = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def write():
        while True:
            item = await queue.get()
            if item is None:
                break
            at, data, last = item
            wait = at + delay - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                writer.write(data)
                await writer.drain()
            except OSError:
                break
            if last:
                break
        for w in (writer, peer_writer):
            try:
                w.close()
            except OSError:
                pass

    task = asyncio.create_task(write())
    try:
        while True:
            data = await reader.read(16384)
            if not data:
                break
            if cut and rng.random() * 100 < cut:
                await queue.put((loop.time(), data[: len(data) // 2], True))
                break
            await queue.put((loop.time(), data, False))
    except OSError:
        pass
    await queue.put(None)
    await task


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("listen", type=int)
    p.add_argument("upstream", type=int)
    p.add_argument("--delay-ms", type=float, default=0)
    p.add_argument("--cut-percent", type=float, default=0)
    p.add_argument("--seed", type=int, default=31)
    a = p.parse_args()
    rng = random.Random(a.seed)
    delay = a.delay_ms / 1000

    async def handle(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", a.upstream)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(
            pump(client_r, server_w, delay, 0, rng, client_w),
            pump(server_r, client_w, delay, a.cut_percent, rng, server_w),
        )

    server = await asyncio.start_server(handle, "127.0.0.1", a.listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
