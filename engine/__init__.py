"""The inference engine: models, loaders, tokenizer, state and rollback, sampling,
speculative decoding and the engine thread. Never imports Qt.

Importing it has no side effects: the process-wide settings (OpenBLAS's spin time, the
C kernel's threads) are applied by `engine.config.configure_process`, which each entry
point calls before NumPy loads."""
