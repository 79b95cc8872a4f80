"""The switch to a remote server: Model ▸ Connect to server… opens the dialog, and a
connection filled in there is saved (the key to the key store) and sent to the engine
as `ConnectRemote`. The header then shows the server's model as it shows a local one
(ModelLoaded); opening a local model switches back."""

from __future__ import annotations

from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtWidgets import QWidget

from app.bridge import EngineBridge
from app.models.model_header import ModelHeader
from app.remote.connect_dialog import ConnectDialog
from app.remote.key_store import KeyStore
from app.remote.saved_connection import load_connection, save_connection
from engine.remote.connection import ConnectRemote, RemoteConnection


class RemoteConnector(QObject):
    notice = Signal(str)  # something to tell once (no keyring: the key lasts this session)

    def __init__(
        self,
        bridge: EngineBridge,
        header: ModelHeader,
        qsettings: QSettings,
        dialog_parent: QWidget,
        keys: KeyStore | None = None,
    ) -> None:
        super().__init__(dialog_parent)
        self.bridge, self.header, self.qsettings = bridge, header, qsettings
        self.keys = keys or KeyStore()
        self._dialog_parent = dialog_parent
        self.dialog: ConnectDialog | None = None
        self.connection: RemoteConnection | None = None  # the last one connected to

    def saved_connection(self) -> RemoteConnection | None:
        return self.connection or load_connection(self.qsettings, self.keys)

    def open_dialog(self) -> ConnectDialog:
        """The dialog, filled in with the connection used last; Connect switches to it."""
        dialog = ConnectDialog(self.saved_connection(), self._dialog_parent)
        dialog.accepted.connect(lambda: self.connect_to(dialog.connection()))
        dialog.finished.connect(dialog.deleteLater)
        self.dialog = dialog
        dialog.open()
        return dialog

    def connect_to(self, connection: RemoteConnection) -> None:
        save_connection(self.qsettings, self.keys, connection)
        if self.keys.note:
            self.notice.emit(self.keys.note)
        self.connection = connection
        model = f" ({connection.model})" if connection.model else ""
        self.header.show_message(f"Connecting to {connection.label}{model}…")
        self.bridge.submit(ConnectRemote(connection))
