"""Model ▸ Connect to server…: the server's URL, its API key, the model (listed from its
/v1/models), timeouts and TLS verification. It edits a RemoteConnection; the connector
(app/remote/connector.py) keeps it and switches the engine to it."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.remote.model_list import ModelListFetch
from app.settings.spin_boxes import double_box
from engine.remote.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    RemoteConnection,
)

URL_HINT = "http://127.0.0.1:8080/v1"
SERVERS = (
    "llama-server, vLLM, SGLang, LM Studio (http://localhost:1234/v1) or Ollama "
    "(http://localhost:11434/v1): any OpenAI-compatible server."
)


class ConnectDialog(QDialog):
    def __init__(self, connection: RemoteConnection | None = None, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Connect to server")
        self.setMinimumWidth(520)
        self.url = QLineEdit(connection.base_url if connection else "", self)
        self.url.setPlaceholderText(URL_HINT)
        self.api_key = QLineEdit(connection.api_key if connection else "", self)
        self.api_key.setEchoMode(QLineEdit.EchoMode.Password)
        self.api_key.setPlaceholderText("none (kept in the system keyring)")
        self.model = QComboBox(self)
        self.model.setEditable(True)  # a name the list does not show yet can be typed
        self.model.setMinimumContentsLength(24)
        if connection and connection.model:
            self.model.addItem(connection.model)
        self.fetch_button = QPushButton("Fetch models", self)
        self.fetch_button.clicked.connect(self.fetch_models)
        model_row = QWidget(self)
        row = QHBoxLayout(model_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.model, 1)
        row.addWidget(self.fetch_button)
        self.connect_timeout = double_box(
            0.5,
            120.0,
            0.5,
            connection.connect_timeout_s if connection else DEFAULT_CONNECT_TIMEOUT_S,
        )
        self.read_timeout = double_box(
            1.0, 3600.0, 5.0, connection.read_timeout_s if connection else DEFAULT_READ_TIMEOUT_S
        )
        self.verify_tls = QCheckBox("Verify the server's TLS certificate", self)
        self.verify_tls.setChecked(connection.verify_tls if connection else True)
        self.status = QLabel(SERVERS, self)
        self.status.setWordWrap(True)
        form = QFormLayout()
        form.addRow("Server URL", self.url)
        form.addRow("API key", self.api_key)
        form.addRow("Model", model_row)
        form.addRow("Connect timeout (s)", self.connect_timeout)
        form.addRow("Read timeout (s)", self.read_timeout)
        form.addRow("", self.verify_tls)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        self.connect_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.connect_button.setText("Connect")
        self.buttons.accepted.connect(self._accept_if_valid)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(self.buttons)
        self._fetch = ModelListFetch(self)
        self._fetch.listed.connect(self._on_listed)
        self._fetch.failed.connect(self._on_fetch_failed)
        self.url.textChanged.connect(self._update_buttons)
        self._update_buttons()

    def connection(self) -> RemoteConnection:
        """The connection as filled in (ValueError: the URL or a timeout is not valid)."""
        return RemoteConnection(
            base_url=self.url.text().strip(),
            model=self.model.currentText().strip(),
            api_key=self.api_key.text().strip(),
            connect_timeout_s=self.connect_timeout.value(),
            read_timeout_s=self.read_timeout.value(),
            verify_tls=self.verify_tls.isChecked(),
        )

    def fetch_models(self) -> None:
        try:
            connection = self.connection()
        except ValueError as exc:
            self.status.setText(str(exc))
            return
        self.fetch_button.setEnabled(False)
        self.status.setText(f"Asking {connection.api_base}/models…")
        self._fetch.start(connection)

    def _on_listed(self, connection: RemoteConnection, ids: list[str]) -> None:
        self.fetch_button.setEnabled(True)
        typed = self.model.currentText().strip()
        self.model.clear()
        self.model.addItems(ids)
        if typed in ids:
            self.model.setCurrentText(typed)
        count = f"{len(ids)} model{'s' if len(ids) != 1 else ''}"
        self.status.setText(f"{connection.api_base} serves {count}." if ids else "No models.")

    def _on_fetch_failed(self, _connection: RemoteConnection, message: str) -> None:
        self.fetch_button.setEnabled(True)
        self.status.setText(message)

    def _update_buttons(self) -> None:
        has_url = bool(self.url.text().strip())
        self.connect_button.setEnabled(has_url)
        self.fetch_button.setEnabled(has_url)

    def _accept_if_valid(self) -> None:
        try:
            self.connection()
        except ValueError as exc:
            self.status.setText(str(exc))
            return
        self.accept()
