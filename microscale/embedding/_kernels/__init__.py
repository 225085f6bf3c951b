"""Device code of the embedding family (imports Triton; loaded on first GPU use)."""
