"""Sequences' states in host memory as fixed-size blocks of tokens found by prefix, as vLLM's and
SGLang's prefix caches find theirs: any request takes back the longest stored prefix of its prompt,
whichever conversation stored it, and a prefix many conversations share (a coding agent's system
prompt and tools, its subagents') is stored once.

Each block holds the positional caches' rows of BLOCK_TOKENS positions (state_copy.ParkedPart) and
is keyed by a hash chain: the hash of its parent's key and its own token ids, so one key names the
whole prefix up to the block's end. Keys are compared and so are the tokens and the parent, so a
hash collision costs a miss, never another prefix's state.

The last block of a stored sequence may be partial: a leaf, which never gets children (the block
after it starts at a multiple of BLOCK_TOKENS in another chain). It lets a conversation's whole
history be kept, not all but its last up to 255 tokens, and it is where a recurrent model's state
saved at any length can sit; it costs a copy of fewer than BLOCK_TOKENS rows beside the full block
that later holds them, and a full sibling that covers a partial leaf without a saved state
replaces it. A lookup may use a block's first rows only (its tokens compared one by one), so a
prompt takes back every stored token it shares, not only whole blocks.

A recurrent model's state (StateCheckpoint: one summary of every token so far) is stored on the
block at whose end it was saved, and such a model resumes only at a block that has one.

Eviction is LRU by block within a byte budget: only leaves go, so a parent never goes before its
children; a lookup touches the chain it uses, and a parent is touched with its children, so it is
never older than them. The budget, and when to store or take back, are the caller's
(server/session_pool.py): this module holds blocks and copies nothing itself.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from .state import StateCheckpoint
from .state_copy import ParkedPart, ParkedState, checkpoint_bytes

# Tokens a block: large enough that a block's rows are one sizeable copy a tensor (Qwen3-30B-A3B's
# KV: 24 MiB a block) and a long context a few hundred Python objects (a 64k context: 256 blocks),
# small enough that a prefix shared up to a block's middle still has most of its rows found (a
# lookup uses a block's first rows) and a partial leaf duplicates little. vLLM's GPU blocks are
# 16 tokens, for paged attention's gather; these are only copied whole to and from the device.
BLOCK_TOKENS = 256

Copy = Callable[[list[tuple[int, int]]], list[ParkedPart] | None]  # rows of these spans, or None


def chain_key(parent_key: int, tokens: tuple[int, ...]) -> int:
    """The key of a block of `tokens` after the block keyed `parent_key` (0: the first block)."""
    return hash((parent_key, tokens))


@dataclass(eq=False)
class Block:
    """`tokens` at positions [start, start + len(tokens)) after `parent`'s, and their rows."""

    key: int
    parent: Block | None
    start: int
    tokens: tuple[int, ...]
    part: ParkedPart
    saved: StateCheckpoint | None = None  # a recurrent model's state at `end`
    children: dict[int, Block] = field(default_factory=dict)
    used: int = 0  # the store's clock when last stored or looked up

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    @property
    def nbytes(self) -> int:
        return self.part.nbytes + checkpoint_bytes(self.saved)


@dataclass(frozen=True)
class Found:
    """A lookup's answer: the longest stored prefix, `length` tokens, in `blocks` (the last one's
    first rows only where it ends after `length`), and a recurrent model's state saved at `length`."""

    length: int
    blocks: tuple[Block, ...]
    saved: StateCheckpoint | None

    def tokens(self) -> list[int]:
        return [t for b in self.blocks for t in b.tokens][: self.length]

    def state(self) -> ParkedState:
        """The prefix as a parked state (DecoderModel.unpark puts it back): the blocks' rows, the
        last one's cut to `length` (views, nothing copied)."""
        parts = [b.part for b in self.blocks]
        last = self.blocks[-1]
        if last.end > self.length:
            cut = self.length - last.start
            parts[-1] = ParkedPart(last.start, tuple(r[:cut] for r in last.part.rows))
        return ParkedState(self.length, tuple(parts), self.saved)


class BlockStore:
    """Blocks of tokens' states in host memory, found by prefix (the module's docstring)."""

    def __init__(self, block_tokens: int = BLOCK_TOKENS) -> None:
        if block_tokens < 1:
            raise ValueError(f"a block holds at least one token, not {block_tokens}")
        self.block_tokens = block_tokens
        self.blocks: dict[int, Block] = {}
        self.roots: dict[int, Block] = {}  # the first blocks, by key
        self.nbytes = 0
        self.hits = 0  # lookups that found a stored prefix (`hit`)
        self.hit_tokens = 0  # ... and the tokens they took back
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        return len(self.blocks)

    def insert(self, tokens: list[int], copy: Copy, saved: StateCheckpoint | None = None) -> bool:
        """`tokens`' state stored: the blocks stored already are shared (touched), the others' rows
        copied (`copy`, one call for all their spans) and added; a recurrent model's `saved`
        (at len(tokens)) put on the last block. False, nothing added, where `copy` cannot copy or
        a block is kept from it by a hash collision."""
        parent, start = None, 0
        while start < len(tokens):  # the blocks stored already
            piece = tuple(tokens[start: start + self.block_tokens])
            block = self.blocks.get(chain_key(parent.key if parent else 0, piece))
            if block is None:
                break
            if block.tokens != piece or block.parent is not parent:
                return False  # a collision: another prefix has this key
            parent, start = block, block.end
        siblings = parent.children if parent else self.roots
        piece = tuple(tokens[start:])
        cover = next((b for b in siblings.values() if b.tokens[: len(piece)] == piece), None) \
            if saved is None and 0 < len(piece) < self.block_tokens else None
        if cover is not None:
            start = len(tokens)  # a partial last block whose rows a stored one holds: nothing to add
        spans, keys, key = [], [], parent.key if parent else 0
        for at in range(start, len(tokens), self.block_tokens):
            piece = tuple(tokens[at: at + self.block_tokens])
            key = chain_key(key, piece)
            if key in self.blocks:
                return False  # a collision
            spans.append((at, at + len(piece)))
            keys.append(key)
        parts = copy(spans) if spans else []
        if parts is None:
            return False
        tick = next(self._clock)
        for block in self._chain(cover or parent):
            block.used = tick
        for key, (at, end), part in zip(keys, spans, parts, strict=True):
            parent = Block(key, parent, at, tuple(tokens[at:end]), part, used=tick)
            self._add(parent)
        if saved is not None and parent is not None and saved.length == parent.end and parent.saved is None:
            parent.saved = saved
            self.nbytes += parent.nbytes - parent.part.nbytes
        return True

    def _add(self, block: Block) -> None:
        siblings = block.parent.children if block.parent else self.roots
        for other in list(siblings.values()):  # a partial leaf this block covers, saving nothing, goes
            if len(other.tokens) < len(block.tokens) and other.saved is None and not other.children \
                    and block.tokens[: len(other.tokens)] == other.tokens:
                self._remove(other)
        siblings[block.key] = block
        self.blocks[block.key] = block
        self.nbytes += block.nbytes

    def lookup(self, prompt: list[int], rewinds: bool) -> Found | None:
        """The longest stored prefix of `prompt` (at most all but its last token, whose logits start
        the reply); a recurrent model's (`rewinds` False) only to a block with its state saved.
        None where none. Touches the blocks it uses."""
        limit = len(prompt) - 1
        path: list[Block] = []
        start, siblings, parent_key = 0, self.roots, 0
        while start < limit:
            piece = tuple(prompt[start: start + self.block_tokens])
            block = self.blocks.get(chain_key(parent_key, piece))
            if block is None or block.tokens != piece or block.parent is not (path[-1] if path else None):
                break
            path.append(block)
            start, siblings, parent_key = block.end, block.children, block.key
        if rewinds:
            length = min(path[-1].end, limit) if path else 0
            partial = max(siblings.values(), key=lambda b: _shared(b.tokens, prompt[start:limit]), default=None) \
                if start < limit else None
            if partial is not None and start + _shared(partial.tokens, prompt[start:limit]) > length:
                path.append(partial)
                length = start + _shared(partial.tokens, prompt[start:limit])
            path = [b for b in path if b.start < length]
            found = Found(length, tuple(path), None) if length > 0 else None
        else:  # a partial leaf ending within the prompt counts too
            leaf = max((b for b in siblings.values() if b.saved is not None and b.end <= limit
                        and b.tokens == tuple(prompt[start: b.end])), key=lambda b: b.end, default=None)
            path += [leaf] if leaf is not None else []
            at = max((i for i, b in enumerate(path) if b.saved is not None and b.end <= limit), default=None)
            found = Found(path[at].end, tuple(path[: at + 1]), path[at].saved) if at is not None else None
        if found is not None:
            tick = next(self._clock)
            for b in self._chain(found.blocks[-1]):
                b.used = tick
        return found

    def hit(self, found: Found) -> None:
        """`found` was taken back into a state (counted in `hits`, `hit_tokens`)."""
        self.hits += 1
        self.hit_tokens += found.length

    def evict(self, max_bytes: int) -> None:
        """The least recently used leaves removed until the blocks hold at most `max_bytes` (a
        parent a leaf once its last child goes; among equally old leaves the first stored), from
        a heap of the leaves: one pass over the blocks, not one a removal."""
        if self.nbytes <= max_bytes:
            return
        order = {key: i for i, key in enumerate(self.blocks)}
        leaves = [(b.used, order[b.key], b) for b in self.blocks.values() if not b.children]
        heapq.heapify(leaves)
        while self.nbytes > max_bytes and leaves:
            block = heapq.heappop(leaves)[2]
            self._remove(block)
            parent = block.parent
            if parent is not None and not parent.children:
                heapq.heappush(leaves, (parent.used, order[parent.key], parent))

    def clear(self) -> None:
        self.blocks, self.roots, self.nbytes = {}, {}, 0

    def _remove(self, block: Block) -> None:
        assert not block.children  # (a parent never goes before its children)
        siblings = block.parent.children if block.parent else self.roots
        del siblings[block.key], self.blocks[block.key]
        self.nbytes -= block.nbytes

    @staticmethod
    def _chain(block: Block | None) -> list[Block]:
        chain = []
        while block is not None:
            chain.append(block)
            block = block.parent
        return chain


def _shared(a: tuple[int, ...], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
