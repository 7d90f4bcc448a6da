"""A request whose prompt departs from what the session's state holds (an edited or trimmed
history, a retried turn) keeps the common prefix instead of starting over, where every layer's
cache is read by position, and answers as a fresh session would; each API reports the cache hit
as it defines one: Ollama's prompt_eval_cached_count (prompt_eval_count stays the whole prompt),
OpenAI's usage.prompt_tokens_details.cached_tokens, Anthropic's cache_read_input_tokens (its
input_tokens the rest). Through the real client packages against `ft serve`'s app."""

from __future__ import annotations

import httpx
import pytest
import torch

from runtime.engine import Session, common_prefix
from runtime.loading.registered import open_model
from runtime.loading.runnable import load
from runtime.models import DecoderModel
from runtime.text.sampling import SamplingParams
from runtime.text.tokenizer import Tokenizer
from tests.test_server_util import LiveServer, pulled_home

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)
COLD = {"temperature": 0}  # (this anthropic SDK takes sampling fields only in the body)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return pulled_home(tmp_path_factory.mktemp("prefix-home"))


def test_common_prefix() -> None:
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3, 4], [1, 2]) == 2
    assert common_prefix([1, 2, 9, 4], [1, 2, 3, 4]) == 2
    assert common_prefix(list(range(1000)), list(range(777)) + [-1]) == 777


def test_an_edited_history_keeps_the_common_prefix_and_answers_as_a_fresh_session(store) -> None:
    loaded, tokenizer = load(store, "tiny", torch.float32), Tokenizer.from_model(open_model(store, "tiny"))
    session = Session(loaded.model, tokenizer, 256)
    first = list(range(5, 65))
    edited = first[:40] + [7, 8, 9]  # the history cut and rewritten after 40 tokens
    session.generate(first, GREEDY)
    reply = session.generate(edited, GREEDY)
    assert (reply.stats.cached_tokens, reply.stats.prompt_tokens) == (40, 3)
    fresh = Session(loaded.model, tokenizer, 256).generate(edited, GREEDY)
    assert reply.tokens == fresh.tokens and reply.text == fresh.text
    again = session.generate(edited, GREEDY)  # retried: all but the last token kept (its logits start the reply)
    assert (again.stats.cached_tokens, again.stats.prompt_tokens) == (len(edited) - 1, 1)
    assert again.tokens == fresh.tokens
    # the prompt again with other words than the reply's: the reply's tokens are taken back
    assert again.tokens[0] != 11
    longer = session.generate(edited + [11, 12], GREEDY)
    assert (longer.stats.cached_tokens, longer.stats.prompt_tokens) == (len(edited), 2)


def test_a_state_that_cannot_be_taken_back_starts_over(store, monkeypatch) -> None:
    """A recurrent layer's state moves on with every token: a departing prompt recomputes all."""
    loaded, tokenizer = load(store, "tiny", torch.float32), Tokenizer.from_model(open_model(store, "tiny"))
    monkeypatch.setattr(DecoderModel, "rewinds", property(lambda self: False))
    session = Session(loaded.model, tokenizer, 256)
    first = list(range(5, 65))
    session.generate(first, GREEDY)
    reply = session.generate(first[:40] + [7, 8, 9], GREEDY)
    assert (reply.stats.cached_tokens, reply.stats.prompt_tokens) == (0, 43)


def test_every_api_reports_the_cache_hit_of_a_continued_conversation(store) -> None:
    import anthropic
    import ollama
    import openai

    question = [{"role": "user", "content": "Tell me about the quiet river and the old stone bridge."}]
    with LiveServer(store) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        first = client.chat.completions.create(model="tiny", messages=question, max_tokens=8, temperature=0)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        turn = [*question, {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "And then?"}]
        second = client.chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0)
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert first.usage.prompt_tokens // 2 < cached < second.usage.prompt_tokens

        ant = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
        once = ant.messages.create(model="tiny", max_tokens=8, messages=question, extra_body=COLD)
        history = [*question, {"role": "assistant", "content": once.content[0].text},
                   {"role": "user", "content": "And then?"}]
        again = ant.messages.create(model="tiny", max_tokens=8, extra_body=COLD, messages=history)
        assert again.usage.cache_read_input_tokens > 0 and again.usage.cache_creation_input_tokens == 0
        assert again.usage.input_tokens + again.usage.cache_read_input_tokens > once.usage.input_tokens
        history = [*history, {"role": "assistant", "content": again.content[0].text}, {"role": "user", "content": "More?"}]
        with ant.messages.stream(model="tiny", max_tokens=8, messages=history, extra_body=COLD) as stream:
            streamed = stream.get_final_message()
        assert streamed.usage.cache_read_input_tokens > again.usage.cache_read_input_tokens  # (streamed: in the last delta)

        oll = ollama.Client(host=server.url)
        one = oll.chat(model="tiny", messages=question, options={"temperature": 0, "num_predict": 8})
        body = {"model": "tiny", "messages": question, "stream": False, "options": {"temperature": 0, "num_predict": 8}}
        two = httpx.post(server.url + "/api/chat", json=body, timeout=120).json()  # (this client drops the field)
        assert two["prompt_eval_count"] == one.prompt_eval_count  # the whole prompt, as Ollama counts it
        assert two["prompt_eval_cached_count"] == two["prompt_eval_count"] - 1


class _FakeSession:
    def __init__(self, context: int, rewinds: bool = True) -> None:
        self.context_length, self.tokens = context, []
        self.model = type("M", (), {"rewinds": rewinds})()

    reusable = Session.reusable  # (the real rule, over these tokens and this model)


def test_the_pool_gives_a_side_request_its_own_session_and_the_main_one_back() -> None:
    from runtime.server.session_pool import SessionPool

    pool = SessionPool(lambda context: _FakeSession(context), 100, size=2)

    def generation(prompt: list[int], context: int = 100) -> _FakeSession:
        session = pool.choose(prompt, context)
        pool.give_back(session)
        return session

    main = generation([1, 2, 3, 4])
    main.tokens = [1, 2, 3, 4, 5, 6]  # (the prompt and its reply)
    side = generation([1, 9, 9])  # shares one token: it would throw away most of main's state
    assert side is not main and len(pool.sessions) == 2
    side.tokens = [1, 9, 9, 7]
    assert generation([1, 2, 3, 4, 5, 6, 8]) is main  # the main conversation, continued
    assert generation([1, 2, 3, 4, 0]) is main  # edited near its end: still main's (keeps over half)
    third = generation([5, 5, 5])  # a third conversation, the pool full: the least recently used
    assert third is side
    assert generation([1, 2], 50) is not main and pool.sessions == [pool.sessions[0]]  # another context: anew


def test_a_session_is_not_chosen_while_a_generation_runs_in_it() -> None:
    """Concurrent generations: the conversation's own session is busy, so a second request that
    continues it gets another (and the pool never hands one session to two generations); given
    back, it is chosen again; a context change drops only the free sessions, a busy one when given back."""
    from runtime.server.session_pool import SessionPool

    pool = SessionPool(lambda context: _FakeSession(context), 100, size=2)
    main = pool.choose([1, 2, 3], 100)
    main.tokens = [1, 2, 3, 4]
    other = pool.choose([1, 2, 3, 4, 5], 100)  # continues main's, but main is busy
    assert other is not main
    pool.give_back(other)
    pool.give_back(main)
    assert pool.choose([1, 2, 3, 4, 5], 100) is main
    fresh = pool.choose([7], 50)  # main still busy: the free one is dropped, a new one made
    assert fresh is not main and fresh.context_length == 50 and main in pool.sessions
    pool.give_back(main)
    assert main not in pool.sessions and pool.sessions == [fresh]


def test_a_state_that_cannot_be_taken_back_is_kept_only_by_a_continuation() -> None:
    from runtime.server.session_pool import SessionPool

    pool = SessionPool(lambda context: _FakeSession(context, rewinds=False), 100, size=2)
    first = pool.choose([1, 2, 3], 100)
    first.tokens = [1, 2, 3, 4]
    pool.give_back(first)
    second = pool.choose([1, 2, 3, 9], 100)
    assert second is not first  # it would have to start over: another session
    pool.give_back(second)
    assert pool.choose([1, 2, 3, 4, 5], 100) is first


def test_a_side_request_does_not_cost_the_main_conversation_its_cache(store) -> None:
    """A coding agent's pattern: the main conversation, a short request with its own system prompt
    (a title), then the main conversation's next turn, which finds its whole history cached."""
    import openai

    main = [{"role": "system", "content": "You are a careful coding agent with many tools."},
            {"role": "user", "content": "Read the file and fix the failing test, step by step."}]
    side = [{"role": "system", "content": "Write a five-word title."}, {"role": "user", "content": "fix test"}]
    with LiveServer(store) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        first = client.chat.completions.create(model="tiny", messages=main, max_tokens=8, temperature=0)
        client.chat.completions.create(model="tiny", messages=side, max_tokens=4, temperature=0)
        turn = [*main, {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Now run the tests."}]
        second = client.chat.completions.create(model="tiny", messages=turn, max_tokens=8, temperature=0)
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
        runner_sessions = next(iter(server.manager.runners.values())).sessions
        assert len(runner_sessions.sessions) == 2
        shown = httpx.get(server.url + "/api/ps", timeout=30).json()["models"][0]["ft"]  # as `ft ps` shows them
        assert shown["sessions"] == 2 and shown["max_sessions"] == runner_sessions.size > 1


def test_a_prompt_fed_in_slices_answers_as_one_fed_whole(store) -> None:
    """Concurrent generations feed their prompts in slices (Session.prefill_slice: each a turn of
    the model); the state, the tokens and the reply are those of the prompt fed at once, and a
    pass refused part way leaves the tokens in step with the state."""
    loaded, tokenizer = load(store, "tiny", torch.float32), Tokenizer.from_model(open_model(store, "tiny"))
    prompt = list(range(5, 75))
    whole = Session(loaded.model, tokenizer, 256).generate(prompt, GREEDY)
    sliced = Session(loaded.model, tokenizer, 256, prefill_slice=16)
    reply = sliced.generate(prompt, GREEDY)
    assert reply.tokens == whole.tokens and (reply.stats.cached_tokens, reply.stats.prompt_tokens) == (0, 70)

    class Refusing:  # the model refuses its third pass, as a cancelled generation's does
        def __init__(self, model) -> None:
            self.model, self.passes, self.rewinds = model, 0, True

        def forward(self, ids, state, last_only=False):
            self.passes += 1
            if self.passes == 3:
                raise RuntimeError("refused")
            return self.model.forward(ids, state, last_only)

        def __getattr__(self, name):
            return getattr(self.model, name)

    cut = Session(Refusing(loaded.model), tokenizer, 256, prefill_slice=16)
    with pytest.raises(RuntimeError, match="refused"):
        cut.generate(prompt, GREEDY)
    assert len(cut.tokens) == cut.state.length == 32
    resumed = cut.generate(prompt, GREEDY)  # the two slices fed are kept
    assert resumed.stats.cached_tokens == 32 and resumed.tokens == whole.tokens
