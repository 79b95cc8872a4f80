"""The sidebar: [+ New chat], search across all messages, and the conversation list with
rename (double-click or F2), export and delete in its context menu. From the keyboard, a
chat or hit is opened with Enter and a chat deleted with Delete (the window offers Undo)."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLineEdit,
    QListView,
    QMenu,
    QPushButton,
    QToolButton,
    QVBoxLayout,
)

from app.conversation.store import Conversation, SearchHit
from app.conversation.store_io import ExportFormat
from app.sidebar.conversation_delegate import ConversationDelegate
from app.sidebar.conversation_list_model import ConversationListModel, Row
from app.theme import Theme

SEARCH_DELAY_MS = 150


class Sidebar(QFrame):
    new_chat_requested = Signal()
    import_requested = Signal()
    conversation_selected = Signal(str)
    search_hit_selected = Signal(str, str)  # conversation id, message id
    search_changed = Signal(str)  # the query, after typing pauses ("" when cleared)
    rename_requested = Signal(str, str)
    delete_requested = Signal(str)
    export_requested = Signal(str, str)  # conversation id, an ExportFormat

    def __init__(self, theme: Theme, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.new_button = QPushButton("+  New chat", self)
        self.new_button.setObjectName("newChatButton")
        self.new_button.setCursor(Qt.CursorShape.PointingHandCursor)
        self.menu_button = QToolButton(self)
        self.menu_button.setObjectName("sidebarMenu")
        self.menu_button.setText("⋯")
        self.menu_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(self.menu_button)
        self.import_action = menu.addAction(
            "Import chats (branchchat, ChatGPT, Open WebUI)…", self.import_requested.emit
        )
        self.import_action.setToolTip(
            "A branchchat JSON export, ChatGPT's conversations.json or an Open WebUI export"
        )
        self.menu_button.setMenu(menu)
        self.search = QLineEdit(self)
        self.search.setObjectName("search")
        self.search.setPlaceholderText("Search all messages…")
        self.search.setClearButtonEnabled(True)
        self.model = ConversationListModel(self)
        self.list = QListView(self)
        self.list.setObjectName("conversationList")
        self.list.setModel(self.model)
        self.delegate = ConversationDelegate(self.list, theme)
        self.list.setItemDelegate(self.delegate)
        self.list.setMouseTracking(True)
        self.list.setEditTriggers(
            QAbstractItemView.EditTrigger.DoubleClicked
            | QAbstractItemView.EditTrigger.EditKeyPressed
        )
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        top = QHBoxLayout()
        top.setSpacing(6)
        top.addWidget(self.new_button, 1)
        top.addWidget(self.menu_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 12, 10, 10)
        layout.setSpacing(8)
        layout.addLayout(top)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        self._search_timer = QTimer(self, singleShot=True, interval=SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(lambda: self.search_changed.emit(self.query))
        self.search.textChanged.connect(lambda _text: self._search_timer.start())
        self.new_button.clicked.connect(self.new_chat_requested)
        self.list.clicked.connect(self._on_clicked)
        self.list.activated.connect(self._on_clicked)  # Enter on the current row
        delete = QShortcut(QKeySequence(QKeySequence.StandardKey.Delete), self.list)
        delete.setContext(Qt.ShortcutContext.WidgetShortcut)
        delete.setWhatsThis("Delete the chat (in the chat list)")
        delete.activated.connect(self._delete_current)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.context_menu: QMenu | None = None  # the last right-click's menu
        self.model.rename_requested.connect(self.rename_requested)
        self._current: str | None = None

    @property
    def query(self) -> str:
        return self.search.text().strip()

    def set_theme(self, theme: Theme) -> None:
        self.delegate.theme = theme
        self.list.viewport().update()

    def show_conversations(self, conversations: list[Conversation]) -> None:
        self.model.set_conversations(conversations)
        self.set_current(self._current)

    def show_hits(self, hits: list[SearchHit]) -> None:
        self.model.set_hits(hits, self.query)  # the delegate shows where each matched

    def set_current(self, conversation_id: str | None) -> None:
        self._current = conversation_id
        row = self.model.row_of(conversation_id) if conversation_id else -1
        selection = self.list.selectionModel()
        if row < 0:
            selection.clearSelection()
        else:
            self.list.setCurrentIndex(self.model.index(row))

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _row_at(self, index) -> Row | None:
        return self.model.row(index.row()) if index.isValid() else None

    def _on_clicked(self, index) -> None:
        row = self._row_at(index)
        if row is None or row.kind == "header":
            return
        if row.kind == "hit":
            self.search_hit_selected.emit(row.conversation_id, row.message_id)
        else:
            self.conversation_selected.emit(row.conversation_id)

    def _delete_current(self) -> None:
        row = self._row_at(self.list.currentIndex())
        if row is not None and row.kind == "conversation":
            self.delete_requested.emit(row.conversation_id)

    def _context_menu(self, pos: QPoint) -> None:
        index = self.list.indexAt(pos)
        row = self._row_at(index)
        if row is None or row.kind == "header":
            return
        cid = row.conversation_id
        menu = self.context_menu = QMenu(self)
        if row.kind == "conversation":
            menu.addAction("Rename", lambda: self.list.edit(index))
        export = self.export_requested
        menu.addAction("Export as Markdown…", lambda: export.emit(cid, ExportFormat.MARKDOWN))
        menu.addAction("Export as JSON…", lambda: export.emit(cid, ExportFormat.JSON))
        menu.addSeparator()
        menu.addAction("Delete", lambda: self.delete_requested.emit(cid))
        menu.popup(self.list.viewport().mapToGlobal(pos))
