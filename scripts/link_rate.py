#!/usr/bin/env python3
"""scripts/link_rate.py: a TCP link's rate with both directions busy at once,
the reference of scripts/cluster_bench's collectives.

    link_rate.py serve PORT BYTES            on one host: accept one peer
    link_rate.py send ADDRESS PORT BYTES     on the other

Each side sends BYTES to the other while it receives BYTES from it (one
connection, full duplex), after a warm-up of 1/8 of BYTES each way; `send`
prints one JSON line: the bytes each way, the seconds until both directions
had finished, and the rate per direction in Gbit/s.
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


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "serve":
        port, nbytes = int(sys.argv[2]), int(sys.argv[3])
        with socket.create_server(("", port)) as srv:
            conn, _ = srv.accept()
            with conn:
                exchange(conn, nbytes)
    elif len(sys.argv) == 5 and sys.argv[1] == "send":
        addr, port, nbytes = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        for attempt in range(50):
            try:
                sock = socket.create_connection((addr, port), timeout=30)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise SystemExit(f"link_rate: cannot connect to {addr}:{port}")
        with sock:
            seconds = exchange(sock, nbytes)
        print(json.dumps({"suite": "link_rate", "bytes_each_way": nbytes, "seconds": round(seconds, 4),
                          "gbit_per_s_each_way": round(nbytes * 8 / seconds / 1e9, 3)}))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
