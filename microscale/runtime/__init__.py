"""What every GPU path shares and that knows no format: target facts, the launcher,
workspaces. Nothing here imports Triton at package import; :mod:`.launch` needs it."""
