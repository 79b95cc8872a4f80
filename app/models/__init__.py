"""The model header above the chat, and loading or fetching the model it shows."""
