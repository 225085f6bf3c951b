"""Ranking agreement of embeddings (Spearman of pairwise similarities, top-1 neighbour)
against values worked out by hand."""
import math

import pytest
import torch

from microscale.accuracy.report import embedding_agreement, mark_front, spearman


def _at(degrees, norms=None):
    a = torch.tensor(degrees, dtype=torch.float64) * math.pi / 180
    e = torch.stack([a.cos(), a.sin()], 1)
    return e if norms is None else e * torch.tensor(norms, dtype=torch.float64)[:, None]


def test_spearman_by_hand():
    assert spearman(torch.tensor([1.0, 2, 3, 4]), torch.tensor([10.0, 30, 20, 40])) == pytest.approx(0.8, abs=1e-15)
    # ties share the mean rank: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4) -> 4.5 / sqrt(4.5 * 5)
    assert spearman(torch.tensor([1.0, 2, 2, 3]), torch.tensor([1.0, 2, 3, 4])) == pytest.approx(math.sqrt(0.9),
                                                                                               abs=1e-15)
    assert spearman(torch.tensor([3.0, 1, 2]), torch.tensor([-1.0, -9, -5])) == 1.0  # ranks only
    assert math.isnan(spearman(torch.ones(4), torch.arange(4.0)))
    with pytest.raises(ValueError, match="1-D of equal length"):
        spearman(torch.ones(3), torch.ones(4))


def test_embedding_agreement_by_hand():
    # Texts at angles 0, 50, 110, 200 degrees; the other model moves text 3 to 140 degrees.
    # Pairwise cosines (01, 02, 03, 12, 13, 23): ref cos(50, 110, 200, 60, 150, 90) ranks 6 3 1 5 2 4;
    # emb cos(50, 110, 140, 60, 90, 30) ranks 5 2 1 4 3 6; sum d^2 = 8, rho = 1 - 6*8/(6*35) = 27/35.
    # Nearest other text: ref 1 0 1 2, emb 1 0 3 2 -> 3 of 4 agree. Own cosines: 1, 1, 1, cos 60.
    ref = _at([0, 50, 110, 200])
    emb = _at([0, 50, 110, 140], norms=[2.0, 0.5, 3.0, 1.0])  # norms do not matter
    a = embedding_agreement(ref, emb)
    assert a["spearman"] == pytest.approx(27 / 35, abs=1e-12)
    assert a["top1"] == 0.75
    assert a["cos_mean"] == pytest.approx(3.5 / 4, abs=1e-12) and a["cos_min"] == pytest.approx(0.5, abs=1e-12)
    same = embedding_agreement(ref, ref.float())
    assert same["spearman"] == pytest.approx(1.0, abs=1e-12) and same["top1"] == 1.0
    with pytest.raises(ValueError, match="N >= 3"):
        embedding_agreement(ref[:2], emb[:2])
    with pytest.raises(ValueError, match="equal shape"):
        embedding_agreement(ref, emb[:3])


def test_mark_front_on_any_key():
    rows = [{"bits_per_element": 4.5, "c": 0.98}, {"bits_per_element": 4.25, "c": 0.96},
            {"bits_per_element": 4.5, "c": 0.97}, {"bits_per_element": 8.25, "c": 0.97}]
    assert [r["pareto"] for r in mark_front(rows, "c")] == [True, True, False, False]
