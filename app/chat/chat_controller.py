"""What the chat does: send, edit, regenerate, continue, stop and branch switching, kept
in the store and streamed into the message model. No widgets here.

Edits never overwrite. Editing a user message adds a sibling user message and generates
a new reply under it. Editing an assistant message adds a sibling assistant message with
the edited text (status "edited") and generates nothing; [Continue] on it asks the model
to carry on from the edited text.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.bridge import EngineBridge
from app.chat.branch_items import branch_items, last_request_line
from app.conversation.branch_copy import copy_branch
from app.conversation.chat_settings import chat_settings_for
from app.conversation.status import MessageStatus, status_after
from app.conversation.store import ConversationStore
from app.conversation.streaming_reply import StreamingReply
from app.conversation.tree import MessageTree
from app.messages.message_model import MessageModel
from app.settings.app_settings import AppSettings
from engine.events import (
    Failed,
    Finished,
    Generate,
    Message,
    ModelLoaded,
    PrefillProgress,
    Stop,
    Tokens,
)
from engine.stats_format import final_line, stats_dict

REPAINT_INTERVAL_MS = 33  # the streamed message is pushed to the view at most ~30 times/s
MAX_REPAINT_INTERVAL_MS = 250
REPAINT_BUDGET = 3  # a push may cost at most 1/3 of the time between pushes
PARTIAL_SAVE_INTERVAL_MS = 2000  # a crash loses at most this much of a streamed reply
KEPT = "Your message stays in the box."
BUSY = f"A reply is still being written: wait for it, or press Esc to stop it. {KEPT}"
NO_MODEL = f"No model is loaded: pick one from the Model menu first. {KEPT}"


class ChatController(QObject):
    conversation_changed = Signal(object)  # the conversation id shown, or None
    conversations_changed = Signal()  # titles / order changed: the sidebar reloads
    busy_changed = Signal(bool)
    status_line = Signal(str)  # live speed figures, then the last request's
    prefill_progress = Signal(int, int, int)  # done, total, reused
    reveal_message = Signal(str)  # scroll to this message
    store_failed = Signal(str, str)  # message, details: a write to the store failed
    send_refused = Signal(str)  # why a send was not taken (the text stays with the person)

    def __init__(
        self,
        store: ConversationStore,
        bridge: EngineBridge,
        settings: Callable[[], AppSettings],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.store, self.bridge, self._settings = store, bridge, settings
        self.model = MessageModel(self)
        self.conversation_id: str | None = None
        self.tree = MessageTree()
        self.active: StreamingReply | None = None
        self.last_store_error: str | None = None  # the last write the store refused
        self.last_refusal: str | None = None  # why the last attempt to generate was refused
        self.context_length: int | None = None
        self.model_name: str | None = None  # the loaded model's; None before any loads
        self.plain_completion = False  # the model has no chat template: text is continued
        self._flush_timer = QTimer(self, singleShot=True, interval=REPAINT_INTERVAL_MS)
        self._flush_timer.timeout.connect(self._flush)
        self._save_timer = QTimer(self, interval=PARTIAL_SAVE_INTERVAL_MS)
        self._save_timer.timeout.connect(self._save_partial)
        bridge.tokens.connect(self._on_tokens)
        bridge.prefill_progress.connect(self._on_prefill)
        bridge.finished.connect(self._on_finished)
        bridge.failed.connect(self._on_failed)
        bridge.model_loaded.connect(self._on_model_loaded)

    @property
    def is_busy(self) -> bool:
        return self.active is not None

    # -- navigation -------------------------------------------------------------------

    def open_conversation(self, conversation_id: str | None, reveal: str | None = None) -> None:
        if reveal is not None:
            self.store.select(reveal)
        self.conversation_id = conversation_id
        self._reload()
        self.conversation_changed.emit(conversation_id)
        line = last_request_line(self.tree, self.active, conversation_id, self.context_length)
        self.status_line.emit(line)
        if reveal is not None:
            self.reveal_message.emit(reveal)

    def new_chat(self) -> None:
        self.open_conversation(None)

    def switch_branch(self, message_id: str, step: int) -> None:
        sibling = self.tree.sibling_at(message_id, step)
        if sibling is not None:
            self.store.select(sibling.id)
            self._reload()

    def last_user_message_id(self) -> str | None:
        users = [item.id for item in self.model.items if item.role == "user"]
        return users[-1] if users else None

    # -- actions ----------------------------------------------------------------------

    def can_generate(self) -> bool:
        """Whether a new reply can start now; if not, `send_refused` says why, before
        anything is saved (no chat or message is created only to fail)."""
        refusal = BUSY if self.is_busy else NO_MODEL if self.model_name is None else None
        self.last_refusal = refusal
        if refusal is not None:
            self.send_refused.emit(refusal)
        return refusal is None

    def send(self, text: str) -> bool:
        """False (the composer keeps the text) when there is nothing to send, a reply is
        running or no model is loaded (`send_refused` says which), or the store could not
        save the message."""
        text = text.strip()
        if not text or not self.can_generate():
            return False
        try:
            if self.conversation_id is None:
                title = " ".join(text.split())[:48] or "New chat"
                self.conversation_id = self.store.create_conversation(title).id
                self.conversation_changed.emit(self.conversation_id)
            path = self.tree.selected_path()
            parent = path[-1].id if path else None
            user = self.store.add_message(self.conversation_id, parent, "user", text)
            self._start_reply(user.id)
        except sqlite3.Error as exc:
            self._report_store_error("your message", exc, "It is still in the message box.")
            return False
        finally:
            self.conversations_changed.emit()
        return True

    def edit_message(self, message_id: str, text: str) -> bool:
        node = self.tree.node(message_id)
        self.last_refusal = self.last_store_error = None
        if self.is_busy or not text.strip() or text == node.content:
            return False
        if node.role == "user" and not self.can_generate():  # a reply would follow
            return False
        assert self.conversation_id is not None
        try:
            if node.role == "user":
                user = self.store.add_message(self.conversation_id, node.parent_id, "user", text)
                self._start_reply(user.id)
            else:
                edited, parent = MessageStatus.EDITED, node.parent_id
                self.store.add_message(self.conversation_id, parent, node.role, text, status=edited)
                self._reload()
        except sqlite3.Error as exc:
            self._report_store_error("the edit", exc, "The editor keeps your text.")
            return False
        return True

    def regenerate(self, message_id: str) -> bool:
        node = self.tree.node(message_id)
        if self.is_busy or node.role != "assistant" or not self.can_generate():
            return False
        return self._try_start_reply(node.parent_id)

    def retry(self, message_id: str) -> bool:
        """Ask again for a reply to the last message, a question left unanswered."""
        path = self.tree.selected_path()
        if self.is_busy or not path or path[-1].id != message_id or path[-1].role != "user":
            return False
        return self.can_generate() and self._try_start_reply(message_id)

    def continue_message(self, message_id: str) -> bool:
        path = self.tree.selected_path()
        node = self.tree.node(message_id)
        is_last = bool(path) and path[-1].id == message_id
        if self.is_busy or not is_last or not node.is_continuable or not self.can_generate():
            return False
        try:
            self.store.update_message(message_id, status=MessageStatus.STREAMING)
        except sqlite3.Error as exc:
            self._report_store_error("the reply", exc)
            return False
        self._submit(path, message_id, base=node.content, spans=node.draft_spans, from_node=node)
        return True

    def branch_into_new_chat(self, message_id: str) -> bool:
        """Keep your work: a new chat holding the path up to `message_id`, opened; the
        original is untouched."""
        if self.conversation_id is None or message_id not in self.tree:
            return False
        try:
            copy = copy_branch(self.store, self.conversation_id, message_id)
        except sqlite3.Error as exc:
            self._report_store_error("the new chat", exc)
            return False
        self.open_conversation(copy.id)
        self.conversations_changed.emit()
        return True

    def stop(self) -> bool:
        if self.active is None or self.active.is_stopping:
            return False
        self.active.is_stopping = True
        self.bridge.submit(Stop(self.active.request_id))
        return True

    def shutdown(self) -> None:
        """The window is closing: keep what a streaming reply has said, as a stopped one."""
        active, self.active = self.active, None
        self._flush_timer.stop()
        self._save_timer.stop()
        if active is not None:
            self.bridge.submit(Stop(active.request_id))
            stopped, stats = MessageStatus.STOPPED, active.window_stats()  # the engine's won't come
            self._save(active.message_id, **active.fields(), status=stopped, stats=stats)

    # -- internals --------------------------------------------------------------------

    def _report_store_error(self, what: str, exc: sqlite3.Error, keep: str = "") -> None:
        self.last_store_error = str(exc)
        full = "full" in str(exc).lower()
        cause = "the disk is full" if full else "the conversation store refused the write"
        message = f"Could not save {what}: {cause}. Messages saved before are safe."
        self.store_failed.emit(f"{message} {keep}".strip(), f"{type(exc).__name__}: {exc}")

    def _save(self, message_id: str, **fields) -> bool:
        """A reply's update; a failure is reported (once a reply) and the reply goes on."""
        try:
            self.store.update_message(message_id, **fields)
            return True
        except sqlite3.Error as exc:
            if self.active is None or not self.active.save_failed:
                self._report_store_error("the reply", exc, "It stays on screen until you leave.")
            if self.active is not None:
                self.active.save_failed = True
            return False

    def _try_start_reply(self, parent_id: str | None) -> bool:
        try:
            self._start_reply(parent_id)
        except sqlite3.Error as exc:
            self._report_store_error("a new reply", exc)
            return False
        return True

    def _start_reply(self, parent_id: str | None) -> None:
        assert self.conversation_id is not None
        reply = self.store.add_message(
            self.conversation_id, parent_id, "assistant", "", status=MessageStatus.STREAMING
        )
        path = self.store.load_tree(self.conversation_id).path_to(reply.id)
        self._submit(path, reply.id, base="", spans=())

    def _submit(self, path, message_id: str, *, base: str, spans, from_node=None) -> None:
        """`from_node`: the message a continuation carries on (its figures and thinking)."""
        assert self.conversation_id is not None
        settings = self._settings()
        chat = chat_settings_for(self.store, self.conversation_id, settings)  # this chat's own
        continuing = bool(base)
        messages = [Message(n.role, n.content) for n in path if continuing or n.id != message_id]
        raw = self.plain_completion  # the texts joined as they are: no template, no system
        messages = messages if raw else chat.with_system_prompt(messages)
        generation = chat.generation_settings(
            drafter=settings.drafter, continue_last=continuing, raw=raw
        )
        request_id = uuid.uuid4().hex
        self.active = StreamingReply.start(
            request_id, self.conversation_id, message_id, base, spans,
            base_stats=from_node.stats if from_node else None,
            base_thinking=from_node.thinking if from_node else "",
        )  # fmt: skip
        self._reload()
        self.model.set_busy(True)
        self.busy_changed.emit(True)
        self.status_line.emit("Waiting for the model…")
        self._save_timer.start()
        self.bridge.submit(Generate(request_id, tuple(messages), generation, self.conversation_id))
        self.reveal_message.emit(message_id)

    def _reload(self) -> None:
        if self.conversation_id is None:
            self.tree = MessageTree()
            self.model.set_items([])
            return
        self.tree = self.store.load_tree(self.conversation_id)
        items = branch_items(self.tree, self.active)
        self.model.set_items(items)

    def _is_mine(self, request_id: str) -> bool:
        return self.active is not None and self.active.request_id == request_id

    def _on_tokens(self, batch: list[Tokens]) -> None:
        active = self.active
        if active is None:
            return
        for event in batch:
            if event.request_id == active.request_id:
                active.add(event)
        if not self._flush_timer.isActive():
            self._flush_timer.start()

    def _flush(self) -> None:
        active = self.active
        if active is None:
            return
        started = time.perf_counter()
        thinking = (active.thinking, active.num_thinking_tokens)
        self.model.update_text(active.message_id, active.text, active.spans, thinking=thinking)
        # A very long reply costs more to lay out each time: push it less often, so
        # the window keeps most of its time for input.
        cost_ms = 1000 * (time.perf_counter() - started)
        interval = min(MAX_REPAINT_INTERVAL_MS, max(REPAINT_INTERVAL_MS, REPAINT_BUDGET * cost_ms))
        self._flush_timer.setInterval(int(interval))
        line = active.live_line(self.context_length)
        if line is not None and active.conversation_id == self.conversation_id:
            self.status_line.emit(line)

    def _save_partial(self) -> None:
        active = self.active
        if active is None or (active.text, active.thinking) == (
            active.saved_text,
            active.saved_thinking,
        ):
            return
        if self._save(active.message_id, **active.fields()):
            active.saved_text, active.saved_thinking = active.text, active.thinking

    def _on_model_loaded(self, event: ModelLoaded) -> None:
        self.model_name = event.name
        self.plain_completion = not event.has_chat_template

    def _on_prefill(self, event: PrefillProgress) -> None:
        if self._is_mine(event.request_id):
            assert self.active is not None
            self.active.on_prefill(event.total, event.reused)
            if self.active.conversation_id == self.conversation_id:
                self.prefill_progress.emit(event.done, event.total, event.reused)

    def _on_finished(self, event: Finished) -> None:
        active = self.active
        if active is None or event.request_id != active.request_id:
            return
        text, spans = active.final_text(event)
        stats = stats_dict(event.stats, reason=event.reason) if event.stats else None
        stats = active.whole_reply_stats(stats)  # a continuation counts the whole reply
        status = status_after(event.reason)
        thinking = active.final_thinking(event)
        saved = self._save(active.message_id, content=text, status=status, stats=stats,
                           draft_spans=spans, thinking=thinking)  # fmt: skip
        if stats and active.conversation_id == self.conversation_id:
            self.status_line.emit(final_line(stats))
        self._end_request(keep_on_screen=None if saved else (text, spans))

    def _on_failed(self, event: Failed) -> None:
        active = self.active
        if active is None or event.request_id != active.request_id:
            return
        kept = None
        if active.text:
            spans, stopped, stats = active.spans, MessageStatus.STOPPED, active.window_stats()
            if not self._save(active.message_id, **active.fields(), status=stopped, stats=stats):
                kept = (active.text, spans)
        else:
            try:
                self.store.discard_empty_message(active.message_id)
            except sqlite3.Error as exc:
                self._report_store_error("the conversation", exc)
        self.status_line.emit("")
        self._end_request(keep_on_screen=kept)

    def _end_request(self, keep_on_screen: tuple[str, tuple] | None = None) -> None:
        """`keep_on_screen`: a reply's (text, spans) the store could not take; the view
        keeps showing it instead of the last saved part."""
        active, self.active = self.active, None
        self._flush_timer.stop()
        self._flush_timer.setInterval(REPAINT_INTERVAL_MS)
        self._save_timer.stop()
        self.prefill_progress.emit(0, 0, 0)
        if active is not None and active.conversation_id == self.conversation_id:
            self._reload()
            if keep_on_screen is not None:
                self.model.update_text(active.message_id, *keep_on_screen)
        self.model.set_busy(False)
        self.busy_changed.emit(False)
        self.conversations_changed.emit()
