"""Render a conversation into a model's prompt text with its Jinja chat template.

The environment copies Hugging Face transformers' `apply_chat_template` so that templates
written for it render the same here: a sandbox with trim_blocks/lstrip_blocks, loop
controls, a `tojson` filter that keeps non-ASCII text, and the `raise_exception` and
`strftime_now` globals.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import EngineError

# ChatML, as most small instruct models speak it. A model that ships no template is not
# given this one: it is served as plain text completion (GenerationSettings.raw).
DEFAULT_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(EngineError):
    """The chat template is malformed, or refused the conversation (`raise_exception`)."""


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` renders its body unchanged.

    transformers uses the tag to mark assistant tokens for training masks; some templates
    carry it, and without the extension they would not even compile.
    """

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(f"The chat template refused the conversation: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Unlike jinja's own tojson this neither HTML-escapes nor marks the result safe.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=32)
def compile_template(template: str) -> jinja2.Template:
    """Compile once per distinct template text; later requests reuse the result."""
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"The chat template does not parse (line {e.lineno}): {e}") from e


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """The prompt text for messages ({"role": ..., "content": ...} dicts).

    add_generation_prompt appends the opening of an assistant turn; extra variables (tools,
    enable_thinking, ...) are passed to the template as they are.
    """
    compiled = compile_template(template)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, TypeError, ValueError, LookupError) as e:
        # A template that trips over the conversation (e.g. content that is not a string).
        raise ChatTemplateError(f"The chat template failed: {type(e).__name__}: {e}") from e
