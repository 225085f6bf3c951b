"""Triton kernels (private modules, one per op family)."""
