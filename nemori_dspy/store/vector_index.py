"""The SQLite store's search index: one user's vectors of one kind as a float32 matrix, kept in
append-only files beside the database and memory-mapped, so opening a store reads no vector blob.

SQLite stays the source of truth. Every stored episode / semantic row version gets a ``vseq``
(a database-wide counter that only grows, so a newer row always has a larger one and a row version
is never rewritten); the index holds rows in ``vseq`` order and is brought up to date by reading only
rows newer than its last ``vseq`` plus, when the live count disagrees, the live ``vseq`` list (no
blobs). Files per (user, kind): ``<stem>.f32`` (n × dim float32, unit rows) and ``<stem>.rows``
(n × [vseq, window] int64); a row is complete when both hold it. Reads of the files, appends and compaction
take a file lock on ``<stem>.lock`` (``filelock``: ``flock`` on POSIX, ``msvcrt.locking`` on Windows) so two
processes never interleave. The files are a cache: deleting them costs one
rebuild from SQLite on the next search.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from filelock import FileLock

__all__ = ["IndexSnapshot", "VectorIndex", "cosines"]

log = logging.getLogger(__name__)

_ROW_INTS = 2            # vseq, window
_COMPACT_MIN_DEAD = 1024  # rewrite the files when dead rows exceed this and the live count
_BLAS = None              # threadpoolctl controller, made on the first search


def cosines(matrix: np.ndarray, unit: np.ndarray) -> np.ndarray:
    """``matrix @ unit`` (float32, shape (n,)) on one BLAS thread.

    A matrix-vector product is memory-bound: BLAS's threads gain nothing and, on a machine whose cores
    are busy, wait for each other (docs/decisions.md). The limit is scoped to this product (threadpoolctl, ~0.05 ms)."""
    global _BLAS
    if _BLAS is None:
        from threadpoolctl import ThreadpoolController

        _BLAS = ThreadpoolController()
    with _BLAS.limit(limits=1, user_api="blas"):
        return np.asarray(matrix @ unit, dtype=np.float32)


@dataclass(frozen=True)
class IndexSnapshot:
    """An immutable view a search reads: ``vseqs`` (n,) int64 ascending, ``windows`` (n,) int64,
    ``matrix`` (n, dim) float32 unit rows (possibly memory-mapped), ``alive`` (n,) bool, and the user
    ``generation`` it reflects (-2 = never synced)."""

    generation: int
    vseqs: np.ndarray
    windows: np.ndarray
    matrix: np.ndarray
    alive: np.ndarray

    @staticmethod
    def empty(dim: int = 0) -> "IndexSnapshot":
        z = np.zeros(0, dtype=np.int64)
        return IndexSnapshot(-2, z, z, np.zeros((0, dim), dtype=np.float32), np.zeros(0, dtype=bool))

    @property
    def n(self) -> int:
        return int(self.vseqs.size)

    @property
    def top(self) -> int:
        """Largest vseq held (0 when empty)."""
        return int(self.vseqs[-1]) if self.vseqs.size else 0

    def positions(self, vseqs: Sequence[int] | np.ndarray) -> np.ndarray:
        """Positions of the given vseqs that this snapshot holds (others dropped)."""
        v = np.asarray(vseqs, dtype=np.int64)
        pos = np.searchsorted(self.vseqs, v)
        ok = (pos < self.vseqs.size) & (self.vseqs[np.minimum(pos, max(self.vseqs.size - 1, 0))] == v)
        return pos[ok] if self.vseqs.size else np.zeros(0, dtype=np.int64)


class VectorIndex:
    """The index of one (user, kind). ``stem`` = path prefix of its files, or None (memory only).

    Not thread-safe by itself: the store holds ``lock`` while syncing; searches read ``snapshot``
    (replaced whole, never mutated)."""

    def __init__(self, stem: Path | None, dim: int) -> None:
        self.stem, self.dim = stem, dim
        self.lock = threading.Lock()
        self.snapshot = IndexSnapshot.empty(dim)
        self.loaded = False
        self._file_lock: FileLock | None = None

    # ------------------------------------------------------------------ files
    def _path(self, ext: str) -> Path:
        assert self.stem is not None
        return self.stem.with_name(self.stem.name + ext)

    @contextmanager
    def _flock(self) -> Iterator[None]:
        """Hold the exclusive lock on ``<stem>.lock`` (across processes and this process's threads)."""
        path = str(self._path(".lock"))
        if self._file_lock is None or self._file_lock.lock_file != path:
            self._file_lock = FileLock(path, poll_interval=0.005)
        with self._file_lock:
            yield

    def _read_files(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(vseqs, windows, matrix) of the complete rows on disk; a torn tail is cut off."""
        rows_p, vec_p = self._path(".rows"), self._path(".f32")
        if not rows_p.exists() or not vec_p.exists() or self.dim <= 0:
            z = np.zeros(0, dtype=np.int64)
            return z, z, np.zeros((0, self.dim), dtype=np.float32)
        row_bytes, vec_bytes = 8 * _ROW_INTS, 4 * self.dim
        n = min(rows_p.stat().st_size // row_bytes, vec_p.stat().st_size // vec_bytes)
        rows = np.fromfile(rows_p, dtype=np.int64, count=n * _ROW_INTS).reshape(n, _ROW_INTS)
        # a plain ndarray view of the mapping: numpy's matmul on the memmap subclass is ~20x slower
        matrix = (np.asarray(np.memmap(vec_p, dtype=np.float32, mode="r", shape=(n, self.dim))) if n
                  else np.zeros((0, self.dim), dtype=np.float32))
        vseqs = rows[:, 0].copy()
        bad = np.flatnonzero(np.diff(vseqs) <= 0)
        if bad.size:  # two writers appended the same rows: keep the increasing prefix
            n = int(bad[0]) + 1
        return vseqs[:n], rows[:n, 1].copy(), matrix[:n]

    def load(self) -> None:
        """Map the files (no vector is read until a search touches it). Unreadable files → memory only."""
        self.loaded = True
        if self.stem is None:
            return
        try:
            with self._flock():
                vseqs, windows, matrix = self._read_files()
        except (OSError, ValueError) as exc:
            log.warning("search index %s unreadable (%s); rebuilding it from the database", self.stem, exc)
            self.discard()
            return
        self.snapshot = IndexSnapshot(-2, vseqs, windows, matrix, np.ones(vseqs.size, dtype=bool))

    def discard(self) -> None:
        """Forget the in-memory rows and delete the files (the next sync rebuilds from SQLite)."""
        self.snapshot = IndexSnapshot.empty(self.dim)
        if self.stem is not None:
            for ext in (".rows", ".f32"):
                self._path(ext).unlink(missing_ok=True)

    # ------------------------------------------------------------------ updates
    def append(self, vseqs: Sequence[int], windows: Sequence[int], blobs: Sequence[bytes]) -> None:
        """Add rows newer than the last held one (vseq ascending); rows of another size are skipped."""
        keep = [i for i, b in enumerate(blobs) if len(b) == 4 * self.dim and vseqs[i] > self.snapshot.top]
        if not keep:
            return
        v = np.asarray([vseqs[i] for i in keep], dtype=np.int64)
        w = np.asarray([windows[i] for i in keep], dtype=np.int64)
        m = np.frombuffer(b"".join(blobs[i] for i in keep), dtype=np.float32).reshape(len(keep), self.dim)
        if self.stem is not None:
            try:
                self._append_files(v, w, m)
                return
            except OSError as exc:
                log.warning("search index %s not writable (%s); keeping it in memory", self.stem, exc)
                self.stem = None
        s = self.snapshot
        self.snapshot = IndexSnapshot(s.generation, np.concatenate([s.vseqs, v]), np.concatenate([s.windows, w]),
                                      np.concatenate([np.asarray(s.matrix), m]),
                                      np.concatenate([s.alive, np.ones(v.size, dtype=bool)]))

    def _append_files(self, v: np.ndarray, w: np.ndarray, m: np.ndarray) -> None:
        """Under the file lock: cut a torn tail, append the rows the files lack, re-map."""
        with self._flock():
            vseqs, _, _ = self._read_files()
            rows_p, vec_p = self._path(".rows"), self._path(".f32")
            for p, size in ((rows_p, vseqs.size * 8 * _ROW_INTS), (vec_p, vseqs.size * 4 * self.dim)):
                if p.exists() and p.stat().st_size != size:
                    os.truncate(p, size)
            last = int(vseqs[-1]) if vseqs.size else 0
            new = v > last
            if new.any():
                with open(vec_p, "ab") as f:
                    f.write(np.ascontiguousarray(m[new], dtype=np.float32).tobytes())
                with open(rows_p, "ab") as f:
                    f.write(np.stack([v[new], w[new]], axis=1).astype(np.int64).tobytes())
            self._remap()

    def _remap(self) -> None:
        """Re-read the files, keeping what is known to be dead dead."""
        old = self.snapshot
        vseqs, windows, matrix = self._read_files()
        alive = np.ones(vseqs.size, dtype=bool)
        dead = old.vseqs[~old.alive]
        if dead.size:
            alive[np.isin(vseqs, dead)] = False
        self.snapshot = IndexSnapshot(old.generation, vseqs, windows, matrix, alive)

    def set_alive(self, live_vseqs: np.ndarray) -> None:
        """Mark exactly ``live_vseqs`` alive; compact the files when dead rows dominate."""
        s = self.snapshot
        alive = np.isin(s.vseqs, live_vseqs)
        self.snapshot = replace(s, alive=alive)
        dead = int(s.n - alive.sum())
        if dead > max(_COMPACT_MIN_DEAD, int(alive.sum())):
            self._compact()

    def _compact(self) -> None:
        s = self.snapshot
        keep = s.alive
        v, w, m = s.vseqs[keep], s.windows[keep], np.asarray(s.matrix[keep], dtype=np.float32)
        if self.stem is None:
            self.snapshot = IndexSnapshot(s.generation, v, w, m, np.ones(v.size, dtype=bool))
            return
        try:
            with self._flock():
                # .rows is emptied first: a crash between the two replaces leaves an empty index
                # (rebuilt from SQLite), never rows paired with another file's vectors.
                os.truncate(self._path(".rows"), 0)
                for ext, data in ((".f32", m), (".rows", np.stack([v, w], axis=1).astype(np.int64))):
                    tmp = self._path(ext + ".tmp")
                    tmp.write_bytes(np.ascontiguousarray(data).tobytes())
                    os.replace(tmp, self._path(ext))
                self._remap()
        except OSError as exc:
            log.warning("search index %s: compaction failed (%s); keeping it in memory", self.stem, exc)
            self.stem = None
            self.snapshot = IndexSnapshot(s.generation, v, w, m, np.ones(v.size, dtype=bool))

    def mark(self, generation: int) -> None:
        """Record the user generation the snapshot now reflects."""
        self.snapshot = replace(self.snapshot, generation=generation)
