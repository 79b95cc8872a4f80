"""The inference engine: models, loaders, tokenizer, state and rollback, sampling,
speculative decoding and the engine thread. Never imports Qt."""
