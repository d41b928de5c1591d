"""The most a pipeline of single-thread stage workers could gain over BP on this machine.

rgc-async's speed-up over BP at a budget of T threads comes from running T independent single-thread
workers instead of one T-thread BP step. Its ceiling, before RGC's extra decoder passes, is what T
*independent* single-thread BP processes reach together, against one T-thread BP process: that
measures how well BP itself scales over the T cores (the study's 1.38x at 31 cores came from BP
scaling badly there) and what shared caches and memory bandwidth cost when every core works.

Each round runs one T-thread BP process, then T single-thread BP processes started together, each in
a fresh process through the bench worker (same warm-up, same timed steps), and reports
sum(tokens/s of the T) / tokens/s of the one, per round.

    python3 benchmarks/concurrency_ceiling.py --config small --threads 2 --repeats 3 --out benchmarks/small-ceiling.json
"""
import argparse
import json
import os
import statistics
import sys
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from nbrgc.measure import bench  # noqa: E402
from nbrgc.config import TrainConfig, preset, preset_batch  # noqa: E402
from nbrgc.measure.machine import describe_machine, machine_line  # noqa: E402


def spec_for(mcfg, tc, threads, rnd, warmup, steps):
    return {"kind": "train", "mode": "bp", "label": f"bp-{threads}", "threads": threads, "round": rnd,
            "model": mcfg.to_dict(), "train": dict(tc.to_dict(), threads=threads),
            "warmup_steps": warmup, "steps": steps, "data": "default", "data_dir": None, "groups": None}


def concurrent(specs):
    out, errors = [None] * len(specs), []

    def one(i):
        try:
            out[i] = bench.launch(specs[i])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    ths = [threading.Thread(target=one, args=(i,)) for i in range(len(specs))]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    if errors:
        raise errors[0]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="small")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup-steps", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    mcfg = preset(a.config)
    B = preset_batch(a.config)
    tc = TrainConfig(mode="bp", steps=a.warmup_steps + a.steps, warmup=1, batch=B)
    rounds = []
    for r in range(a.repeats):
        one = bench.launch(spec_for(mcfg, tc, a.threads, r, a.warmup_steps, a.steps))
        many = concurrent([spec_for(mcfg, tc, 1, r, a.warmup_steps, a.steps) for _ in range(a.threads)])
        rates = [m["tokens_per_s"] for m in many]
        rounds.append({"round": r, "bp_threads": one["tokens_per_s"], "single_thread_each": rates,
                       "ratio": sum(rates) / one["tokens_per_s"]})
        print(f"round {r + 1}: BP at {a.threads} threads {one['tokens_per_s']:,.0f} tokens/s; "
              f"{a.threads} concurrent single-thread BP processes "
              f"{' + '.join(f'{v:,.0f}' for v in rates)} = {sum(rates):,.0f}; "
              f"ratio {rounds[-1]['ratio']:.3f}", file=sys.stderr, flush=True)
    ratios = [x["ratio"] for x in rounds]
    machine = describe_machine()
    print(f"## Concurrency ceiling: {a.config}, {a.threads} threads, {a.repeats} rounds of {a.steps} "
          f"timed steps\n\nMachine: {machine_line(machine)}\n")
    print("| round | BP, one process, T threads (tokens/s) | T single-thread BP processes at once "
          "(tokens/s, summed) | ratio |\n|---:|---:|---:|---:|")
    for x in rounds:
        print(f"| {x['round'] + 1} | {x['bp_threads']:,.0f} | {sum(x['single_thread_each']):,.0f} "
              f"({' + '.join(f'{v:,.0f}' for v in x['single_thread_each'])}) | {x['ratio']:.3f} |")
    print(f"\nmedian ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max "
          f"{max(ratios):.3f}): the most T single-thread stage workers could gain over T-thread BP here, "
          "before RGC's extra decoder passes.")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"config": a.config, "threads": a.threads, "steps": a.steps,
                       "warmup_steps": a.warmup_steps, "rounds": rounds,
                       "median_ratio": statistics.median(ratios),
                       "machine": machine},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
