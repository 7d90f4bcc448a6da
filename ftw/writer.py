"""FTWWriter: a state machine that lays out dense tensors and expert banks into shards.

    writer = FTWWriter(out_dir, max_shard_bytes=...)
    writer.add_tensor("model.embed_tokens.weight", "bf16", (V, H), chunks)
    with writer.expert_bank(layer=3, num_experts=E, parts=[("w13", "bf16", (2I, H)), ...]) as bank:
        for e in range(E):
            bank.write_expert(e, {"w13": buf, "w2": buf})
    index = writer.finish(family=..., config=..., source_config=...)

Steps out of order (a dense tensor inside a bank, experts out of order or missing, anything
after `finish`) raise WriterStateError. Memory use is whatever the caller passes in: the writer
never holds more than the sink's bounded queue.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .errors import WriterStateError
from .format import (
    ALIGNMENT,
    INDEX_FILENAME,
    PART_ALIGNMENT,
    SWIGLU,
    ExpertActivation,
    ExpertBank,
    ExpertPart,
    Index,
    ShardEntry,
    TensorEntry,
    align_up,
    nbytes_of,
    shard_filename,
)
from .sink import ShardSink

Buffer = bytes | bytearray | memoryview

DEFAULT_MAX_SHARD_BYTES = 4 << 30


def plan_expert_parts(parts: Iterable[tuple[str, str, tuple[int, ...]]]) -> tuple[tuple[ExpertPart, ...], int]:
    """Place parts inside one expert record; returns the parts and the record stride."""
    placed: list[ExpertPart] = []
    offset = 0
    for name, dtype, shape in parts:
        offset = align_up(offset, PART_ALIGNMENT)
        nbytes = nbytes_of(dtype, tuple(shape))
        placed.append(ExpertPart(name=name, dtype=dtype, shape=tuple(shape), offset=offset, nbytes=nbytes))
        offset += nbytes
    return tuple(placed), align_up(max(offset, 1), ALIGNMENT)


class BankWriter:
    """Writes the experts of one layer in order 0..E-1; obtained from FTWWriter.expert_bank."""

    def __init__(self, sink: ShardSink, bank: ExpertBank) -> None:
        self._sink = sink
        self.bank = bank
        self.next_expert = 0

    def write_expert(self, expert: int, parts: dict[str, Buffer | Sequence[Buffer]]) -> None:
        """Append expert `expert`; a part may be given as several buffers, concatenated."""
        if expert != self.next_expert:
            raise WriterStateError(
                f"layer {self.bank.layer}: expert {expert} written, expected expert {self.next_expert}"
            )
        if set(parts) != {p.name for p in self.bank.parts}:
            raise WriterStateError(
                f"layer {self.bank.layer} expert {expert}: parts {sorted(parts)} given, "
                f"expected {[p.name for p in self.bank.parts]}"
            )
        start = self.bank.offset + expert * self.bank.expert_stride
        for part in self.bank.parts:
            given = parts[part.name]
            pieces = [memoryview(b).cast("B") for b in (given if isinstance(given, (list, tuple)) else [given])]
            nbytes = sum(p.nbytes for p in pieces)
            if nbytes != part.nbytes:
                raise WriterStateError(
                    f"layer {self.bank.layer} expert {expert} part {part.name}: "
                    f"{nbytes} bytes given, {part.nbytes} expected for {part.dtype}{list(part.shape)}"
                )
            self._sink.pad_to(PART_ALIGNMENT)
            assert self._sink.size == start + part.offset
            for piece in pieces:
                self._sink.write(piece)
        self._sink.pad_to(ALIGNMENT)
        self.next_expert += 1


class FTWWriter:
    """Writes an FTW directory: shards `model-NNNNN.ftw` and the index `model.ftw.json`."""

    def __init__(self, out_dir: Path, *, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes = max_shard_bytes
        self._tensors: list[TensorEntry] = []
        self._banks: list[ExpertBank] = []
        self._shards: list[ShardEntry] = []
        self._names: set[str] = set()
        self._sink: ShardSink | None = None
        self._in_bank = False
        self._finished = False

    # -- state --------------------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._finished:
            raise WriterStateError(f"cannot {what}: the writer is finished")
        if self._in_bank:
            raise WriterStateError(f"cannot {what} while an expert bank is open")

    def _sink_for(self, nbytes: int) -> ShardSink:
        """The shard to append `nbytes` to, rolling to a new shard when this one is full."""
        if self._sink is not None and self._sink.size > 0 and self._sink.size + nbytes > self.max_shard_bytes:
            self._close_shard()
        if self._sink is None:
            name = shard_filename(len(self._shards) + 1)
            self._sink = ShardSink(self.out_dir / name)
        self._sink.pad_to(ALIGNMENT)
        return self._sink

    def _close_shard(self) -> None:
        assert self._sink is not None
        sink, self._sink = self._sink, None
        sink.pad_to(ALIGNMENT)
        size = sink.size
        self._shards.append(ShardEntry(name=sink.path.name, size=size, sha256=sink.close()))

    def _claim_name(self, name: str) -> None:
        if name in self._names:
            raise WriterStateError(f"tensor {name!r} written twice")
        self._names.add(name)

    # -- steps --------------------------------------------------------------------------------

    def add_tensor(self, name: str, dtype: str, shape: tuple[int, ...], chunks: Iterable[Buffer]) -> TensorEntry:
        """Append one dense tensor whose bytes arrive as `chunks` (C order, little endian)."""
        self._check_open(f"add tensor {name!r}")
        self._claim_name(name)
        nbytes = nbytes_of(dtype, tuple(shape))
        sink = self._sink_for(nbytes)
        entry = TensorEntry(name=name, dtype=dtype, shape=tuple(shape), shard=sink.path.name, offset=sink.size, nbytes=nbytes)
        for chunk in chunks:
            sink.write(chunk)
        if sink.size - entry.offset != nbytes:
            raise WriterStateError(f"tensor {name!r}: {sink.size - entry.offset} bytes given, {nbytes} expected")
        self._tensors.append(entry)
        return entry

    @contextmanager
    def expert_bank(
        self,
        layer: int,
        num_experts: int,
        parts: Iterable[tuple[str, str, tuple[int, ...]]],
        quant: dict[str, Any] | None = None,
        activation: ExpertActivation = SWIGLU,
    ) -> Iterator[BankWriter]:
        """Open the bank of `layer`; every expert must be written, in order, before it closes."""
        self._check_open(f"open the expert bank of layer {layer}")
        self._claim_name(f"<bank {layer}>")
        placed, stride = plan_expert_parts(parts)
        sink = self._sink_for(num_experts * stride)
        bank = ExpertBank(
            layer=layer, num_experts=num_experts, expert_stride=stride, shard=sink.path.name,
            offset=sink.size, parts=placed, quant=dict(quant or {}), activation=activation,
        )
        writer = BankWriter(sink, bank)
        self._in_bank = True
        try:
            yield writer
        finally:
            self._in_bank = False
        if writer.next_expert != num_experts:
            raise WriterStateError(f"layer {layer}: bank closed after {writer.next_expert} of {num_experts} experts")
        self._banks.append(bank)

    def finish(
        self,
        *,
        family: str,
        config: dict[str, Any],
        source_config: dict[str, Any],
        metadata: dict[str, Any] | None = None,
    ) -> Index:
        """Close the last shard and write the index atomically; returns the index."""
        self._check_open("finish")
        if self._sink is not None:
            self._close_shard()
        self._finished = True
        index = Index(
            family=family, config=config, source_config=source_config, metadata=dict(metadata or {}),
            tensors=tuple(self._tensors), banks=tuple(self._banks), shards=tuple(self._shards),
        )
        path = self.out_dir / INDEX_FILENAME
        tmp = path.with_suffix(".json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(index.to_json())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return index

    def abort(self) -> None:
        """Stop after a failure: close the open shard without finishing (caller removes the dir)."""
        if self._sink is not None:
            self._sink.abort()
            self._sink = None
        self._finished = True
