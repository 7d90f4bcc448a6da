"""The host-memory prefix store (runtime/models/prefix_blocks.py): sequences' states in blocks of
tokens keyed by a hash chain, a prefix many conversations share stored once, any prompt taking back
the longest stored prefix, LRU eviction of leaves within a byte budget, a recurrent model's saved
state only at the end of the block where it was saved; and, through ft serve, conversations sharing
a long system prompt storing it once and a later one taking it back."""

from __future__ import annotations

import pytest
import torch

from runtime.engine import Session
from runtime.loading.registered import open_model
from runtime.loading.runnable import load
from runtime.models import prefix_blocks
from runtime.models.prefix_blocks import BlockStore
from runtime.models.state import StateCheckpoint
from runtime.models.state_copy import ParkedPart
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer
from tests.test_server_util import LiveServer, pulled_home

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return pulled_home(tmp_path_factory.mktemp("blocks-home"))


@pytest.fixture(scope="module")
def tiny(store):
    return load(store, "tiny", torch.float32).model, Tokenizer.from_model(open_model(store, "tiny"))


def _rows(spans: list[tuple[int, int]]) -> list[ParkedPart]:
    """A copy of positions' rows without a model: 8 bytes a position, the position as the value."""
    return [ParkedPart(start, (torch.arange(start, end, dtype=torch.float64),)) for start, end in spans]


def _stored(blocks: BlockStore) -> list[list[int]]:
    """The token sequences stored: one a leaf, its chain's tokens."""
    sequences = []
    for leaf in (b for b in blocks.blocks.values() if not b.children):
        chain = blocks._chain(leaf)
        sequences.append([t for b in reversed(chain) for t in b.tokens])
    return sorted(sequences)


def test_a_stored_conversation_comes_back_whole_and_answers_as_computed(tiny) -> None:
    model, tokenizer = tiny
    blocks = BlockStore(block_tokens=32)
    session = Session(model, tokenizer, 256)
    session.generate(list(range(5, 105)), GREEDY)
    held = list(session.tokens)
    assert session.park_into(blocks)
    assert len(blocks) == -(-len(held) // 32) and _stored(blocks) == [held]  # the last block partial
    assert sorted((b.start, b.end) for b in blocks.blocks.values())[-1] == (96, len(held))
    turn = held + [7, 8, 9]
    found = blocks.lookup(turn, rewinds=True)
    assert found is not None and found.length == len(held) and found.tokens() == held
    back = Session(model, tokenizer, 256)
    assert back.unpark_blocks(found)
    reply = back.generate(turn, GREEDY)
    assert reply.stats.cached_tokens == len(held)
    assert reply.tokens == Session(model, tokenizer, 256).generate(turn, GREEDY).tokens
    edited = held[:50] + [11, 12, 13]  # departs inside a block: its first rows are used
    part = blocks.lookup(edited, rewinds=True)
    assert part is not None and part.length == 50 and part.state().parts[-1].end == 50
    sub = Session(model, tokenizer, 256)
    assert sub.unpark_blocks(part)
    assert sub.generate(edited, GREEDY).tokens == Session(model, tokenizer, 256).generate(edited, GREEDY).tokens


def test_a_shared_prefix_is_stored_once_and_found_from_another_conversation(tiny, monkeypatch) -> None:
    model, tokenizer = tiny
    blocks = BlockStore(block_tokens=32)
    system = list(range(5, 85))  # 80 tokens: two whole blocks and a part of the third
    copied: list[tuple[int, int]] = []
    park = model.park_parts

    def counting(state, spans, saved=None):
        copied.extend(spans)
        return park(state, spans, saved)

    monkeypatch.setattr(model, "park_parts", counting)
    held = []
    for task in ([200, 201, 202], [210, 211, 212, 213]):
        session = Session(model, tokenizer, 256)
        session.generate(system + task, GREEDY)
        assert session.park_into(blocks)
        held.append(len(session.tokens))
    assert copied == [(0, 32), (32, 64), (64, held[0]), (64, held[1])]  # the second: its own block only
    roots = list(blocks.roots.values())
    assert len(roots) == 1 and len(roots[0].children) == 1  # one chain for the system prompt
    assert len(next(iter(roots[0].children.values())).children) == 2  # where the conversations part
    assert blocks.nbytes == sum(b.nbytes for b in blocks.blocks.values())
    found = blocks.lookup(system + [220, 221], rewinds=True)  # a third conversation, the same system prompt
    assert found is not None and found.length == len(system)
    assert found.blocks[:2] == (roots[0], *roots[0].children.values())


def test_a_hash_collision_costs_a_miss_not_another_prefix(monkeypatch) -> None:
    monkeypatch.setattr(prefix_blocks, "chain_key", lambda parent, tokens: parent + 1)  # every first block: key 1
    blocks = BlockStore(block_tokens=4)
    first, other = [1, 2, 3, 4, 5, 6], [9, 9, 9, 9, 5, 6]
    assert blocks.insert(first, _rows)
    assert not blocks.insert(other, _rows) and _stored(blocks) == [first]  # refused, nothing added
    assert blocks.lookup(other + [0], rewinds=True) is None  # same keys, other tokens: not found
    found = blocks.lookup(first + [0], rewinds=True)
    assert found is not None and found.length == len(first)


def test_least_recently_used_leaves_go_first_and_a_parent_never_before_its_children() -> None:
    blocks = BlockStore(block_tokens=4)
    shared = [1, 2, 3, 4]
    x, y, z = shared + [5, 6, 7, 8], shared + [9, 10, 11, 12], [20, 21, 22, 23]
    for tokens in (x, y, z):
        assert blocks.insert(tokens, _rows)
    assert blocks.nbytes == 4 * 4 * 8 and len(blocks) == 4
    assert blocks.insert(x, lambda spans: pytest.fail("x is stored: nothing to copy"))  # touches x
    assert blocks.lookup(y + [0], rewinds=True) is not None  # touches y, then the shared block
    blocks.evict(3 * 32)
    assert _stored(blocks) == [x, y]  # z, untouched since stored, went
    blocks.evict(32)
    assert _stored(blocks) == [shared]  # x's tail, then y's; their parent last
    blocks.evict(0)
    assert len(blocks) == 0 and blocks.nbytes == 0
    blocks.insert(x, _rows)
    blocks.evict(1)
    assert len(blocks) == 0


def test_a_partial_leaf_covered_by_a_stored_block_is_not_kept_twice() -> None:
    blocks = BlockStore(block_tokens=4)
    blocks.insert([1, 2, 3], _rows)
    blocks.insert([1, 2, 3, 4, 5], _rows)  # [1, 2, 3] is now the first rows of a whole block
    assert _stored(blocks) == [[1, 2, 3, 4, 5]] and blocks.nbytes == 5 * 8
    assert blocks.insert([1, 2], lambda spans: pytest.fail("covered: nothing to copy"))
    found = blocks.lookup([1, 2, 3, 9], rewinds=True)
    assert found is not None and found.length == 3


def test_a_recurrent_state_is_resumed_only_at_the_end_of_the_block_it_was_saved_on() -> None:
    blocks = BlockStore(block_tokens=4)
    tokens = list(range(1, 11))
    at_six, at_eight = StateCheckpoint(6, {0: torch.zeros(3)}), StateCheckpoint(8, {0: torch.ones(3)})
    assert blocks.insert(tokens[:6], _rows, at_six)  # a whole block, and a partial leaf with the state
    assert blocks.insert(tokens[:8], _rows, at_eight)  # a whole block's end
    assert blocks.nbytes == (6 + 4) * 8 + 2 * 3 * 4  # the leaf [4, 6) beside [4, 8): it holds a state
    found = blocks.lookup(tokens + [0], rewinds=False)
    assert found is not None and (found.length, found.saved) == (8, at_eight)
    found = blocks.lookup(tokens[:7] + [50, 51], rewinds=False)  # departs at 7: back to 6, not 7
    assert found is not None and (found.length, found.saved) == (6, at_six)
    assert found.state().saved is at_six and found.state().parts[-1].end == 6
    assert blocks.lookup(tokens[:5] + [50, 51], rewinds=False) is None  # no state saved within 5
    assert blocks.lookup(tokens[:5] + [50, 51], rewinds=True).length == 5  # (a model that rewinds: any)


def _system_prompt() -> dict[str, str]:
    return {"role": "system", "content": "You are a careful coding agent. " + " ".join(
        f"Rule {i}: read the file {i} before you edit it, and run its tests after." for i in range(40))}


def test_conversations_sharing_a_system_prompt_store_it_once_and_a_later_one_takes_it_back(store, monkeypatch) -> None:
    """Through ft serve with one session (a GPU model's): two conversations with the same long
    system prompt, each displaced by the next request, store it once (its blocks are one chain);
    a side request of its own takes the session, then a third conversation with that system
    prompt takes its blocks back from host memory, the hit reported by the API and by /api/ps."""
    import httpx
    import openai

    from runtime.server import runner

    monkeypatch.setattr(runner, "sessions_for", lambda plan: 1)
    monkeypatch.setattr(runner, "park_bytes_for", lambda plan: 1 << 30)
    system = _system_prompt()
    tasks = ["Fix the failing test in the parser.", "Search for uses of parse_header.", "Rename parse_body."]
    side = [{"role": "system", "content": "Write a five-word title."}, {"role": "user", "content": "fix it"}]
    with LiveServer(store) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)

        def ask(messages):
            return client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)

        first = ask([system, {"role": "user", "content": tasks[0]}])
        assert first.usage.prompt_tokens > 3 * prefix_blocks.BLOCK_TOKENS
        ask([system, {"role": "user", "content": tasks[1]}])
        ask(side)  # the second conversation parked: its system prompt's blocks were stored already
        pool = next(iter(server.manager.runners.values())).sessions
        assert len(pool.parked.roots) == 1  # the two conversations' chain (the side request is not parked)
        chain = next(iter(pool.parked.roots.values()))
        shared = 0
        while len(chain.children) == 1 and len(chain.tokens) == prefix_blocks.BLOCK_TOKENS:
            shared, chain = shared + 1, next(iter(chain.children.values()))
        assert len(chain.children) == 2  # where the two conversations part: one chain before it
        shown = httpx.get(server.url + "/api/ps", timeout=30).json()["models"][0]["ft"]
        assert shown["parked_blocks"] == len(pool.parked) and shown["parked_bytes"] == pool.parked.nbytes
        third = ask([system, {"role": "user", "content": tasks[2]}])
        cached = third.usage.prompt_tokens_details.cached_tokens
        assert cached >= (shared + 1) * prefix_blocks.BLOCK_TOKENS and cached < third.usage.prompt_tokens
        shown = httpx.get(server.url + "/api/ps", timeout=30).json()["models"][0]["ft"]
        assert shown["park_hits"] == 1 and shown["park_hit_tokens"] == cached
        assert 0 < shown["parked_bytes"] <= shown["park_budget_bytes"]
