"""The one skip-pattern dialect, shared by ``quantize_model`` (module names) and checkpoint
conversion (tensor names).

A pattern with a wildcard (``*``, ``?``, ``[``) is an fnmatch pattern on the whole name or
on any dotted suffix of it: ``"pooler*"`` matches ``pooler.dense`` and ``bert.pooler.dense``.
A pattern without one matches a run of whole dotted components: ``"lm_head"`` matches
``lm_head``, ``model.lm_head`` and ``lm_head.weight``, ``"self_attn"`` matches
``layers.0.self_attn.q_proj``, but ``"attn"`` does not match ``self_attn``.
"""
from __future__ import annotations

import fnmatch
from typing import Iterable

_WILD = "*?["


def skip_matches(name: str, patterns: Iterable[str]) -> str | None:
    """The first pattern of ``patterns`` that matches ``name`` (see the module doc), or None."""
    for p in patterns:
        if any(c in p for c in _WILD):
            if fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(name, "*." + p):
                return p
        elif f".{p}." in f".{name}.":
            return p
    return None
