"""A streamed reply's chunks, as the openai client parses them from a server's SSE, into
the events the window reads: reasoning_content and <think> blocks become thinking."""

from __future__ import annotations

from openai.types.chat import ChatCompletionChunk

from engine import events as ev
from engine.remote.reply import RemoteReply


def chunk(delta=None, finish=None, usage=None, **extra) -> ChatCompletionChunk:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": choices, "usage": usage, **extra}  # fmt: skip
    return ChatCompletionChunk.model_validate(body)


def run(chunks) -> tuple[RemoteReply, list[ev.Tokens]]:
    events: list[ev.Tokens] = []
    reply = RemoteReply("r", events.append)
    for c in chunks:
        reply.add(c)
    reply.finish()
    return reply, events


def test_reasoning_content_is_thinking_and_content_the_answer():
    reply, events = run([
        chunk({"role": "assistant"}),
        chunk({"reasoning_content": "The user greets."}),
        chunk({"reasoning_content": " Greet back."}),
        chunk({"content": "Hello!"}, finish="stop"),
    ])  # fmt: skip
    assert [(e.part, e.text) for e in events] == [
        ("thinking", "The user greets."), ("thinking", " Greet back."), ("answer", "Hello!"),
    ]  # fmt: skip
    assert (reply.thinking, reply.answer) == ("The user greets. Greet back.", "Hello!")
    assert reply.reason(stopped=False) == ev.FinishReason.EOS
    assert reply.num_thinking_chunks == 2 and reply.num_chunks == 3


def test_a_think_block_in_the_content_is_split_out_across_chunks():
    pieces = ["<thi", "nk>\nLet me", " see.</th", "ink>\n\nIt is", " 4."]
    reply, events = run([chunk({"content": p}) for p in pieces] + [chunk({}, finish="length")])
    assert (reply.thinking, reply.answer) == ("Let me see.", "It is 4.")
    assert "".join(e.text for e in events if e.part == "thinking") == "Let me see."
    assert reply.reason(stopped=False) == ev.FinishReason.LENGTH


def test_llama_server_timings_and_usage_make_the_stats():
    usage = {"prompt_tokens": 60, "completion_tokens": 3, "total_tokens": 63}
    timings = {"cache_n": 52, "prompt_n": 8, "prompt_per_second": 400.0, "predicted_n": 3}
    reply, _ = run([chunk({"content": "a"}), chunk({"content": "b"}), chunk({"content": "c"}),
                    chunk({}, finish="stop", timings=timings), chunk(usage=usage)])  # fmt: skip
    stats = reply.stats(server="h:8080", context_length=4096)
    assert (stats.prompt_tokens, stats.reused_tokens, stats.prefilled_tokens) == (60, 52, 8)
    assert stats.generated_tokens == 3 and stats.prefill_tok_s == 400.0
    assert stats.context_tokens == 63 and stats.context_length == 4096
    assert set(stats.server_reported) == {
        "prompt_tokens", "cached_tokens", "completion_tokens", "prefill_tok_s",
    }  # fmt: skip


def test_a_stopped_reply_says_so():
    reply, _ = run([chunk({"content": "Once"})])
    assert reply.reason(stopped=True) == ev.FinishReason.STOPPED


def test_llama_servers_prompt_progress_is_prefill_progress():
    events: list = []
    reply = RemoteReply("r", events.append)
    for processed in (1000, 1512):
        progress = {"total": 1512, "cache": 1000, "processed": processed, "time_ms": 5.0}
        reply.add(chunk({"role": "assistant"}, prompt_progress=progress))
    assert events == [
        ev.PrefillProgress("r", 0, 512, 1000),
        ev.PrefillProgress("r", 512, 512, 1000),
    ]
