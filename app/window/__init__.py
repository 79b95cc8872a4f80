"""The main window that wires the panes together, its banner, conversation files and the
screenshot demo."""
