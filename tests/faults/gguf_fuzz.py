"""The GGUF header fuzz's cases, run in a child process (`python -m tests.faults.gguf_fuzz MODEL
FIRST COUNT DIR`) under a data limit of `LIMIT_BYTES`, which prints one JSON object: each
outcome's count, the cases that raised anything but a `ZincError`, and the child's peak RSS.

A case is seeded: single-byte flips, multi-byte flips, one byte of a structural field (a count,
length, type, dimension or offset) flipped, such a field set to a hostile value, or a truncation
(of the header, or of the file in its tensor data). The mutated header goes into a sparse file of
the model's size, and `open_gguf` plus `describe` must give a valid model or one `ZincError`.
"""

from __future__ import annotations

import collections
import json
import mmap
import random
import re
import resource
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

from zinc.errors import ZincError
from zinc.model.gguf_file import open_gguf
from zinc.model.gguf_header import read_header
from zinc.model.hparams import describe

LIMIT_BYTES = 1 << 30  # RLIMIT_DATA: a case that tries to allocate more fails with MemoryError
HOSTILE_U64 = (2**64 - 1, 2**63, 2**63 - 1, 2**32, 2**32 - 1, 1 << 40, 0)
KINDS = ("flip", "flips", "field", "hostile", "truncate")
_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass(frozen=True)
class Model:
    header: bytes  # [0, data_offset)
    size: int  # the whole file's
    fields: list[tuple[int, int]]  # (offset, width) of every count, length, type, dimension and offset
    table: list[tuple[int, int]]  # those of the tensor table


def load(path: Path) -> Model:
    data_offset = read_header(path).data_offset
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        header = bytes(buf[:data_offset])
    fields = structural_fields(header)
    table_at = len(header) - sum(len(t.name) + 24 + 8 * len(t.ne) for t in read_header(path).tensors) - 32
    return Model(header, path.stat().st_size, fields, [f for f in fields if f[0] >= table_at])


def structural_fields(buf: bytes) -> list[tuple[int, int]]:
    """Where a sound header's structure lies: a walk of its own, so that the fuzz does not rely
    on the reader under test to find its targets."""
    fields: list[tuple[int, int]] = [(8, 8), (16, 8)]
    pos = 24

    def u(width: int) -> int:
        nonlocal pos
        fields.append((pos, width))
        value = int.from_bytes(buf[pos : pos + width], "little")
        pos += width
        return value

    def skip(n: int) -> None:
        nonlocal pos
        pos += n

    def skip_value(vtype: int) -> None:
        if vtype == 8:
            skip(u(8))
        elif vtype == 9:
            etype, count = u(4), u(8)
            if etype in _SCALAR_SIZES:
                skip(count * _SCALAR_SIZES[etype])
            else:
                for _ in range(count):
                    skip_value(etype)
        else:
            skip(_SCALAR_SIZES[vtype])

    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    for _ in range(n_kv):
        skip(u(8))
        skip_value(u(4))
    for _ in range(n_tensors):
        skip(u(8))
        for _ in range(u(4)):
            u(8)
        u(4), u(8)
    return fields


def mutate(m: Model, seed: int) -> tuple[str, bytes, int]:
    """Case `seed`: its kind, the bytes to write and the file's size."""
    rng = random.Random(seed)
    data = bytearray(m.header)
    kind = KINDS[seed % len(KINDS)]
    if kind == "flip":  # one byte, anywhere in the header
        data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    elif kind == "flips":  # 2-16 bytes, anywhere
        for _ in range(rng.randint(2, 16)):
            data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    elif kind == "field":  # one byte of a structural field (half the time, of the tensor table)
        at, width = rng.choice(m.table if rng.random() < 0.5 else m.fields)
        data[at + rng.randrange(width)] ^= rng.randrange(1, 256)
    elif kind == "hostile":  # a structural field set to an extreme value
        at, width = rng.choice(m.table if rng.random() < 0.5 else m.fields)
        value = rng.choice(HOSTILE_U64) % (1 << (8 * width))
        data[at : at + width] = value.to_bytes(width, "little")
    else:  # the file cut short: in its header, or in its tensor data
        cut = rng.randrange(len(data)) if rng.random() < 0.7 else rng.randrange(len(data), m.size)
        return kind, bytes(data[:cut]), cut
    return kind, bytes(data), m.size


def outcome(message: str, path: Path) -> str:
    """An error message without its file name, numbers and quoted names: the kind of error."""
    detail = message.removeprefix(f"{path}: ").removeprefix("damaged or truncated GGUF header (")
    detail = re.sub(r"'[^']*'|\b(tensor|key) \S+", r"\1 X", detail)
    detail = re.sub(r"[^\x20-\x7e]+", "?", detail.rstrip(")"))  # a damaged name's bytes
    return " ".join(re.sub(r"\d+", "N", detail).split()[:5])


def run_case(m: Model, seed: int, directory: Path) -> tuple[str, str | None]:
    """(kind: outcome, None), or (kind, the exception) when it is not a ZincError."""
    kind, data, size = mutate(m, seed)
    path = directory / f"case-{seed}.gguf"  # a new name each time: open_gguf caches by path and mtime
    with path.open("wb") as f:
        f.write(data[:size])
        f.truncate(size)  # sparse: the tensor data reads as zeros
    try:
        describe(open_gguf(path))
        return f"{kind}: valid", None
    except ZincError as exc:
        return f"{kind}: {outcome(exc.message, path)}", None
    except BaseException as exc:  # the failures the fuzz looks for, MemoryError included
        return f"{kind}: CRASH", f"case {seed} ({kind}): {type(exc).__name__}: {exc}"[:500]
    finally:
        path.unlink()


def main(argv: list[str]) -> None:
    model_path, first, count, directory = Path(argv[0]), int(argv[1]), int(argv[2]), Path(argv[3])
    m = load(model_path)
    resource.setrlimit(resource.RLIMIT_DATA, (LIMIT_BYTES, LIMIT_BYTES))
    outcomes: collections.Counter[str] = collections.Counter()
    crashes = []
    for seed in range(first, first + count):
        label, crash = run_case(m, seed, directory)
        outcomes[label] += 1
        if crash is not None:
            crashes.append(crash)
    print(json.dumps({"outcomes": outcomes, "crashes": crashes, "peak_rss_bytes": peak_rss_bytes()}))


def peak_rss_bytes() -> int:
    """This process's own peak RSS (VmHWM). Not `ru_maxrss`: Linux carries the peak of the memory
    a process replaced at exec into it, and a child spawned with vfork replaced its parent's, so
    under a test run holding 1.2 GB it read 1.2 GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


if __name__ == "__main__":
    main(sys.argv[1:])
