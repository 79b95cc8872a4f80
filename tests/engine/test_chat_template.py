"""Chat templates render as Hugging Face transformers renders them."""

from __future__ import annotations

import mlx.core as mx
import pytest

from engine.chat_template import (
    DEFAULT_CHATML_TEMPLATE,
    ChatTemplateError,
    compile_template,
    render_chat,
)
from engine.default_model import default_model_path

# SmolLM2-135M-Instruct's template, as its GGUF stores it.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CONVERSATION = [
    {"role": "system", "content": "Answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy?"},
]


@pytest.mark.real_model
def test_default_model_ships_the_smollm2_template():
    path = default_model_path()
    if not path.is_file():
        pytest.skip(f"default model not present at {path}")
    metadata = mx.load(str(path), return_metadata=True)[1]
    assert metadata["tokenizer.chat_template"] == SMOLLM2_TEMPLATE


def test_smollm2_conversation_renders_exactly():
    prompt = render_chat(SMOLLM2_TEMPLATE, CONVERSATION, add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>system\nAnswer in one word.<|im_end|>\n"
        "<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\nParis.<|im_end|>\n"
        "<|im_start|>user\nAnd of Italy?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_adds_its_system_prompt_when_none_is_given():
    prompt = render_chat(SMOLLM2_TEMPLATE, CONVERSATION[1:2], add_generation_prompt=False)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
    )


def test_default_chatml_template():
    prompt = render_chat(DEFAULT_CHATML_TEMPLATE, CONVERSATION[1:3], add_generation_prompt=True)
    assert prompt == (
        "<|im_start|>user\nCapital of France?<|im_end|>\n"
        "<|im_start|>assistant\nParis.<|im_end|>\n<|im_start|>assistant\n"
    )


def test_bos_eos_and_extra_variables_reach_the_template():
    template = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ greeting }}"
    prompt = render_chat(
        template,
        CONVERSATION[1:2],
        add_generation_prompt=False,
        bos_token="<s>",
        eos_token="</s>",
        greeting="!",
    )
    assert prompt == "<s>Capital of France?</s>!"


def test_raise_exception_surfaces_as_chat_template_error():
    template = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversation roles must start with user') }}{% endif %}"
    )
    with pytest.raises(ChatTemplateError, match="Conversation roles must start with user"):
        render_chat(template, CONVERSATION, add_generation_prompt=False)


def test_blocks_trim_like_hugging_face():
    # trim_blocks drops the newline after a tag; lstrip_blocks the indent before one.
    template = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n"
    template += "    {% endif %}\n{% endfor %}"
    assert render_chat(template, CONVERSATION, add_generation_prompt=False) == (
        "[Capital of France?]\n[And of Italy?]\n"
    )


def test_tojson_keeps_unicode_and_takes_indent():
    template = "{{ messages[0] | tojson }}|{{ {'a': [1]} | tojson(indent=2) }}"
    prompt = render_chat(
        template, [{"role": "user", "content": "héllo <b>"}], add_generation_prompt=False
    )
    assert prompt == '{"role": "user", "content": "héllo <b>"}|{\n  "a": [\n    1\n  ]\n}'


def test_loop_controls_and_generation_tag():
    template = (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{% generation %}{{ m.role[0] }}{% endgeneration %}"
        "{% if loop.index == 3 %}{% break %}{% endif %}{% endfor %}"
    )
    assert render_chat(template, CONVERSATION, add_generation_prompt=False) == "ua"


def test_strftime_now_is_available():
    prompt = render_chat("{{ strftime_now('%Y') }}", [], add_generation_prompt=False)
    assert prompt.isdigit() and len(prompt) == 4


def test_sandbox_refuses_mutation_and_internals():
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        render_chat("{{ messages.append(1) }}", [], add_generation_prompt=False)
    with pytest.raises(ChatTemplateError, match="SecurityError"):
        render_chat("{{ ''.__class__.__mro__ }}", [], add_generation_prompt=False)


def test_broken_templates_raise_chat_template_error():
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat("{% for m in messages %}", [], add_generation_prompt=False)
    with pytest.raises(ChatTemplateError, match="TypeError"):
        render_chat(
            "{{ 'a' + messages[0].content }}", [{"content": 3}], add_generation_prompt=False
        )


def test_compiled_templates_are_cached():
    assert compile_template(SMOLLM2_TEMPLATE) is compile_template(SMOLLM2_TEMPLATE)
