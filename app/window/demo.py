"""Screenshot mode: a fixed demo database rendered offscreen to a PNG, no model needed."""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.conversation.store import ConversationStore

DEMO_MODEL = dict(
    path="~/.cache/branchchat/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    name="SmolLM2-135M-Instruct",
    family="llama",
    num_parameters=134_515_008,
    quantization="Q4_1",
    context_length=8192,
    backend="mlx · gpu",
)
DEMO_STATUS = "36.9 tok/s · TTFT 0.19 s · accepted 71% · ctx 1.3k/8k · reused 1,184 · prefilled 46"

ITINERARY = """A plan that mixes sights and food:

- **Day 1 — Ribeira.** Walk the river and cross the *Dom Luís I* bridge at sunset.
- **Day 2 — Downtown.** Livraria Lello, São Bento's tiles, then a *francesinha*.
- **Day 3 — Gaia.** A port lodge tour, then tram 1 out to Foz do Douro."""

HELPER = """Sure. This splits it by weight, so the day with the port tasting gets more:

```python
def split_budget(total: float, weights: list[float]) -> list[float]:
    scale = total / sum(weights)
    shares = [round(w * scale, 2) for w in weights]
    shares[-1] += round(total - sum(shares), 2)  # keep the sum exact
    return shares
```"""

STATS_1 = dict(generated_tokens=164, decode_tok_s=41.3, ttft_s=0.23, drafted=88, accepted=61,
               prompt_tokens=52, reused_tokens=0, prefilled_tokens=52)  # fmt: skip
STATS_2 = dict(generated_tokens=141, decode_tok_s=38.2, ttft_s=0.21, drafted=118, accepted=87,
               prompt_tokens=1230, reused_tokens=1184, prefilled_tokens=46)  # fmt: skip


def seed_demo(store: ConversationStore, now: float | None = None) -> str:
    """Fill `store` with the demo conversations; returns the one to show."""
    now = time.time() if now is None else now
    hour, day = 3600.0, 86400.0
    for title, age in [
        ("Sourdough schedule", 9 * day),
        ("Regex for ISO dates", 4 * day),
        ("Explain KV caches", 1.2 * day),
        ("Lighthouse keeper poem", 1.1 * day),
        ("Fibonacci in Rust", 3 * hour),
    ]:
        c = store.create_conversation(title, created_at=now - age)
        user = store.add_message(c.id, None, "user", title, created_at=now - age)
        store.add_message(c.id, user.id, "assistant", "…", created_at=now - age + 5)
    c = store.create_conversation("Three days in Porto", created_at=now - hour)
    t = now - hour
    first = store.add_message(
        c.id, None, "user", "I have three days in Porto in March. What should I see?", created_at=t
    )
    reply = store.add_message(
        c.id, first.id, "assistant", ITINERARY, stats=STATS_1, created_at=t + 9
    )
    store.add_message(c.id, reply.id, "user", "And a budget splitter in Python?", created_at=t + 60)
    question = store.add_message(
        c.id,
        reply.id,
        "user",
        "Could you write a tiny Python helper that splits my budget across the days?",
        created_at=t + 90,
    )
    store.add_message(c.id, question.id, "assistant", "Sure! " + HELPER[:90], created_at=t + 95)
    answer = store.add_message(
        c.id, question.id, "assistant", HELPER, stats=STATS_2, created_at=t + 120,
        draft_spans=_demo_spans(HELPER),
    )  # fmt: skip
    store.select(answer.id)
    return c.id


def _demo_spans(text: str) -> tuple[tuple[int, int], ...]:
    """Every other run of words, as speculative decoding would leave them."""
    spans, at, toggle = [], 0, False
    for piece in text.split(" "):
        if toggle and len(piece) > 2:
            spans.append((at, at + len(piece)))
        toggle = not toggle if len(piece) % 3 else toggle
        at += len(piece) + 1
    return tuple(spans)


class NullEngine:
    """Stands in for the engine where none is wanted (screenshots): accepts and ignores."""

    def __init__(self, listener: Any) -> None:
        self.listener = listener

    def submit(self, command: Any) -> None:
        pass

    def close(self) -> None:
        pass


def take_screenshot(path: str | Path, *, dark: bool = False, size=(1200, 800)) -> Path:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QSettings
    from PySide6.QtGui import QFont
    from PySide6.QtWidgets import QApplication

    from app.bridge import EngineBridge
    from app.theme import DARK, LIGHT, apply_theme
    from app.window.main_window import MainWindow
    from engine.events import ModelLoaded

    app = QApplication.instance() or QApplication(["branchchat"])
    assert isinstance(app, QApplication)
    app.setFont(QFont("DejaVu Sans", 10))
    theme = DARK if dark else LIGHT
    apply_theme(app, theme)
    out = Path(path)
    with tempfile.TemporaryDirectory() as tmp:
        store = ConversationStore(Path(tmp) / "demo.sqlite3")
        conversation_id = seed_demo(store)
        qsettings = QSettings(str(Path(tmp) / "settings.ini"), QSettings.Format.IniFormat)
        window = MainWindow(store, EngineBridge(NullEngine), qsettings, theme=theme)
        window.apply_settings(replace(window.settings, tint_drafted=False))
        window.resize(*size)
        window.show()
        window.header.show_loaded(ModelLoaded(**DEMO_MODEL))
        window.controller.open_conversation(conversation_id)
        window.composer.set_status(DEMO_STATUS)
        for _ in range(5):
            app.processEvents()
        window.chat.list_view.scroll_to_bottom()
        app.processEvents()
        out.parent.mkdir(parents=True, exist_ok=True)
        window.grab().save(str(out))
        window.close()
        store.close()
    return out
