"""One module per kernel of the linear op: its config, its ``supports`` reasons and its launcher."""
