"""A user-space delay line for the ``latency`` fault: ``python -m substrate.delay --queue N --delay-ms D``.

This kernel has no netem (``../shared/notes/substrate.md``), so no qdisc can delay a packet. An
``ip6tables``/``iptables`` rule with the ``NFQUEUE`` target (the kernel's nfnetlink_queue) hands
the packets leaving an interface to this process instead; it holds each one for ``D`` ms and then
gives the kernel its verdict ``accept``, so the packet goes on unchanged, in order, ``D`` ms late.
The queue is read through NetfilterQueue (libnetfilter_queue's Python binding).

What is delayed: IPv4 and IPv6 packets the rule matches (forwarded and locally sent, e.g. SRv6
encapsulated tenant traffic and BGP over IPv6). What is not: frames that are not IP -- IS-IS
hellos and LSPs are plain 802.2 frames and never meet an ip(6)tables hook -- so the IGP neither
sees the delay nor reacts to it, as with a long fibre.

The rule is installed with ``--queue-bypass``: while no process listens on the queue (before
this one is ready, after it exits or is killed) packets pass undelayed instead of being dropped,
so a crashed delay line never blackholes a link.

Protocol with the caller: once bound to the queue the process prints ``ready`` on stdout; it
runs until SIGTERM/SIGINT, then accepts every packet it still holds (none is lost) and exits 0.
At most ``--max-held`` packets are held at once (default 10,000); beyond that a packet is accepted
at once (the delay line behaves like a full buffer that lets the excess through late only by the
queue's own wait). Exit status 2: the queue could not be bound (taken, or no nfnetlink_queue).
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import os
import select
import signal
import sys
import time
from typing import Any


def run(queue: int, delay_s: float, max_held: int = 10_000) -> int:
    """Hold every packet of NFQUEUE ``queue`` for ``delay_s`` seconds, then accept it.

    Returns the process exit status (0 after SIGTERM/SIGINT, 2 when the queue cannot be bound).
    """
    from netfilterqueue import NetfilterQueue

    held: list[tuple[float, int, Any]] = []
    order = itertools.count()
    stop = False

    def on_packet(pkt: Any) -> None:
        if len(held) >= max_held:
            pkt.accept()
            return
        heapq.heappush(held, (time.monotonic() + delay_s, next(order), pkt))

    def on_signal(_sig: int, _frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    nfq = NetfilterQueue()
    try:
        nfq.bind(queue, on_packet, max_len=4096)
    except OSError as e:
        print(f"cannot bind NFQUEUE {queue}: {e}", file=sys.stderr, flush=True)
        return 2
    fd = nfq.get_fd()
    try:
        os.write(sys.stdout.fileno(), b"ready\n")
    except OSError:
        pass  # the caller stopped listening once it read "ready": nothing more is written
    try:
        while not stop:
            wait = max(0.0, held[0][0] - time.monotonic()) if held else 0.5
            try:
                readable, _, _ = select.select([fd], [], [], wait)
            except InterruptedError:
                continue
            if readable:
                nfq.run(block=False)
            now = time.monotonic()
            while held and held[0][0] <= now:
                heapq.heappop(held)[2].accept()
    finally:
        while held:
            heapq.heappop(held)[2].accept()
        nfq.unbind()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m substrate.delay", description=__doc__.splitlines()[0])
    p.add_argument("--queue", type=int, required=True, help="NFQUEUE number (0-65535)")
    p.add_argument("--delay-ms", type=float, required=True, help="delay added to every packet, in milliseconds")
    p.add_argument("--max-held", type=int, default=10_000, help="packets held at most at once")
    a = p.parse_args(argv)
    if not 0 <= a.queue <= 65535 or not 0 < a.delay_ms <= 10_000:
        p.error("--queue must be 0-65535 and --delay-ms in (0, 10000]")
    return run(a.queue, a.delay_ms / 1000.0, a.max_held)


if __name__ == "__main__":
    sys.exit(main())
