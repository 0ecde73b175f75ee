"""The identity of the files a run's data came from, as ``run.json`` records it
(``data_files``): each file's size, modification time and a content fingerprint, by
data source. Exact resume and "evaluate equals the last ``val_`` figures" both assume
the data did not change: a resume compares the data given now with the record (a change
is refused unless accepted), ``evaluate`` warns about one.

A file whose size and modification time are those recorded is taken as unchanged
without reading it (as ``make`` and ``rsync`` do); any other is read again and its
fingerprint compared, so a file rewritten with the same bytes is no change. This module
imports nothing of the sources or the plugins: they hand it a ``DataSource``'s files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Bytes read at a time while fingerprinting: memory stays flat for files of any size.
CHUNK = 1 << 20
#: The fingerprint's name in ``run.json``: SHA-256 of the whole file (on CPUs with SHA
#: instructions, most x86 and ARM ones, it hashes faster than BLAKE2b:
#: benchmarks/data_fingerprint.py).
FINGERPRINT = "sha256"
#: Changes named in one message; more are counted.
SHOWN = 4


class DataChangedWarning(UserWarning):
    """The data a run's ``run.json`` records has changed since (``beatloop.evaluate`` on
    a run's recorded data): the figures need not equal the run's last ``val_`` figures."""


def fingerprint(path: str | Path) -> str:
    """The file's SHA-256 digest (hex), read ``CHUNK`` bytes at a time."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            digest.update(view[:read])
    return digest.hexdigest()


def source_identity(
    label: str,
    role: str,
    path: str,
    files: Sequence[Path] | None,
    recorded: Any = None,
    named: dict[str, str] | None = None,
) -> dict[str, Any] | None:
    """One source's record: its ``label`` (``KIND:PATH``), ``role`` (training or
    validation), the folder its files are named from, each file's facts, and ``named``:
    what names the data beyond its files, when the source says (``DataSource.facts``: a
    data set's version). A file whose size and modification time equal those of
    ``recorded`` (this role's earlier record) keeps its recorded fingerprint unread.
    ``None`` when ``files`` is ``None`` (the source does not say which files it reads)."""
    if files is None:
        return None
    root = _root(path, files)
    known = {entry["path"]: entry for entry in (recorded or {}).get("files", ())}
    entries = []
    for file in sorted(files):
        name = Path(os.path.relpath(file, root)).as_posix()
        status = os.stat(file)
        before = known.get(name, {})
        facts = (status.st_size, status.st_mtime_ns)
        same = FINGERPRINT in before and (before.get("size"), before.get("mtime_ns")) == facts
        entries.append(
            {
                "path": name,
                "size": status.st_size,
                "mtime_ns": status.st_mtime_ns,
                FINGERPRINT: before[FINGERPRINT] if same else fingerprint(file),
            }
        )
    entry = {"source": label, "role": role, "root": os.path.abspath(root), "files": entries}
    return {**entry, "facts": dict(named)} if named else entry


def _root(path: str, files: Sequence[Path]) -> Path:
    """The folder a source's files are named from: the folder it names, else the folder
    its files share (a file's own folder)."""
    if Path(path).is_dir():
        return Path(path)
    if not files:
        return Path(path).parent
    return Path(os.path.commonpath([os.path.dirname(os.path.abspath(file)) for file in files]))


def by_role(identity: Sequence[dict]) -> dict[str, dict]:
    """A recorded identity (``run.json``'s ``data_files``) by role."""
    return {entry.get("role", "training"): entry for entry in identity or ()}


def changes(recorded: Sequence[dict], now: Sequence[dict]) -> list[str]:
    """What differs between the recorded identity and the data's now, file by file, in
    words: ``t.csv: size 9000 -> 7500 bytes``, ``content differs``, ``file missing``,
    ``files added``; ``[]`` when nothing does."""
    before, after = by_role(recorded), by_role(now)
    found = []
    for role in sorted(set(before) | set(after)):
        if role not in after:
            found.append(f"the {role} data source {before[role]['source']} is not given now")
        elif role not in before:
            found.append(f"the {role} data source {after[role]['source']} is not recorded")
        else:
            found += _fact_changes(before[role], after[role])
            found += _file_changes(before[role], after[role])
    return found


def _fact_changes(before: dict, after: dict) -> list[str]:
    """The source's facts that differ (``tfds:mnist: version 3.0.0 -> 3.0.1``)."""
    was, now = before.get("facts") or {}, after.get("facts") or {}
    return [
        f"{after['source']}: {name} {was.get(name, '(none)')} -> {now.get(name, '(none)')}"
        for name in sorted(set(was) | set(now))
        if was.get(name) != now.get(name)
    ]


def _file_changes(before: dict, after: dict) -> list[str]:
    old = {entry["path"]: entry for entry in before["files"]}
    new = {entry["path"]: entry for entry in after["files"]}
    if len(old) == len(new) == 1:  # one file, maybe renamed: compared as the same file
        old = {next(iter(new)): next(iter(old.values()))}
    root = Path(after["root"])
    found = []
    for name in sorted(set(old) & set(new)):
        was, now = old[name], new[name]
        if was["size"] != now["size"]:
            found.append(f"{root / name}: size {was['size']} -> {now['size']} bytes")
        elif was.get(FINGERPRINT) != now.get(FINGERPRINT):
            found.append(f"{root / name}: content differs (same size)")
    missing = sorted(set(old) - set(new))
    added = sorted(set(new) - set(old))
    for names, what in ((missing, "missing"), (added, "added")):
        if names:
            shown = ", ".join(str(root / name) for name in names[:SHOWN])
            more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            found.append(f"file(s) {what}: {shown}{more}")
    return found


def describe(found: Sequence[str]) -> str:
    """The changes on one line, the first few named and the rest counted."""
    shown = "; ".join(found[:SHOWN])
    more = f"; and {len(found) - SHOWN} more change(s)" if len(found) > SHOWN else ""
    return shown + more
