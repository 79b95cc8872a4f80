"""Turn boundaries never depend on rendering a message list the template may refuse.

Qwen3's template refuses a list without a user message (`raise_exception('No user query
found in messages.')`), and the session used to render every prefix of the conversation
to find where each message ends: the prefix [system] failed every chat with a system
prompt. It also strips the reasoning of assistant turns before the last user query, so a
later request's prompt differs from the state inside the earlier reply: the longest
common prefix is still reused, exactly.
"""

from __future__ import annotations

import shutil

import pytest

from engine import events as ev
from tests.engine.engine_runner import Runner, assistant, fresh_finished, greedy, user

# Qwen3's template, reduced to its no-user-query guard and its history rewrite.
QWEN3_GUARDED = (
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}"
    "{%- endif %}{%- endfor %}"
    "{%- if ns.multi_step_tool %}{{- raise_exception('No user query found in messages.') }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- set content = message.content %}"
    "{%- if message.role == 'assistant' and loop.index0 < ns.last_query_index"
    " and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


@pytest.fixture(scope="module")
def guarded_dir(tiny_models, tmp_path_factory):
    source, _spec = tiny_models.hf("qwen3")
    target = tmp_path_factory.mktemp("guarded") / "qwen3"
    shutil.copytree(source, target)
    (target / "chat_template.jinja").write_text(QWEN3_GUARDED)
    return target


def system(text: str) -> ev.Message:
    return ev.Message("system", text)


def test_a_system_prompt_is_served_by_a_template_that_refuses_a_userless_prefix(guarded_dir):
    messages = (system("You are terse."), user("Name a colour."))
    with Runner() as runner:
        runner.load(guarded_dir)
        finished = runner.generate(messages, greedy(max_tokens=8))
    assert (
        finished.token_ids == fresh_finished(guarded_dir, messages, greedy(max_tokens=8)).token_ids
    )


def test_a_rewritten_history_still_reuses_the_longest_common_prefix(guarded_dir):
    first = (system("You are terse."), user("Name a colour."))
    reply = assistant("<think>\nred or blue\n</think>\n\nBlue.")
    second = (*first, reply, user("Another?"))
    with Runner() as runner:
        runner.load(guarded_dir)
        # continuing the reply puts its reasoning in the state: it is the last message then
        runner.generate((*first, reply), greedy(max_tokens=4, continue_last=True))
        held = runner.state_tokens()
        finished = runner.generate(second, greedy(max_tokens=6))
    assert finished.stats is not None
    # the second prompt differs inside the stripped reasoning: everything before is reused
    assert 0 < finished.stats.reused_tokens < len(held)
    assert finished.token_ids == fresh_finished(guarded_dir, second, greedy(max_tokens=6)).token_ids


def test_a_system_prompt_chat_with_thinking_on_then_off_reuses_its_prefix(guarded_dir):
    """The issue's case whole: Qwen3's guard, its <think> stripping and its switch, over a
    chat with a system prompt; each reply equals a fresh engine's, each turn reuses."""
    first = (system("You are terse."), user("Name a colour."))
    on, off = (
        greedy(max_tokens=6, enable_thinking=True),
        greedy(max_tokens=6, enable_thinking=False),
    )
    with Runner() as runner:
        runner.load(guarded_dir)
        thought = runner.generate(first, on)
        assert thought.token_ids == fresh_finished(guarded_dir, first, on).token_ids
        second = (*first, assistant("<think>\nred\n</think>\n\nRed."), user("Another?"))
        plain = runner.generate(second, off)
        session = runner.engine.session
        assert session is not None  # the switch reached the template: an empty block
        assert session.tokenizer.decode(runner.state_tokens()).count("<think>\n\n</think>") == 1
        assert plain.token_ids == fresh_finished(guarded_dir, second, off).token_ids
        third = (*second, assistant("Blue."), user("And one more?"))
        again = runner.generate(third, on)
        assert again.token_ids == fresh_finished(guarded_dir, third, on).token_ids
    for finished in (plain, again):
        assert finished.stats is not None and finished.stats.reused_tokens > 0
