"""Thinking through the whole engine: the per-chat switch reaches a Qwen3-style template as
`enable_thinking`, and a reply's <think> block streams and finishes apart from the answer
(the reply is forced by a scripted decode, so the split is asserted on known text). A
chat's own context length is honoured."""

from __future__ import annotations

import shutil
import time

import pytest

import engine.session as session_module
from engine import events as ev
from engine.decoding import DecodeResult
from engine.tokenizer import Tokenizer
from tests.engine.engine_runner import Runner, greedy, user

# Qwen3's template, cut to what thinking needs: thinking off writes an empty block.
QWEN_STYLE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
# Qwen3-Thinking-2507 / DeepSeek-R1: the generation prompt opens the block itself.
OPENS_THINK = QWEN_STYLE.replace(
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}",
    "{{- '<think>\\n' }}",
)


@pytest.fixture(scope="module")
def model_dirs(tiny_models, tmp_path_factory):
    source, _spec = tiny_models.hf("qwen3")
    root = tmp_path_factory.mktemp("thinking")
    dirs = {}
    for name, template in (("qwen", QWEN_STYLE), ("opened", OPENS_THINK)):
        target = root / name
        shutil.copytree(source, target)
        (target / "chat_template.jinja").write_text(template)
        dirs[name] = target
    return dirs


def scripted_decode(reply: str, tokenizer: Tokenizer, batch: int = 2):
    """A decode that 'samples' exactly the tokens of `reply`, `batch` at a time."""

    def decode(runner, state, row, req, costs):
        ids = tokenizer.encode(reply)
        result = DecodeResult(first_token_time=time.perf_counter())
        for at in range(0, len(ids), batch):
            chunk = ids[at : at + batch]
            req.emit(chunk, [False] * len(chunk))
        result.token_ids, result.reason, result.end_time = ids, "eos", time.perf_counter()
        return result

    return decode


def prompt_text(runner: Runner) -> str:
    session = runner.engine.session
    assert session is not None
    return session.tokenizer.decode(list(session.state.tokens))


def test_the_switch_reaches_the_template_as_enable_thinking(model_dirs):
    with Runner() as runner:
        runner.load(model_dirs["qwen"])
        runner.generate((user("Hi"),), greedy(max_tokens=1, enable_thinking=False))
        assert prompt_text(runner).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        runner.generate((user("Hi"),), greedy(max_tokens=1, enable_thinking=True))
        assert prompt_text(runner).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("template", "reply"),
    [
        ("qwen", "<think>\nThe user greets me.\n</think>\n\nHello to you!"),
        ("opened", "\nThe user greets me.\n</think>\n\nHello to you!"),
    ],
)
def test_the_think_block_streams_and_finishes_apart_from_the_answer(
    model_dirs, monkeypatch, template, reply
):
    with Runner() as runner:
        runner.load(model_dirs[template])
        tokenizer = runner.engine.session.tokenizer
        monkeypatch.setattr(session_module, "decode", scripted_decode(reply, tokenizer))
        command = ev.Generate("r1", (user("Hi"),), greedy(enable_thinking=True))
        events = runner.request(command)
    finished = events[-1]
    assert isinstance(finished, ev.Finished)
    assert (finished.thinking, finished.text) == ("The user greets me.", "Hello to you!")
    tokens = [e for e in events if isinstance(e, ev.Tokens)]
    streamed = {p: "".join(e.text for e in tokens if e.part == p) for p in ev.ReplyPart}
    assert streamed == {"thinking": "The user greets me.", "answer": "Hello to you!"}
    assert [i for e in tokens for i in e.token_ids] == list(finished.token_ids)
    block = reply[: reply.index("</think>") + len("</think>")]
    assert finished.stats is not None
    assert finished.stats.thinking_tokens == len(tokenizer.encode(block))
    streamed_thinking = sum(len(e.token_ids) for e in tokens if e.part == "thinking")
    assert streamed_thinking == finished.stats.thinking_tokens
    assert finished.stats.generated_tokens == len(tokenizer.encode(reply))


def test_a_reply_without_a_block_is_all_answer(model_dirs, monkeypatch):
    with Runner() as runner:
        runner.load(model_dirs["qwen"])
        tokenizer = runner.engine.session.tokenizer
        monkeypatch.setattr(
            session_module, "decode", scripted_decode("Just <b>this</b>.", tokenizer)
        )
        finished = runner.generate((user("Hi"),), greedy())
    assert (finished.thinking, finished.text) == ("", "Just <b>this</b>.")
    assert finished.stats is not None and finished.stats.thinking_tokens == 0


def test_a_chats_context_length_is_honoured(model_dirs):
    with Runner() as runner:
        loaded = runner.load(model_dirs["qwen"])
        messages = (user("Tell me about the sea and the sky."),)
        runner.engine.submit(ev.Generate("small", messages, greedy(context_length=8)))
        while not isinstance(event := runner.next_event(), ev.Failed | ev.Finished):
            pass
        assert isinstance(event, ev.Failed)
        assert "this chat's context length is 8" in event.message
        prompt = runner.generate(messages, greedy(max_tokens=1)).stats.prompt_tokens
        limit = prompt + 4
        finished = runner.generate(messages, greedy(max_tokens=100, context_length=limit))
        assert limit < loaded.context_length
        assert finished.stats.context_length == limit
        assert len(finished.token_ids) <= limit - prompt and finished.reason == "context_full"


def test_a_context_length_below_two_is_refused():
    with pytest.raises(ValueError, match="context_length"):
        ev.GenerationSettings(context_length=1)
