"""What decoding a probe value costs the parent's completion thread, per MiB, by shape.

A sandboxed program may return up to 8 MiB of plain data per execution (``sandbox.launch.Limits``);
the parent parses the line and rebuilds it (``sandbox.plain_data.loads``) on the pool's one
completion thread. Each shape is encoded by the sandbox's own encoder at about 8 MiB, then timed
against ``json.loads`` of the same line (the peer: the floor any JSON-based decode pays), alternating
in one run, best of ``--repeats``. Many small containers are the costliest shape per byte.

    .venv/bin/python benchmarks/plain_data_decode.py [--repeats 5] [--mib 8]
"""

from __future__ import annotations

import argparse
import json
import time

from rlcode.sandbox.inside.plain_encode import dumps
from rlcode.sandbox.plain_data import loads


def shapes(mib: float) -> dict[str, object]:
    """Values whose encoding is about ``mib`` MiB (each below the encoder's 1,000,000-item budget)."""
    n = int(mib * (1 << 20))
    return {
        "ints": [i % 100_000 for i in range(min(n // 7, 999_000))],
        "floats": [i / 7 for i in range(min(n // 20, 999_000))],
        "short strings": ["abcdefgh"] * min(n // 11, 999_000),
        "pairs as lists": [[i, i + 1] for i in range(n // 36)],
        "pairs as tuples": [(i, -i) for i in range(n // 38)],
        "dict of int lists": {i: [i] for i in range(n // 46)},
        "set of ints": set(range(min(n // 7, 999_000))),
        "list of one-item lists": [[i % 10] for i in range(n // 26)],
        "one string": "x" * (n - 16),
    }


def _best(function, line: str, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function(line)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--mib", type=float, default=8.0)
    args = parser.parse_args()
    rows = []
    for name, value in shapes(args.mib).items():
        line = dumps(value)
        assert '"opaque"' not in line[:40], f"{name}: the encoder refused it"
        assert loads(line) == value
        size = len(line) / (1 << 20)
        decode, floor = _best(loads, line, args.repeats), _best(json.loads, line, args.repeats)
        rows.append({"shape": name, "MiB": round(size, 2), "decode_ms": round(decode * 1e3, 1),
                     "ms_per_MiB": round(decode * 1e3 / size, 1), "json_loads_ms": round(floor * 1e3, 1),
                     "vs_json_loads": round(decode / floor, 2)})
        print(f"{name:24s} {size:5.2f} MiB  decode {decode * 1e3:7.1f} ms ({decode * 1e3 / size:5.1f} ms/MiB)"
              f"  json.loads {floor * 1e3:7.1f} ms  ratio {decode / floor:4.2f}", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
