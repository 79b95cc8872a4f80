"""The chat pane: the controller that sends, edits and streams, the message pane and the
composer."""
