"""The last remote connection, as the settings file keeps it: URL, model, timeouts and
TLS verification. Its API key is the key store's (app/remote/key_store.py), never here."""

from __future__ import annotations

from PySide6.QtCore import QSettings

from app.remote.key_store import KeyStore
from engine.remote.connection import (
    DEFAULT_CONNECT_TIMEOUT_S,
    DEFAULT_READ_TIMEOUT_S,
    RemoteConnection,
)

GROUP = "remote"


def load_connection(qsettings: QSettings, keys: KeyStore) -> RemoteConnection | None:
    """The connection saved last, its key from the key store; None when there is none
    (or what the file holds is not a valid connection)."""
    url = str(qsettings.value(f"{GROUP}/url", "") or "")
    if not url:
        return None
    try:
        return RemoteConnection(
            base_url=url,
            model=str(qsettings.value(f"{GROUP}/model", "") or ""),
            api_key=keys.load(url),
            connect_timeout_s=float(
                qsettings.value(f"{GROUP}/connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S)
            ),
            read_timeout_s=float(
                qsettings.value(f"{GROUP}/read_timeout_s", DEFAULT_READ_TIMEOUT_S)
            ),
            verify_tls=str(qsettings.value(f"{GROUP}/verify_tls", "true")).lower() != "false",
        )
    except (TypeError, ValueError):
        return None


def save_connection(qsettings: QSettings, keys: KeyStore, connection: RemoteConnection) -> None:
    qsettings.setValue(f"{GROUP}/url", connection.base_url)
    qsettings.setValue(f"{GROUP}/model", connection.model)
    qsettings.setValue(f"{GROUP}/connect_timeout_s", connection.connect_timeout_s)
    qsettings.setValue(f"{GROUP}/read_timeout_s", connection.read_timeout_s)
    qsettings.setValue(f"{GROUP}/verify_tls", "true" if connection.verify_tls else "false")
    qsettings.sync()
    keys.save(connection.base_url, connection.api_key)
