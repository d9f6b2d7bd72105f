"""The event loop's stall while a worker thread builds one 50 MB string (issue 21).

A 1 ms heartbeat runs on the main thread while a worker thread builds 50 MB from 14 KB
pieces three ways: ``"".join`` of ``str`` pieces (what a reader of a huge string value
does last), ``b"".join`` of ``bytes`` pieces (which lets other threads run while it
copies) and that ``bytes`` decoded into a ``str``. Prints the heartbeat's worst lateness
in ms for each, per round: the floor a reader handing back a 50 MB ``str`` cannot go under.

    python bench/str_floor.py [--rounds N] [--mb M]
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

PIECE = 14_000


def lag_max_ms(build: Callable[[], object]) -> float:
    """The heartbeat's worst lateness (ms) while ``build`` runs in a worker thread."""
    done = threading.Event()

    def work() -> None:
        time.sleep(0.01)
        build()
        done.set()

    thread = threading.Thread(target=work)
    thread.start()
    worst, last = 0.0, time.perf_counter()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last - 0.001), now
    thread.join()
    return worst * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mb", type=int, default=50)
    args = parser.parse_args()
    pieces = ["x" * PIECE] * (args.mb * 1_000_000 // PIECE)
    raw = [p.encode() for p in pieces]
    ways: dict[str, Callable[[], object]] = {
        "str join": lambda: "".join(pieces),
        "bytes join": lambda: b"".join(raw),
        "bytes join + decode": lambda: b"".join(raw).decode("ascii"),
    }
    for n in range(args.rounds):
        lags = {name: lag_max_ms(build) for name, build in ways.items()}
        print(f"round {n + 1}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in lags.items()))


if __name__ == "__main__":
    main()
