"""The PySide6 application: `python -m app` (app/__main__.py) is its entry point."""
