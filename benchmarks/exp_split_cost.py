"""Thirty-third session: what in ``decode_tma``'s split epilogue costs equal stream-K shares ~6-8 us
(28672x8192 NVFP4, 16 tokens)? Ran in the thirty-third session on 5d20f66's kernel, whose split epilogue
it patches (``s33/d``; the kernel since adds up 256-row tiles in their first program, so on later trees the
patch's assert stops it: run it on ``benchmarks/ab_trees.sh --prep 5d20f66``'s tree). Times ``benchmarks/profile_dtma_programs.py`` on copies of the package with
the consumer's split epilogue cut down (wrong results for split tiles: timing only, never kept):
``base``; ``nows``: no workspace, arrivals or sums (every part stores its own sums to the output);
``noarrive``: the partial store to the workspace, then the direct store; ``nosum``: store and arrivals,
no adding up; ``shift``: ``nows`` with every share moved on by half a tile (at 112 programs each
takes the second half of one tile and the first of the next: the split read pattern alone). Env ``PROGRAMS`` as the profile script; prints one line per variant and program count."""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COND = "if (k0 != tile * NCT) | (k1 != (tile + 1) * NCT):"
STORE = "gl.store(ws_ptr + (tile * maxp + gl.program_id(0) - pf) * TILE + elem, acc)"
ARRIVE_START = "z = gl.full([ROWS], 0, gl.int32, gl.SliceLayout(1, mma_l))"
SUM = "acc += gl.load(ws_ptr + (tile * maxp + q) * TILE + elem, mask=lm, other=0.0, cache_modifier=\".cg\")"


def patched(src: str, variant: str) -> str:
    # later kernels still hold COND (their last-arriver path) but add 256-row tiles up in the first program
    assert "OWNER" not in src, "this patch is for 5d20f66's kernel: see the docstring"
    for s in (COND, STORE, ARRIVE_START, SUM):
        assert s in src, s
    if variant == "nows":
        return src.replace(COND, "if (k0 != tile * NCT) & (k0 == tile * NCT):")
    if variant == "noarrive":  # keep the store, then leave the split branch
        i, j = src.index(ARRIVE_START), src.index("scale = post")
        body = src[i:j]
        indent = body.splitlines()[-1]  # the blank indentation before "scale = post"
        return src[:i] + "pass\n" + indent + src[j:]
    if variant == "shift":  # nows, and every share moved by half a tile (112 programs: two halves each)
        old = "return p * T // P, (p + 1) * T // P"
        assert old in src, old
        return patched(src, "nows").replace(old, "return p * T // P + NCT // 2, (p + 1) * T // P + NCT // 2")
    if variant == "nosum":
        return src.replace(SUM, "acc += 0.0")
    return src


def main() -> None:
    env = dict(os.environ)
    for variant in os.environ.get("VARIANTS", "base,nows,noarrive,nosum,shift").split(","):
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.join(ROOT, "microscale"), os.path.join(tmp, "microscale"))
            path = os.path.join(tmp, "microscale", "kernels", "_decode_tma.py")
            with open(path) as f:
                src = f.read()
            with open(path, "w") as f:
                f.write(patched(src, variant))
            env["PYTHONPATH"] = tmp
            out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "profile_dtma_programs.py"),
                                  "time"], env=env, capture_output=True, text=True)
            for line in (out.stdout + out.stderr[-2000:] * (out.returncode != 0)).splitlines():
                print(f"{variant:9s} {line}", flush=True)


if __name__ == "__main__":
    main()
