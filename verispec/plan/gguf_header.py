"""Read a GGUF file's header: metadata scalars and tensor sizes, without the tokenizer.

``gguf.GGUFReader`` builds a numpy view of every metadata element, including the
~150,000 tokenizer strings and merges of a Qwen model, which takes tens of seconds;
the planner needs a few integers and the size of each tensor. This reader walks the
header with ``struct`` over a memory map, skipping arrays it does not keep, and takes
the value-type codes and the block sizes of the quantisation types from the ``gguf``
package (``GGUFValueType``, ``GGML_QUANT_SIZES``).

Format (GGUF v2/v3, little-endian; ggml's docs/gguf.md): magic ``GGUF``, version u32,
tensor count u64, metadata count u64; each metadata entry is a string key, a u32
value type and the value (strings: u64 length + bytes; arrays: u32 element type, u64
count, elements); each tensor entry is a string name, u32 dimension count, u64 dims,
u32 ggml type, u64 offset.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from typing import Any

__all__ = ["read_gguf_header"]

_MAX_KEPT_ARRAY = 1024   # arrays longer than this (tokenizer vocabularies) are skipped


def read_gguf_header(path: str | os.PathLike) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    """Metadata and tensors of a GGUF file.

    Returns:
        (fields, tensors): ``fields`` maps each metadata key to its value (numbers,
        strings, short lists; a skipped long array maps to its length as
        ``("array", n)``); ``tensors`` lists (name, elements, bytes) per tensor.

    Raises:
        ValueError: if the file is not GGUF v2/v3, is truncated, or has an unknown
            value type or tensor type.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

    scalar = {
        GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
        GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
        GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
        GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
    }
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:   # empty file
            raise ValueError(f"not a GGUF file ({e})") from e
    try:
        if buf[:4] != b"GGUF":
            raise ValueError("not a GGUF file (bad magic)")
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version}")
        pos = 24

        def read(fmt: str) -> Any:
            nonlocal pos
            value = struct.unpack_from(fmt, buf, pos)[0]
            pos += struct.calcsize(fmt)
            return value

        def read_str() -> str:
            nonlocal pos
            n = read("<Q")
            text = bytes(buf[pos:pos + n]).decode("utf-8", errors="replace")
            pos += n
            return text

        def read_value(vtype: int) -> Any:
            nonlocal pos
            vtype = GGUFValueType(vtype)
            if vtype in scalar:
                return read(scalar[vtype])
            if vtype == GGUFValueType.STRING:
                return read_str()
            if vtype == GGUFValueType.ARRAY:
                etype, count = GGUFValueType(read("<I")), read("<Q")
                if count <= _MAX_KEPT_ARRAY:
                    return [read_value(etype) for _ in range(count)]
                if etype in scalar:
                    pos += count * struct.calcsize(scalar[etype])
                else:
                    for _ in range(count):
                        read_value(etype)
                return ("array", count)
            raise ValueError(f"unknown GGUF value type {vtype}")

        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = read_str()
            fields[key] = read_value(read("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = read_str()
            dims = [read("<Q") for _ in range(read("<I"))]
            ttype = GGMLQuantizationType(read("<I"))
            read("<Q")   # data offset
            elements = math.prod(dims)
            block, size = GGML_QUANT_SIZES[ttype]
            tensors.append((name, elements, elements // block * size))
        return fields, tensors
    except (struct.error, KeyError) as e:
        raise ValueError(f"truncated or malformed GGUF header ({e})") from e
    finally:
        buf.close()
