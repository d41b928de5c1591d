"""rgc-async with checkpoints between evaluations: written from a snapshot beside the stages
(the default) against pausing the pipeline at each one, whole Trainer runs in one process,
interleaved rounds.

    python3 benchmarks/checkpoint_snapshot.py --config small --steps 150 --ckpt-every 10 --rounds 2
"""
import argparse
import tempfile
import time

import nbrgc
from nbrgc.config import TrainConfig
from nbrgc.data import load_dataset
from nbrgc.schemes.rgc_async import RGCAsync
from nbrgc.trainer import Trainer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    cfg, data = nbrgc.preset(a.config), load_dataset("default", log=None)
    snapshot = RGCAsync.can_snapshot

    def one(snap):
        RGCAsync.can_snapshot = snapshot if snap else (lambda self: False)
        tc = TrainConfig(mode="rgc-async", steps=a.steps, eval_every=0, ckpt_every=a.ckpt_every,
                         threads=a.threads)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as out:
            s = Trainer(cfg, tc, data, out, progress=False, log=lambda m: None).run()
        return s["tokens_per_s"], time.perf_counter() - t0

    one(True)  # kernels loaded, caches warm
    print("| round | how | training tokens/s | wall s |\n|---:|---|---:|---:|")
    for r in range(1, a.rounds + 1):
        for snap in (False, True):
            tps, wall = one(snap)
            print(f"| {r} | {'snapshot' if snap else 'pause'} | {tps:,.0f} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    main()
