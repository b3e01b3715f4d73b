"""Client SDK and CLI for data owners, analysts and model owners."""
