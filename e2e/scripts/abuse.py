#!/usr/bin/env python3
"""Misbehaving clients for the webhook port (127.0.0.1 only), for rekindle's e2e tests.

  abuse.py slow-headers PORT      TLS, then half a request header, then silence: prints seconds until closed
  abuse.py random PORT            4 KiB of random bytes instead of a TLS hello: prints how the server answered
  abuse.py old-tls PORT VERSION   a TLS 1.0 or 1.1 only hello: prints "refused" or "accepted"
  abuse.py flood PORT N SECONDS   holds N idle TCP connections open, then prints how many the server closed
"""
import os
import socket
import ssl
import sys
import time


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def tls(port, version=None):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if version:
        ctx.minimum_version = version
        ctx.maximum_version = version
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    return ctx.wrap_socket(connect(port), server_hostname="127.0.0.1")


def slow_headers(port):
    s = tls(port)
    s.sendall(b"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
    start = time.monotonic()
    s.settimeout(60)
    try:
        while s.recv(4096):
            pass
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    print(f"{time.monotonic() - start:.1f}")


def random_bytes(port):
    s = connect(port)
    s.sendall(os.urandom(4096))
    s.settimeout(15)
    try:
        data = s.recv(4096)
        if not data:
            print("closed")
        elif data[0] == 0x15:  # a TLS alert record, then the server closes
            print("tls-alert")
        else:
            print(f"answered {len(data)} bytes")
    except (ConnectionError, OSError):
        print("closed")


def old_tls(port, version):
    v = {"1.0": ssl.TLSVersion.TLSv1, "1.1": ssl.TLSVersion.TLSv1_1}[version]
    try:
        tls(port, v)
        print("accepted")
    except (ssl.SSLError, ConnectionError, OSError):
        print("refused")


def flood(port, n, seconds):
    conns = []
    for _ in range(n):
        try:
            conns.append(connect(port))
        except OSError:
            break
    time.sleep(seconds)
    closed = 0
    for c in conns:
        c.setblocking(False)
        try:
            if c.recv(1) == b"":
                closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    print(f"{len(conns)} {closed}")


if __name__ == "__main__":
    mode, port = sys.argv[1], int(sys.argv[2])
    if mode == "slow-headers":
        slow_headers(port)
    elif mode == "random":
        random_bytes(port)
    elif mode == "old-tls":
        old_tls(port, sys.argv[3])
    elif mode == "flood":
        flood(port, int(sys.argv[3]), float(sys.argv[4]))
    else:
        sys.exit(__doc__)
