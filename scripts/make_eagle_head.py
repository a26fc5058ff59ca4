"""Make the EAGLE-style draft head for a model ahead of time (kvcore/model/eagle_head.py): a
linear map over [hidden state ; next token's embedding] fitted by ridge regression on the model's
own greedy text from seeded prompts. Nothing is downloaded. The head is kept in the model cache
($PAGED_KV_LAB_CACHE or ~/.cache/paged-kv-lab); an engine with engine.speculative.method "eagle"
or "mtp" makes it on first use otherwise.

    .venv/bin/python scripts/make_eagle_head.py                 # SmolLM2
    .venv/bin/python scripts/make_eagle_head.py --model tiny-random
    .venv/bin/python scripts/make_eagle_head.py --refit         # fit again, replacing the file
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kvcore.model import load_model  # noqa: E402
from kvcore.model.eagle_head import eagle_head_for, head_path  # noqa: E402
from kvcore.model.shapes import ATTENTION_MODELS  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", choices=ATTENTION_MODELS)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--refit", action="store_true", help="fit again even if the file exists")
    args = ap.parse_args(argv)
    loaded = load_model(args.model, device=args.device)
    path = head_path(loaded)
    if args.refit and path.exists():
        path.unlink()
    start = time.perf_counter()
    head = eagle_head_for(loaded)
    took = time.perf_counter() - start
    size = path.stat().st_size
    print(f"{path} ({size / 1e6:.1f} MB, weight {tuple(head.weight.shape)}) in {took:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
