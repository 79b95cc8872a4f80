"""The conversation pane: the message list (or a welcome page when it is empty), editing
in place, and the clipboard. Actions that change the conversation go out as signals."""

from __future__ import annotations

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QLabel, QStackedLayout, QVBoxLayout, QWidget

from app.messages.message_editor import MessageEditor
from app.messages.message_model import MessageModel
from app.messages.message_view import MessageListView
from app.theme import Theme

WELCOME = (
    "<div style='font-size:20pt; font-weight:600; color:{heading}'>What shall we talk about?</div>"
    "<div style='margin-top:8px'>Every edit makes a new branch; nothing is overwritten.</div>"
    "<div style='margin-top:4px'>Enter sends · Shift+Enter new line · Esc stops · "
    "Ctrl+N new chat · Ctrl+F search</div>"
)


class ChatView(QWidget):
    action_triggered = Signal(str, str, object)  # prev/next/regenerate/continue
    edit_saved = Signal(str, str)  # message id, new text
    copied = Signal()  # a message's text went to the clipboard (the window says so)

    def __init__(self, model: MessageModel, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.model = model
        self.list_view = MessageListView(theme, self)
        self.list_view.setModel(model)
        self.welcome = QLabel(WELCOME.format(heading=theme.text), self)
        self.welcome.setObjectName("welcome")
        self.welcome.setWordWrap(True)
        self.welcome.setAlignment(self.welcome.alignment().AlignCenter)
        pages = QWidget(self)
        self._stack = QStackedLayout(pages)
        self._stack.addWidget(self.welcome)
        self._stack.addWidget(self.list_view)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(pages)
        self.list_view.action_triggered.connect(self._on_action)
        delegate = self.list_view.delegate
        delegate.edit_saved.connect(self._on_edit_saved)
        delegate.edit_cancelled.connect(lambda _id: self.end_edit())
        for signal in (model.rowsInserted, model.rowsRemoved, model.modelReset):
            signal.connect(self._update_page)
        self._update_page()

    def set_theme(self, theme: Theme) -> None:
        self.welcome.setText(WELCOME.format(heading=theme.text))
        self.delegate.set_theme(theme)
        self.list_view.doItemsLayout()

    @property
    def delegate(self):
        return self.list_view.delegate

    def _update_page(self, *_args) -> None:
        self._stack.setCurrentIndex(1 if self.model.rowCount() else 0)

    # -- editing ----------------------------------------------------------------------

    @property
    def editing_id(self) -> str | None:
        return self.model.editing_id

    def editor(self) -> MessageEditor | None:
        if self.model.editing_id is None:
            return None
        index = self.model.index(self.model.row_of(self.model.editing_id))
        widget = self.list_view.indexWidget(index)
        return widget if isinstance(widget, MessageEditor) else None

    def begin_edit(self, message_id: str) -> bool:
        if self.model.is_busy or self.model.row_of(message_id) < 0:
            return False
        self.end_edit()
        self.model.set_editing(message_id)
        index = self.model.index(self.model.row_of(message_id))
        self.list_view.openPersistentEditor(index)
        self.list_view.scrollTo(index)
        editor = self.editor()
        if editor is not None:
            editor.focus_end()
        return True

    def end_edit(self) -> None:
        editing = self.model.editing_id
        if editing is None:
            return
        row = self.model.row_of(editing)
        if row >= 0:
            self.list_view.closePersistentEditor(self.model.index(row))
        self.model.set_editing(None)

    def _on_edit_saved(self, message_id: str, text: str) -> None:
        self.end_edit()
        self.edit_saved.emit(message_id, text)

    # -- actions ----------------------------------------------------------------------

    def _on_action(self, message_id: str, action: str, argument: object) -> None:
        row = self.model.row_of(message_id)
        if row < 0:
            return
        item = self.model.item(row)
        if action == "edit":
            self.begin_edit(message_id)
        elif action == "thinking":
            self.model.toggle_thinking(message_id)
        elif action == "copy":
            QGuiApplication.clipboard().setText(item.content)
            self.copied.emit()
        elif action == "copy_code":
            rendered = self.delegate.rendered(item, self.list_view.viewport().width())
            number = int(argument)  # type: ignore[call-overload]
            QGuiApplication.clipboard().setText(rendered.markdown.code_blocks[number].text)
            self.delegate.mark_copied(message_id, number)
            self.list_view.viewport().update()
        elif action == "link":
            QDesktopServices.openUrl(QUrl(str(argument)))
        else:
            self.action_triggered.emit(message_id, action, argument)
