"""MiniLM embedding-cosine protocol of docs/accuracy.md: python exp.py '<json list of [fmt, kwargs]>' [calset]"""
import copy, json, sys, time
import torch
from microscale import demo
from microscale.accuracy import quantize_model
torch.manual_seed(0)
torch.set_num_threads(2)
base = demo._load_model("cpu"); base.eval()
ref = demo._embed(base, demo.SENTENCES, 32)
CAL = ["A woman is slicing an onion in the kitchen.", "The board approved the new budget.", "Rain is expected tomorrow afternoon.",
       "Neural networks learn representations from data.", "He plays the piano every evening.", "The bridge was closed for repairs.",
       "Children are building a sandcastle on the beach.", "The company reported higher profits this quarter."] * 4
calset = sys.argv[2] if len(sys.argv) > 2 else "cal8x4"
if calset != "cal8x4":
    import importlib.util
    spec = importlib.util.spec_from_file_location("cal", "/tmp/mxacc/cal.py"); mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    CAL = getattr(mod, calset)
def cal(m): m.encode(CAL, batch_size=32, show_progress_bar=False)
for fmt, kw in json.loads(sys.argv[1]):
    if kw.pop("cal", False):
        kw["calibration"] = cal
    t = time.time()
    m = quantize_model(copy.deepcopy(base), fmt, **kw)
    tq = time.time() - t
    e = demo._embed(m, demo.SENTENCES, 32)
    cos = torch.nn.functional.cosine_similarity(e, ref, dim=-1)
    kw.pop("calibration", None)
    print(json.dumps({"fmt": fmt, "kw": kw, "cal": calset, "cos_mean": round(float(cos.mean()), 5),
                      "cos_min": round(float(cos.min()), 5), "t_s": round(tq, 1)}), flush=True)
