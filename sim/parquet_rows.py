"""``row_group_rows``: the row count of each row group of a Parquet file, from its footer.

Why: the run directory's writer needs the row groups polars would make (sim/output.py), read
off a small file polars writes; reading them here takes ~60 lines instead of importing
pyarrow.parquet (~0.1 s of start-up that a synthetic run otherwise never pays).

Format (Apache Parquet, parquet.thrift): the file ends with the footer, its 4-byte little-
endian length and ``PAR1``. The footer is a ``FileMetaData`` struct in Thrift's compact
protocol: field 4 is ``list<RowGroup>``, and a ``RowGroup``'s field 3 its ``num_rows`` (i64).
Compact protocol (Thrift's TCompactProtocol spec): a field header byte holds the id delta
(high nibble; 0: a zigzag varint id follows) and the type (low nibble; 0 ends the struct);
integers are zigzag varints; a list header byte holds the size (high nibble; 15: a varint
size follows) and the element type.
"""

from __future__ import annotations

_BOOL_TRUE, _BOOL_FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if b < 0x80:
                return out
            shift += 7

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def list_header(self) -> tuple[int, int]:
        b = self.byte()
        size = b >> 4
        return (self.varint() if size == 15 else size), b & 0x0F

    def fields(self):
        """(field id, type) of each field of a struct, up to its end; the caller reads or
        skips each value before asking for the next."""
        last = 0
        while True:
            b = self.byte()
            if b == 0:
                return
            delta, kind = b >> 4, b & 0x0F
            last = last + delta if delta else self.zigzag()
            yield last, kind

    def skip(self, kind: int) -> None:
        if kind in (_BOOL_TRUE, _BOOL_FALSE):
            return
        if kind == _BYTE:
            self.pos += 1
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.pos += 8
        elif kind == _BINARY:
            length = self.varint()  # read first: ``self.pos += self.varint()`` would add to the old pos
            self.pos += length
        elif kind in (_LIST, _SET):
            size, elem = self.list_header()
            for _ in range(size):
                if elem in (_BOOL_TRUE, _BOOL_FALSE):  # a bool in a list: one byte
                    self.pos += 1
                else:
                    self.skip(elem)
        elif kind == _MAP:
            size = self.varint()
            if size:
                kv = self.byte()
                for _ in range(size):
                    self.skip(kv >> 4)
                    self.skip(kv & 0x0F)
        elif kind == _STRUCT:
            for _, k in self.fields():
                self.skip(k)
        else:
            raise ValueError(f"Parquet footer: unknown Thrift compact type {kind}")


def row_group_rows(data: bytes) -> list[int]:
    """The ``num_rows`` of each row group of the Parquet file ``data`` (its bytes)."""
    if data[-4:] != b"PAR1":
        raise ValueError("not a Parquet file")
    size = int.from_bytes(data[-8:-4], "little")
    r = _Reader(data[-8 - size:-8])
    out: list[int] = []
    for fid, kind in r.fields():
        if fid == 4 and kind == _LIST:
            n, elem = r.list_header()
            if elem != _STRUCT:
                raise ValueError("Parquet footer: row groups are not a list of structs")
            for _ in range(n):
                rows = None
                for gid, gkind in r.fields():
                    if gid == 3 and gkind == _I64:
                        rows = r.zigzag()
                    else:
                        r.skip(gkind)
                if rows is None:
                    raise ValueError("Parquet footer: a row group without num_rows")
                out.append(rows)
        else:
            r.skip(kind)
    return out
