"""The conversation core: the message tree, the SQLite store, export/import and the reply
being streamed. Plain Python: nothing here imports Qt (an import contract and a test
without PySide6 hold it to that)."""
