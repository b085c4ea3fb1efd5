#!/usr/bin/env python3
"""Sends N single-key compare-and-sets shaped as the Redis store sends them (keys over 100k zipf
keys, tagged values, PXAT) straight to a redis-server, raw RESP, PIPE script calls per write.
usage: redis_script_drive.py PORT MODE N [PER] [PIPE]
MODE: new (the script of crates/redis/src/cas.rs, PER compare-and-sets per EVALSHA; values
`state;writer.seq;pxat`), base (the same for the script of an earlier revision, values
`state;writer.seq`), old (the one-per-call script of a88ec0c, PER ignored), nop (EVALSHA of
`return 1`, one key), plain (SET key value PXAT t GET, no Lua), nx (SET key value NX PXAT t GET,
no Lua: the store's plain compare-and-set of a key expected absent). The script's text is read from LUA
(env). MISMATCH (env, 0 to 1, default 0): the share of compare-and-sets sent expecting a value the
key does not hold (another writer's), which write nothing. FRESH=1 (env): every compare-and-set
on a key never written, expected absent (as the store's are at 100k keys whose states outlive
their window by a second only); compare `FRESH=1 ... new 4` with `FRESH=1 ... nx`."""
import bisect, os, random, socket, sys, time

port, mode, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
per = int(sys.argv[4]) if len(sys.argv) > 4 else 1
pipe = int(sys.argv[5]) if len(sys.argv) > 5 else 64


def enc(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


s = socket.create_connection(("127.0.0.1", port))
f = s.makefile("rb")


def read():
    line = f.readline()
    t = line[:1]
    if t == b"-":
        raise SystemExit(line)
    if t in (b"+", b":"):
        return line[1:-2]
    if t == b"$":
        size = int(line[1:-2])
        return None if size < 0 else f.read(size + 2)[:-2]
    if t == b"*":
        return [read() for _ in range(int(line[1:-2]))]
    raise SystemExit(b"bad reply " + line)


script = {"nop": "return 1", "plain": "return 1", "nx": "return 1"}.get(mode) or open(os.environ["LUA"]).read()
s.sendall(enc("SCRIPT", "LOAD", script))
sha = read()
random.seed(1)
harmonic = [0.0]
for i in range(1, 100_001):
    harmonic.append(harmonic[-1] + 1.0 / i)
held, seq, pxat = {}, 0, int(time.time() * 1000) + 3_600_000
mismatch = float(os.environ.get("MISMATCH", "0"))
fresh = os.environ.get("FRESH") == "1"
suffix = ";%d" % pxat if mode in ("new", "nx") else ""


def decision():
    global seq
    k = bisect.bisect_left(harmonic, random.random() * harmonic[-1])
    seq += 1
    if fresh:
        k = 100_000 + seq
    expected = held.get(k, "")
    new = "%d:0;9f3a2b1c4d5e6f70.%x%s" % (1_767_225_600_000_000_000 + seq * 1000, seq, suffix)
    if mismatch and random.random() < mismatch:
        expected = "1:0;1.1" + suffix  # another writer's value, never held: writes nothing
    else:
        held[k] = new
    return "load:load|user=user-%07d|0.1.1s" % k, expected, new


done = 0
while done < n:
    cmds = []
    while len(cmds) < pipe and done < n:
        if mode in ("new", "base"):
            ds = [decision() for _ in range(min(per, n - done))]
            args = [b"\x00\x01" * len(ds)]
            for _, expected, new in ds:
                args += [expected, new, pxat]
            cmds.append(enc("EVALSHA", sha, len(ds), *[d[0] for d in ds], *args))
        else:
            ds = [decision()]
            key, expected, new = ds[0]
            if mode == "plain":
                cmds.append(enc("SET", key, new, "PXAT", pxat, "GET"))
            elif mode == "nx":
                cmds.append(enc("SET", key, new, "NX", "PXAT", pxat, "GET"))
            else:
                cmds.append(enc("EVALSHA", sha, 1, key, expected, new, pxat))
        done += len(ds)
    s.sendall(b"".join(cmds))
    for _ in cmds:
        read()
