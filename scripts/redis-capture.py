#!/usr/bin/env python3
"""Records what a Redis client sends, and readies it to be sent again at full speed (issue 34:
redis-server's CPU per decision when Redis is busy, scripts/cost-per-decision.sh capacity).

  redis-capture.py record LISTEN_PORT UPSTREAM_PORT OUT
      A TCP proxy on 127.0.0.1:LISTEN_PORT to 127.0.0.1:UPSTREAM_PORT; on SIGTERM or SIGINT it
      writes the commands clients sent to OUT, each whole, those of all connections in the order
      they came (a client with a pool of connections sends a key's next compare-and-set on any
      of them, once the last one's reply came), and exits.
  redis-capture.py shift IN OUT
      Copies the recorded commands (RESP arrays of bulk strings) with every absolute expiry moved
      forward by the same amount, so that none has passed when they are sent again: an argument
      of 13 digits within a day of now (a PXAT, in ms since the epoch) and the last part of a
      value `state;writer.seq;pxat` (the expiry the store's values carry). Prints how many
      commands it wrote.
"""
import asyncio
import re
import signal
import sys
import time


def record(listen_port, upstream_port, out):
    sent = []  # every connection's commands, whole, in the order their last byte came

    def complete(buffer):
        """How many bytes at the start of `buffer` are whole commands."""
        i, n, done = 0, len(buffer), 0
        try:
            while i < n:
                end = buffer.index(b"\r\n", i)
                count, i = int(buffer[i + 1 : end]), end + 2
                for _ in range(count):
                    end = buffer.index(b"\r\n", i)
                    i = end + 2 + int(buffer[i + 1 : end]) + 2
                if i > n:
                    break
                done = i
        except ValueError:  # a line not yet whole
            pass
        return done

    async def pump(reader, writer, record):
        buffer = bytearray()
        try:
            while data := await reader.read(1 << 16):
                if record:
                    buffer += data
                    whole = complete(buffer)
                    sent.append(bytes(buffer[:whole]))
                    del buffer[:whole]
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def serve(client_r, client_w):
        up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream_port)
        await asyncio.gather(pump(client_r, up_w, True), pump(up_r, client_w, False))

    async def main():
        server = await asyncio.start_server(serve, "127.0.0.1", listen_port)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        async with server:
            await stop.wait()
        with open(out, "wb") as f:
            f.writelines(sent)

    asyncio.run(main())


def commands(data):
    """The commands in `data`: lists of bulk strings (RESP arrays, as clients send them)."""
    i, n = 0, len(data)
    while i < n:
        if data[i : i + 1] != b"*":
            raise ValueError(f"not a RESP array at byte {i}")
        end = data.index(b"\r\n", i)
        count, i = int(data[i + 1 : end]), end + 2
        args = []
        for _ in range(count):
            end = data.index(b"\r\n", i)
            size = int(data[i + 1 : end])
            args.append(data[end + 2 : end + 2 + size])
            i = end + 2 + size + 2
        yield args


def shift(src, dst):
    data = open(src, "rb").read()
    now = int(time.time() * 1000)
    window = range(now - 86_400_000, now + 86_400_000)
    stamp = re.compile(rb"^\d{13}$")
    tail = re.compile(rb"^([^;]*;[^;]*;)(\d{13})$")
    cmds = list(commands(data))
    stamps = [int(a) for c in cmds for a in c if stamp.match(a) and int(a) in window]
    # Every expiry at least a minute ahead of now: the sending takes seconds.
    delta = max(0, now + 60_000 - min(stamps)) if stamps else 0

    def moved(arg):
        if stamp.match(arg) and int(arg) in window:
            return b"%d" % (int(arg) + delta)
        m = tail.match(arg)
        if m and int(m[2]) in window:
            return m[1] + b"%d" % (int(m[2]) + delta)
        return arg

    with open(dst, "wb") as f:
        for c in cmds:
            f.write(b"*%d\r\n" % len(c))
            for a in c:
                a = moved(a)
                f.write(b"$%d\r\n%s\r\n" % (len(a), a))
    print(len(cmds))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "record":
        record(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "shift":
        shift(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
