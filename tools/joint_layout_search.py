"""Search load-time layouts of E2M1 code words that both decodes handle cheaply: the bf16 pairs
of the tensor-core kernels (magnitude bits at 6-8 / 22-24, signs at 15 / 31) and the f16 pairs of
the one-token GEMV (magnitude bits at 9-11 / 25-27, same signs), for one layout of the word.

Cost model (integer ops per 32-bit word of 8 codes, 4 pair registers per decode): a pair
register is an OR of terms ``rotl(w, r) & mask``, one op per term (the first an ``and``, each
further one a ``lop3``), plus one op per distinct nonzero rotation over the whole decode. Each
pair's two magnitude triples and its two signs are units (16 bits apart, one rotation each);
in the bf16 decode magnitudes and signs move by the same rotation, in the f16 decode the
magnitudes move 3 further. Enumerates every placement of the units (~2e7) and prints the Pareto
front of (bf16 ops, f16 ops) with one layout each: the magnitude triples' start residues mod
16, the sign residues, the magnitude and sign rotations (bf16). Decodes that share intermediate
registers between pairs (the GEMV's select decode: 12 ops on the canonical layout) are outside
this model. ~90 s.

    python tools/joint_layout_search.py
"""
from __future__ import annotations

import itertools


def costs(mag_rot: list[int], sign_rot: list[int]) -> tuple[int, int]:
    """(bf16 ops, f16 ops) per word for pairs whose magnitude triples move by ``mag_rot`` and
    whose signs by ``sign_rot`` in the bf16 decode."""
    rb = len((set(mag_rot) | set(sign_rot)) - {0})
    rf = len((set((x + 3) % 32 for x in mag_rot) | set(sign_rot)) - {0})
    tb = sum(1 if a == s else 2 for a, s in zip(mag_rot, sign_rot))
    tf = sum(1 if (a + 3) % 32 == s else 2 for a, s in zip(mag_rot, sign_rot))
    return tb + rb, tf + rf


def search() -> dict:
    """``{(bf16 ops, f16 ops): (triple starts, sign residues, magnitude rotations, sign
    rotations)}``, the first layout found for each cost pair."""
    best: dict = {}
    for starts in itertools.permutations(range(16), 4):  # each pair's magnitude triple, mod 16
        occ: set = set()
        for st in starts:
            tri = {(st + i) % 16 for i in range(3)}
            if occ & tri:
                break
            occ |= tri
        else:
            a16 = [(6 - st) % 16 for st in starts]
            for signs in itertools.permutations(sorted(set(range(16)) - occ)):
                s16 = [(15 - q) % 16 for q in signs]
                for la in itertools.product((0, 16), repeat=4):  # which half is which: +16
                    mag = [(x + lift) % 32 for x, lift in zip(a16, la)]
                    for ls in itertools.product((0, 16), repeat=4):
                        sgn = [(x + lift) % 32 for x, lift in zip(s16, ls)]
                        best.setdefault(costs(mag, sgn), (starts, signs, mag, sgn))
    return best


def main() -> None:
    best = search()
    front = [k for k in sorted(best) if not any(o[0] <= k[0] and o[1] <= k[1] and o != k for o in best)]
    print("bf16 ops, f16 ops: triple starts (mod 16), sign residues, magnitude / sign rotations")
    for k in front:
        print(k, best[k])


if __name__ == "__main__":
    main()
