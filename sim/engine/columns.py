"""``ColumnBuffer``: rows appended as tuples, kept as numpy columns, spilled to disk as they fill.

Why: the simulation produces millions of small records (step rows, finished requests); as
tuples of Python numbers each costs 300-800 bytes, as columns 8 bytes a field. Each row's
numbers are written as it is appended (``struct.pack_into`` into a block of ``block_rows``
rows: float64, or int64 for an integer column), while the tuple is still in the CPU's cache; a
full block is split into per-column chunks.

Memory stays flat in the row count (issue 14: 10M requests with bounded memory): once a
buffer has packed a block, every packed block is appended to one raw file per column (native
float64 / int64 bytes). The files are anonymous temporary files under ``$TMPDIR``
(``tempfile.TemporaryFile``: on Linux opened with O_TMPFILE, elsewhere on POSIX unlinked as
soon as created), so they have no name to leave behind: the kernel frees their space when the
process ends, even when it is killed with SIGKILL or runs out of memory. Readers take one
column at a time (``column``) or a slice of rows (``read``), so nothing needs all columns in
memory at once. A buffer that never filled a block (a small run) never touches disk.
"""

from __future__ import annotations

import struct
import tempfile

import numpy as np


# Rows packed (and spilled) at a time, unless a buffer is given its own: 8 bytes a field
# meanwhile (step rows: 3 MB), as once packed.
BLOCK_ROWS = 1 << 15


def converted_row(row, width: int, is_int: list[bool] | None = None) -> list:
    """The numbers of a row that ``struct`` refused (``struct.error``): as numpy converts them
    (``np.array(rows, dtype=np.float64)``: None is NaN, a numeric string its number); in an
    integer column an int within int64 as it is (as ``struct`` packs it), anything else that
    float64 cast to int64 (as ``astype(np.int64)`` casts it). A row of another length is
    refused with ValueError, as numpy refuses it."""
    converted = np.array(row, dtype=np.float64)
    if converted.shape != (width,):
        raise ValueError(f"a row of {len(row)} values where {width} are expected: {row!r}")
    if is_int is None or not any(is_int):
        return converted.tolist()
    with np.errstate(invalid="ignore"):  # NaN or out of range: what astype gives, as a column's cast would
        cast = converted.astype(np.int64).tolist()
    out = converted.tolist()
    for i, integer in enumerate(is_int):
        if integer:
            v = row[i]
            out[i] = int(v) if isinstance(v, (int, np.integer)) and _INT64_MIN <= v <= _INT64_MAX else cast[i]
    return out


_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _row_format(is_int: list[bool]) -> str:
    """``struct``'s format of a row: native int64 (``q``) for an integer column, float64 (``d``)
    for the others. Native (``@``), not standard (``=``): a float is copied as it is (standard
    packing re-encodes it) and an int is read with ``PyLong_AsLongLong`` (as ``d``, an int became
    a new float object first); every field is 8 bytes, so no padding."""
    return "@" + "".join("q" if integer else "d" for integer in is_int)


class RowBlock:
    """Rows of ``width`` numbers, each written as native float64 (int64 in an integer column)
    as it is appended (``struct.pack_into`` into one block of ``block_rows`` rows: ~0.3 us a row
    of 12 numbers, where ``array('d').extend`` took ~0.75 us and packing 32k tuples at a time
    with ``np.fromiter`` ~1 us, the tuples no longer in the cache by then). An integer column
    holds a Python int exactly (within int64); anything else is converted as numpy converts it
    (``converted_row``). When the block fills, ``full`` (a subclass's) takes its rows (``take``,
    ``take_columns``) before the next row is written over them. The block's room is made at the
    first row: a buffer given only whole blocks never needs it."""

    def __init__(self, width: int, block_rows: int, is_int: list[bool] | None = None):
        self.block_rows = block_rows
        self._width = width
        self._is_int = list(is_int) if is_int is not None else [False] * width
        assert len(self._is_int) == width
        row = struct.Struct(_row_format(self._is_int))
        assert row.size == 8 * width
        self._pack_into, self._row_bytes = row.pack_into, row.size
        self._data = bytearray()
        self._rows = 0  # rows written since the last ``take``

    def append(self, row: tuple) -> None:
        """One row of ``width`` numbers (None: NaN), copied now."""
        n = self._rows
        try:
            self._pack_into(self._data, n * self._row_bytes, *row)
        except struct.error:  # no room yet (the first row); None, a numeric string, a float in an integer column, a row of another length
            self._append_slow(n, row)
        self._rows = n + 1
        if n + 1 >= self.block_rows:
            self.full()

    def _append_slow(self, n: int, row: tuple) -> None:
        if not self._data:
            self._data = bytearray(self.block_rows * self._row_bytes)
        try:
            self._pack_into(self._data, n * self._row_bytes, *row)
        except struct.error:  # None, a numeric string, a float in an integer column, or a row of another length
            self._pack_into(self._data, n * self._row_bytes, *converted_row(row, self._width, self._is_int))

    def take_columns(self) -> list[np.ndarray]:
        """The rows written since the last take, one view per column (int64 for an integer
        column, else float64) into the block: read (or copied) before the next ``append``
        writes over them."""
        rows, self._rows = self._rows, 0
        count = rows * self._width
        floats = np.frombuffer(self._data, dtype=np.float64, count=count).reshape(rows, self._width)
        ints = np.frombuffer(self._data, dtype=np.int64, count=count).reshape(rows, self._width)
        return [(ints if integer else floats)[:, i] for i, integer in enumerate(self._is_int)]

    def take(self) -> np.ndarray:
        """The rows written since the last take as one (rows x width) float64 array (integer
        columns converted): a view of the block without integer columns, to be read (or copied)
        before the next ``append`` writes over it."""
        if not any(self._is_int):
            rows, self._rows = self._rows, 0
            return np.frombuffer(self._data, dtype=np.float64, count=rows * self._width).reshape(rows, self._width)
        return np.column_stack(self.take_columns()).astype(np.float64, copy=False)

    def full(self) -> None:
        """The block is full: take its rows."""
        raise NotImplementedError


class ColumnBuffer(RowBlock):
    def __init__(self, names: tuple[str, ...], int_names=frozenset(), block_rows: int | None = None):
        super().__init__(len(names), block_rows or BLOCK_ROWS, [n in int_names for n in names])
        self.names = names
        self._chunks: list[list[np.ndarray]] = [[] for _ in names]   # packed, not spilled
        self._packed = 0
        self._spilled = 0                     # rows in the column files
        self._files: list | None = None       # one anonymous file per column, once spilled

    def __len__(self) -> int:
        return self._packed + self._rows

    def dtype(self, name: str):
        return np.int64 if self._is_int[self.names.index(name)] else np.float64

    def full(self) -> None:
        self.pack()

    def pack(self) -> None:
        if self._rows:
            self._add_columns([col.copy() for col in self.take_columns()])

    def add_block(self, block: np.ndarray) -> None:
        """Rows given as one float64 array (rows x names), after those appended before."""
        self._add_columns([block[:, i].astype(np.int64) if integer else block[:, i].copy()
                           for i, integer in enumerate(self._is_int)])

    def _add_columns(self, columns: list[np.ndarray]) -> None:
        """Rows given as one array per column, of the column's dtype, owned here from now on."""
        for chunks, col in zip(self._chunks, columns):
            chunks.append(col)
        self._packed += len(columns[0])
        if self._packed - self._spilled >= self.block_rows:
            self._spill()

    def _spill(self) -> None:
        """Append the packed chunks to the column files (created on the first spill)."""
        try:
            if self._files is None:
                self._files = [tempfile.TemporaryFile(prefix="simsrv-columns-") for _ in self.names]
            for f, chunks in zip(self._files, self._chunks):
                f.seek(0, 2)  # appended at the end (a read may have moved the position)
                for c in chunks:
                    f.write(c.data)
                f.flush()
                chunks.clear()
        except OSError as e:  # a full disk: the file has no name, and the message may not say why
            raise OSError(e.errno, f"cannot keep the run's results and step rows here ({e.strerror or e}; "
                                   f"a full disk? set TMPDIR to a directory with room)", tempfile.gettempdir()) from e
        self._spilled = self._packed

    def finish(self) -> None:
        """Pack what is left; on disk if anything is (every row then in the files)."""
        self.pack()
        if self._files is not None and self._packed > self._spilled:
            self._spill()

    def read(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows [start, stop) of one column (a fresh array), after ``finish``."""
        stop = self._packed if stop is None else min(stop, self._packed)
        dtype = self.dtype(name)
        if stop <= start:
            return np.zeros(0, dtype)
        if self._files is not None:
            out = np.empty(stop - start, dtype)
            f = self._files[self.names.index(name)]
            f.seek(start * 8)
            if f.readinto(memoryview(out).cast("B")) != out.nbytes:
                raise OSError(f"simsrv's column file for {name} is shorter than the {stop} rows written")
            return out
        chunks = self._chunks[self.names.index(name)]
        if len(chunks) != 1:  # join once; later reads slice the one array
            chunks[:] = [np.concatenate(chunks)]
        return chunks[0][start:stop].copy()

    def column(self, name: str) -> np.ndarray:
        """One whole column (packing what is left first)."""
        self.finish()
        return self.read(name)

    def columns(self, order_by: str | None = None) -> dict[str, np.ndarray]:
        """{name: array}, every column whole in memory; with ``order_by``, rows sorted by that
        column (stable)."""
        cols = {n: self.column(n) for n in self.names}
        if order_by is not None:
            key = cols[order_by]
            if len(key) and (np.diff(key) < 0).any():
                order = np.argsort(key, kind="stable")
                cols = {n: c[order] for n, c in cols.items()}
        return cols
