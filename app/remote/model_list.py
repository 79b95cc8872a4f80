"""A server's /v1/models fetched off the GUI thread, for the connection dialog's list."""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Signal

from engine.remote.connection import RemoteConnection


class ModelListFetch(QObject):
    listed = Signal(object, object)  # the RemoteConnection asked, list[str] of model ids
    failed = Signal(object, str)  # the RemoteConnection asked, what went wrong

    def start(self, connection: RemoteConnection) -> None:
        threading.Thread(target=self._fetch, args=(connection,), daemon=True).start()

    def _fetch(self, connection: RemoteConnection) -> None:
        from engine.remote.client import describe_error, list_models, make_client

        client = make_client(connection)
        try:
            ids = [model.id for model in list_models(client)]
        except Exception as exc:  # any failure is the person's to read, not a crash
            self.failed.emit(connection, describe_error(exc, connection))
            return
        finally:
            client.close()
        self.listed.emit(connection, ids)
