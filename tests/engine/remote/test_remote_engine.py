"""The remote engine against a real llama-cpp-python server on loopback: streaming,
sampling settings, stop, the server's prefix cache, a server gone mid-reply."""

from __future__ import annotations

import re
import time
from typing import Any

import openai
import pytest

from engine import events as ev
from engine.remote.connection import REMOTE_FAMILY, RemoteConnection
from engine.remote.engine import RemoteEngine
from engine.sampling import SamplingSettings
from engine.stats_format import message_line
from tests.engine.remote.remote_runner import RemoteRunner
from tests.engine.remote.server import start_server

STORY = [("user", "Write a long story about a dragon who learns to paint.")]


@pytest.fixture
def runner(llama_server):
    r = RemoteRunner()
    loaded = r.connect(RemoteConnection(llama_server.url))
    assert isinstance(loaded, ev.ModelLoaded), loaded
    yield r
    r.close()


def test_connect_lists_the_servers_model(llama_server, runner):
    r = RemoteRunner()
    loaded = r.connect(RemoteConnection(llama_server.url))
    r.close()
    assert loaded.family == REMOTE_FAMILY
    assert loaded.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert loaded.backend == f"server 127.0.0.1:{llama_server.port}"


def test_streamed_reply_equals_the_servers_whole_reply(llama_server, runner):
    """Greedy: the text streamed through the events is the one the server gives whole.

    llama.cpp's greedy text may differ between a fresh prompt and one it finds cached (its
    last token then evaluated alone: other sums, and a near tie goes the other way, as on
    an AVX2 machine), so the prompt is cached first and both replies come from that state."""
    client = openai.OpenAI(base_url=llama_server.url, api_key="none", max_retries=0)

    def whole_reply() -> Any:
        return client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Name three colours."}],
            max_tokens=24,
            temperature=0.0,
        )

    whole_reply()  # the server now holds the prompt
    finished, tokens = runner.generate([("user", "Name three colours.")])
    assert isinstance(finished, ev.Finished), finished
    whole = whole_reply()
    assert finished.text == whole.choices[0].message.content
    assert "".join(t.text for t in tokens) == finished.text
    assert finished.reason == ev.FinishReason.LENGTH  # 24 tokens asked, none to spare
    stats = finished.stats
    assert stats is not None
    assert stats.generated_tokens == len(tokens) == whole.usage.completion_tokens
    assert stats.server == f"127.0.0.1:{llama_server.port}"
    assert stats.ttft_s > 0 and stats.decode_tok_s > 0
    # llama-cpp-python's server reports no usage while streaming: nothing is made up
    assert stats.server_reported == ()
    assert "server: no prompt figures" in message_line({"server": stats.server})


def test_seed_top_k_and_max_tokens_reach_the_server(runner):
    sampling = SamplingSettings(temperature=1.0, top_k=40, min_p=0.05, seed=7)
    settings = ev.GenerationSettings(sampling, max_tokens=12)
    first, _ = runner.generate(STORY, settings)
    again, _ = runner.generate(STORY, settings)
    other_seed = SamplingSettings(temperature=1.0, top_k=40, min_p=0.05, seed=8)
    other, _ = runner.generate(STORY, ev.GenerationSettings(other_seed, max_tokens=12))
    assert first.text == again.text  # the seed reached the sampler
    assert other.text != first.text
    assert first.stats.generated_tokens == 12


def test_stop_sequences_end_the_reply_before_them(llama_server):
    """A space as the stop sequence: the reply is its first word (llama.cpp's greedy text
    may differ between a cached and a fresh prompt, so no second reply is compared)."""
    r = RemoteRunner()
    r.engine.close()
    r.engine = RemoteEngine(r.events.put, stop_sequences=(" ",))
    try:
        r.connect(RemoteConnection(llama_server.url))
        cut, tokens = r.generate(STORY)
    finally:
        r.close()
    assert cut.text and " " not in cut.text
    assert cut.reason == ev.FinishReason.EOS  # the server's "stop", before max_tokens
    assert cut.stats.generated_tokens < 24


def test_stop_closes_the_stream_within_a_second(llama_server, runner):
    stopped_at: list[float] = []

    def stop_after_five(request_id, tokens):
        if len(tokens) == 5:
            stopped_at.append(time.perf_counter())
            runner.engine.submit(ev.Stop(request_id))

    log_start = len(llama_server.log_text())
    settings = ev.GenerationSettings(max_tokens=1000)
    finished, tokens = runner.generate(STORY, settings, on_tokens=stop_after_five)
    ended = time.perf_counter() - stopped_at[0]
    assert finished.reason == ev.FinishReason.STOPPED
    assert ended < 1.0
    assert finished.text == "".join(t.text for t in tokens)
    assert 5 <= finished.stats.generated_tokens < 1000
    # the server ends the request too (its log line comes within a second on an idle
    # machine; a loaded one has taken longer)
    deadline = time.monotonic() + 5.0
    while "Disconnected from client" not in llama_server.log_text()[log_start:]:
        assert time.monotonic() < deadline, llama_server.log_tail()
        time.sleep(0.05)


def test_edit_and_regenerate_reuse_the_servers_prefix_cache(llama_server, runner):
    """The branch is sent whole; the server computes only past the longest prefix it
    holds (its log says how many tokens matched)."""
    history = [
        ("system", "You are a helpful assistant who answers in one sentence."),
        ("user", "What is the capital of France?"),
        ("assistant", "The capital of France is Paris."),
        ("user", "And of Italy?"),
    ]
    first, _ = runner.generate(history)
    log_start = len(llama_server.log_text())
    edited = [*history[:-1], ("user", "And of Spain?")]
    second, _ = runner.generate(edited)
    assert isinstance(first, ev.Finished) and isinstance(second, ev.Finished)
    hits = re.findall(r"(\d+) prefix-match hit", llama_server.log_text()[log_start:])
    assert hits and int(hits[-1]) >= 40, llama_server.log_tail()


def test_server_killed_mid_reply_keeps_the_partial_reply_and_retry_works(tmp_path_factory):
    server = start_server(tmp_path_factory)
    r = RemoteRunner()
    try:
        r.connect(RemoteConnection(server.url))

        def kill_after_five(_request_id, tokens):
            if len(tokens) == 5:
                server.stop()

        failed, tokens = r.generate(STORY, ev.GenerationSettings(max_tokens=1000),
                                    on_tokens=kill_after_five)  # fmt: skip
        assert isinstance(failed, ev.Failed)
        assert "went away mid-reply" in failed.message
        assert "kept as a stopped reply" in failed.message
        assert len(tokens) >= 5  # what streamed stays the window's
        server.start()  # back on the same port: the next request just works
        finished, _ = r.generate(STORY)
        assert isinstance(finished, ev.Finished) and finished.text
    finally:
        r.close()
        server.stop()
