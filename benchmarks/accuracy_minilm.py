"""MiniLM embedding-cosine protocol of docs/accuracy.md (CPU, float32): all-MiniLM-L6-v2's
sentence embeddings of microscale.demo.SENTENCES (32) against the float32 model's, after
accuracy.quantize_model with the given options; GPTQ calibrates on CAL8x4 (8 sentences x 4)
or CAL64 (64 distinct sentences, none of them in the test set).

    python benchmarks/accuracy_minilm.py '[["mxfp4", {"method": "gptq", "cal": true, "rotate": "hadamard"}]]' CAL64
"""
import copy
import json
import sys
import time

import torch

from microscale import demo
from microscale.accuracy import quantize_model

CAL8 = ["A woman is slicing an onion in the kitchen.", "The board approved the new budget.", "Rain is expected tomorrow afternoon.",
        "Neural networks learn representations from data.", "He plays the piano every evening.", "The bridge was closed for repairs.",
        "Children are building a sandcastle on the beach.", "The company reported higher profits this quarter."]
MORE = [
    "The river flooded the lower part of the village after three days of heavy rain.",
    "Our flight was cancelled, so we spent the night at an airport hotel.",
    "Can you recommend a good book about the history of mathematics?",
    "The surgeon explained the risks of the operation to the family.",
    "Compilers translate high-level code into machine instructions.",
    "A small bakery on the corner sells croissants until noon.",
    "The city council voted to expand the bicycle lanes downtown.",
    "My grandmother grew tomatoes, beans and peppers in her garden.",
    "The telescope captured images of a galaxy billions of light years away.",
    "Shares of the bank dropped after the earnings call.",
    "He apologized for arriving late to the meeting.",
    "The hikers reached the summit just before the storm arrived.",
    "Vaccines train the immune system to recognize a virus.",
    "The printer is out of paper again, could someone refill it?",
    "Two goals in the final minutes secured the victory for the home team.",
    "The database query took several seconds because the index was missing.",
    "She studied law in London before moving to Toronto.",
    "Fresh snow covered the mountains overnight.",
    "The museum's new exhibition features modern sculpture from Japan.",
    "Please submit your application before the end of the month.",
    "The startup raised twenty million dollars in its latest funding round.",
    "A cold wind blew across the empty parking lot.",
    "The teacher asked the students to write an essay about their summer.",
    "Memory bandwidth often limits the speed of large language models.",
    "The old castle is now a hotel with a famous restaurant.",
    "Traffic was light on the highway this morning.",
    "The orchestra tuned their instruments before the concert began.",
    "Antibiotics do not work against viral infections.",
    "The detective found a clue hidden under the floorboards.",
    "Solar panels were installed on the roof of the school.",
    "What time does the pharmacy close on Sundays?",
    "The puppy fell asleep in a basket by the fireplace.",
    "Engineers tested the new engine in extreme cold.",
    "The government announced new rules for online privacy.",
    "He scored the highest mark in the chemistry exam.",
    "Tourists crowded the narrow streets of the old town.",
    "The chef added a pinch of salt and a splash of lemon juice.",
    "Gradient descent updates the weights in the direction that lowers the loss.",
    "Our neighbors are repainting their house a bright yellow.",
    "The ship sailed out of the harbor at dawn.",
    "Economists expect inflation to slow next year.",
    "The library lends laptops to students for free.",
    "A sudden power outage stopped the factory for two hours.",
    "The poem describes a journey through a dark forest.",
    "Whales migrate thousands of kilometers every year.",
    "The referee showed him a red card for a dangerous tackle.",
    "I need to renew my passport before the trip.",
    "The lab measured the temperature every ten minutes for a week.",
    "Farmers are worried about the long dry summer.",
    "The app crashes whenever I try to upload a photo.",
    "An old man was feeding pigeons in the square.",
    "The treaty was signed by twelve countries in Geneva.",
    "She painted the portrait using only shades of blue.",
    "Cloud storage makes it easy to share large files.",
    "The marathon runners passed the bridge at around ten o'clock.",
    "The price of coffee has doubled in two years.",
]
CAL64 = CAL8 + MORE
CAL32 = CAL8 + MORE[:24]
CAL8x4 = CAL8 * 4


def main(configs: str, calset: str = "CAL8x4") -> None:
    torch.manual_seed(0)
    base = demo._load_model("cpu")
    base.eval()
    ref = demo._embed(base, demo.SENTENCES, 32)
    sentences = globals()[calset]

    def cal(m):
        m.encode(sentences, batch_size=32, show_progress_bar=False)

    for fmt, kw in json.loads(configs):
        if kw.pop("cal", False):
            kw["calibration"] = cal
        t = time.time()
        m = quantize_model(copy.deepcopy(base), fmt, **kw)
        tq = time.time() - t
        cos = torch.nn.functional.cosine_similarity(demo._embed(m, demo.SENTENCES, 32), ref, dim=-1)
        kw.pop("calibration", None)
        print(json.dumps({"fmt": fmt, "kw": kw, "cal": calset, "cos_mean": round(float(cos.mean()), 5),
                          "cos_min": round(float(cos.min()), 5), "t_s": round(tq, 1)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
