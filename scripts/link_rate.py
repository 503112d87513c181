#!/usr/bin/env python3
"""scripts/link_rate.py: a TCP link's rate with both directions busy at once,
the reference of scripts/cluster_bench's collectives.

    link_rate.py serve PORT BYTES            on one host: accept one peer
    link_rate.py send ADDRESS PORT BYTES     on the other
    link_rate.py alltoall I ADDRESSES PORT BYTES   on every host I of ADDRESSES
                                                   (comma separated), at once

Each side sends BYTES to the other while it receives BYTES from it (one
connection, full duplex), after a warm-up of 1/8 of BYTES each way; `send`
prints one JSON line: the bytes each way, the seconds until both directions
had finished, and the rate per direction in Gbit/s.

`alltoall`: the traffic of an all-to-all exchange (mp's reduce-scatter
rounds) in plain TCP. Every host sends BYTES to every other host while it
receives BYTES from each (one connection per pair, a thread per direction),
after the same warm-up; the hosts start together after a barrier (a byte
to and from host 0). Each prints one JSON line: its rate per direction,
(hosts - 1) x BYTES over the seconds until all of its transfers had ended.
"""
import json
import socket
import sys
import threading
import time

CHUNK = 1 << 20


def pump(sock, nbytes):
    """Sends nbytes on sock while receiving nbytes from it; returns when both are done."""
    block = b"\0" * CHUNK

    def send():
        left = nbytes
        while left > 0:
            n = sock.send(block[:min(CHUNK, left)])
            left -= n
    t = threading.Thread(target=send)
    t.start()
    left = nbytes
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    while left > 0:
        n = sock.recv_into(view[:min(CHUNK, left)])
        if n == 0:
            raise SystemExit("link_rate: the peer closed the connection")
        left -= n
    t.join()


def exchange(sock, nbytes):
    pump(sock, max(CHUNK, nbytes // 8))  # warm-up: the window grows
    t0 = time.perf_counter()
    pump(sock, nbytes)
    return time.perf_counter() - t0


def connect(addr, port, tries, timeout):
    """A connection to addr:port, trying every 0.1 s while the peer starts."""
    for _ in range(tries):
        try:
            return socket.create_connection((addr, port), timeout=timeout)
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"link_rate: cannot connect to {addr}:{port}")


def mesh(me, addrs, port):
    """One connection to every other host: host i accepts those of the hosts
    after it and connects to those before it. Returns {peer: socket}."""
    socks = {}
    with socket.create_server(("", port)) as srv:
        for j in range(me):
            socks[j] = connect(addrs[j], port, tries=100, timeout=60)
            socks[j].sendall(bytes([me]))
        for _ in range(len(addrs) - 1 - me):
            conn, _ = srv.accept()
            socks[conn.recv(1)[0]] = conn
    for s_ in socks.values():
        s_.settimeout(None)
    return socks


def alltoall_round(socks, nbytes):
    threads = [threading.Thread(target=pump, args=(s_, nbytes)) for s_ in socks.values()]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def barrier(me, socks):
    if me == 0:
        for s_ in socks.values():
            s_.recv(1)
        for s_ in socks.values():
            s_.sendall(b"g")
    else:
        socks[0].sendall(b"r")
        socks[0].recv(1)


def alltoall(me, addrs, port, nbytes):
    socks = mesh(me, addrs, port)
    alltoall_round(socks, max(CHUNK, nbytes // 8))  # warm-up
    barrier(me, socks)
    seconds = alltoall_round(socks, nbytes)
    for s_ in socks.values():
        s_.close()
    print(json.dumps({"suite": "link_alltoall", "host": me, "hosts": len(addrs), "bytes_to_each": nbytes,
                      "seconds": round(seconds, 4),
                      "gbit_per_s_each_way": round((len(addrs) - 1) * nbytes * 8 / seconds / 1e9, 3)}), flush=True)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        port, nbytes = int(sys.argv[2]), int(sys.argv[3])
        with socket.create_server(("", port)) as srv:
            conn, _ = srv.accept()
            with conn:
                exchange(conn, nbytes)
    elif len(sys.argv) == 5 and sys.argv[1] == "send":
        addr, port, nbytes = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        with connect(addr, port, tries=50, timeout=30) as sock:
            seconds = exchange(sock, nbytes)
        print(json.dumps({"suite": "link_rate", "bytes_each_way": nbytes, "seconds": round(seconds, 4),
                          "gbit_per_s_each_way": round(nbytes * 8 / seconds / 1e9, 3)}))
    elif len(sys.argv) == 6 and sys.argv[1] == "alltoall":
        alltoall(int(sys.argv[2]), sys.argv[3].split(","), int(sys.argv[4]), int(sys.argv[5]))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
