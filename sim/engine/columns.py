"""``ColumnBuffer``: rows appended as tuples, kept as numpy columns.

Why: the simulation produces millions of small records (step rows, finished requests); as
tuples of Python numbers each costs 300-800 bytes, as columns 8 bytes a field. Appending a
tuple stays the cheapest thing a hot loop can do: every ``block_rows`` rows the tuples are
packed into one float64 array (integer fields are exact there, below 2**53) and split into
per-column chunks; ``columns()`` joins each column's chunks, one column at a time.
"""

from __future__ import annotations

import numpy as np


class ColumnBuffer:
    def __init__(self, names: tuple[str, ...], int_names=frozenset(), block_rows: int = 1 << 15):
        self.names = names
        self._is_int = [n in int_names for n in names]
        self.block_rows = block_rows
        self.rows: list[tuple] = []           # appended since the last pack
        self._chunks: list[list[np.ndarray]] = [[] for _ in names]
        self._packed = 0

    def __len__(self) -> int:
        return self._packed + len(self.rows)

    def append(self, row: tuple) -> None:
        rows = self.rows
        rows.append(row)
        if len(rows) >= self.block_rows:
            self.pack()

    def pack(self) -> None:
        if not self.rows:
            return
        block = np.array(self.rows, dtype=np.float64).reshape(-1, len(self.names))
        for i, chunks in enumerate(self._chunks):
            col = block[:, i]
            chunks.append(col.astype(np.int64) if self._is_int[i] else col.copy())
        self._packed += len(block)
        self.rows = []

    def columns(self, order_by: str | None = None) -> dict[str, np.ndarray]:
        """{name: array}; with ``order_by``, rows sorted by that column (stable). The joined
        columns replace the chunks (a second call costs nothing more)."""
        self.pack()
        for i, chunks in enumerate(self._chunks):
            if len(chunks) != 1:
                dtype = np.int64 if self._is_int[i] else np.float64
                self._chunks[i] = [np.concatenate(chunks) if chunks else np.zeros(0, dtype)]
        if order_by is not None:
            key = self._chunks[self.names.index(order_by)][0]
            if len(key) and (np.diff(key) < 0).any():
                order = np.argsort(key, kind="stable")
                for chunks in self._chunks:
                    chunks[0] = chunks[0][order]
        return {n: chunks[0] for n, chunks in zip(self.names, self._chunks)}
