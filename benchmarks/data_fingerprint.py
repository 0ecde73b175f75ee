"""What recording a data file's identity costs: ``beatloop.named_data.identity.fingerprint``
(SHA-256 read 1 MiB at a time, what ``run.json``'s ``data_files`` records) in MB/s on a
generated file, beside BLAKE2b read the same way and a plain read of the file (the
disk's share), and the ``os.stat`` a resume takes for a file whose size and modification
time are unchanged (it is not read then).

The file is written once (random bytes) and read ``--repeats`` times per scheme,
interleaved; medians and the spread. The first read of a file just written comes from
the page cache, as does every later one: the figures are the hash's cost, not the
disk's (run it on a file larger than memory, ``--path``, to see a disk's).

    python benchmarks/data_fingerprint.py                 # a 512 MiB file, 5 repeats
    python benchmarks/data_fingerprint.py --mib 2048 --repeats 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from beatloop.named_data.identity import CHUNK, fingerprint


def _read_with(path: Path, digest) -> None:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            if digest is not None:
                digest.update(view[:read])


SCHEMES = {
    "sha256 (beatloop)": fingerprint,
    "blake2b": lambda path: _read_with(path, hashlib.blake2b(digest_size=32)),
    "read only": lambda path: _read_with(path, None),
}


def _write(path: Path, mib: int) -> None:
    block = os.urandom(CHUNK)
    with open(path, "wb") as handle:
        for _ in range(mib):
            handle.write(block)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512, help="size of the generated file")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--path", type=Path, default=None, help="an existing file instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = args.path or Path(folder) / "data.bin"
        if args.path is None:
            _write(path, args.mib)
        size = path.stat().st_size / 1e6
        times: dict[str, list[float]] = {name: [] for name in SCHEMES}
        for _ in range(args.repeats):
            for name, scheme in SCHEMES.items():
                start = time.perf_counter()
                scheme(path)
                times[name].append(time.perf_counter() - start)
        stats = []
        for _ in range(1000):
            start = time.perf_counter()
            os.stat(path)
            stats.append(time.perf_counter() - start)
    print(f"file: {size:.0f} MB, {args.repeats} repeats, medians")
    for name, seconds in times.items():
        rates = [size / s for s in seconds]
        half = 50 * (max(rates) - min(rates)) / statistics.median(rates)
        print(f"  {name:<20} {statistics.median(rates):8.0f} MB/s  (±{half:.0f}%)")
    print(f"  {'unchanged (os.stat)':<20} {statistics.median(stats) * 1e6:8.1f} µs a file")


if __name__ == "__main__":
    main()
