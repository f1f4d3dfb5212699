"""Facts: what the host, its runtimes, the Hub cache and the model are, read and checked, nothing decided."""
