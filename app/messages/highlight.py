"""Syntax classes for code blocks: Pygments when it is installed and knows the language,
otherwise a small generic highlighter (strings, comments, numbers, common keywords)."""

from __future__ import annotations

import re

try:
    from pygments import lex
    from pygments.lexers import get_lexer_by_name
    from pygments.token import Comment, Keyword, Name, Number, Operator, String
    from pygments.util import ClassNotFound
except ImportError:  # pragma: no cover - pygments is optional
    lex = None

Span = tuple[int, int, str]  # (start, length, class) over the code's text

# fmt: off
GENERIC_KEYWORDS = (
    "and", "as", "async", "await", "break", "case", "catch", "class", "const", "continue",
    "def", "defer", "del", "do", "elif", "else", "enum", "export", "extends", "false", "final",
    "finally", "fn", "for", "from", "func", "function", "go", "if", "impl", "import", "in",
    "interface", "is", "lambda", "let", "loop", "match", "mod", "mut", "new", "nil", "none",
    "not", "null", "or", "package", "pass", "pub", "raise", "return", "self", "static",
    "struct", "super", "switch", "this", "throw", "true", "try", "type", "use", "var", "void",
    "where", "while", "with", "yield",
)
# fmt: on
GENERIC = re.compile(
    r"(?P<comment>#[^\n]*|//[^\n]*|/\*.*?\*/)"
    r"|(?P<string>\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|`[^`]*`)"
    r"|(?P<number>\b\d+(?:\.\d+)?\b)"
    r"|(?P<keyword>\b(?:" + "|".join(GENERIC_KEYWORDS) + r")\b)",
    re.DOTALL | re.IGNORECASE,
)


def code_spans(code: str, language: str) -> list[Span]:
    lexer = _lexer(language)
    if lexer is None:
        return [(m.start(), m.end() - m.start(), m.lastgroup or "") for m in GENERIC.finditer(code)]
    spans, at = [], 0
    for token_type, value in lex(code, lexer):
        kind = _pygments_class(token_type)
        if kind:
            spans.append((at, len(value), kind))
        at += len(value)
    return spans


def _lexer(language: str):
    if lex is None or not language:
        return None
    try:
        return get_lexer_by_name(language.strip().lower(), stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def _pygments_class(token_type) -> str:
    if token_type in Comment:
        return "comment"
    if token_type in String:
        return "string"
    if token_type in Number:
        return "number"
    if token_type in Keyword:
        return "keyword"
    if token_type in Name.Decorator:
        return "decorator"
    if token_type in Name.Builtin:
        return "builtin"
    if token_type in Name.Function or token_type in Name.Class:
        return "name"
    if token_type in Operator:
        return "operator"
    return ""
