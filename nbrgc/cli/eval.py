"""nbrgc-eval: bits per byte of a checkpoint on a dataset split, with the full-context sliding window.

Every byte after the first of the split (or of its first --bytes bytes) is predicted exactly once:
windows of ctx bytes advance by --stride (default ctx/2) and each scores only the bytes no earlier
window scored, so every byte has at least ctx - stride bytes of context (the first window's bytes: all
there are). For RGC checkpoints this is the full network, i.e. the last stage's prediction.
"""
import argparse
import json
import sys

from . import OneLineParser, integer, run_main


def build_parser():
    p = OneLineParser(prog="nbrgc-eval", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", metavar="CKPT", help="a ckpt-*.nbrgc file or a run folder")
    p.add_argument("--dataset", "--data", dest="dataset", default=None,
                   help="enwik8 | tinystories | default | text:PATH | a file path "
                        "(default: the dataset the checkpoint was trained on)")
    p.add_argument("--data-dir", default=None, help="download/cache folder (env NBRGC_DATA)")
    p.add_argument("--split", default="val", help="val (default) or test")
    p.add_argument("--bytes", type=integer, default=None,
                   help="evaluate only the first N bytes of the split (N - 1 predictions)")
    p.add_argument("--batch", type=integer, default=16, help="windows per forward pass (default 16)")
    p.add_argument("--stride", type=integer, default=None, help="window advance (default ctx/2; "
                   "1 gives every byte the full ctx of context)")
    p.add_argument("--threads", type=integer, default=0, help="Numba threads (0: all cores)")
    p.add_argument("--json", action="store_true",
                   help='print one JSON object {"bpb", "bytes", "split", "checkpoint", ...} on stdout')
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv=None):
    return run_main(_main, argv)


def _main(argv):
    a = build_parser().parse_args(argv)
    from ..errors import ConfigError
    split = {"valid": "val", "validation": "val"}.get(a.split, a.split)
    if split not in ("val", "test"):
        raise ConfigError(f"--split must be val or test, got {a.split!r}")
    if a.bytes is not None and a.bytes < 2:
        raise ConfigError(f"--bytes must be >= 2 (the first byte has no context), got {a.bytes}")
    if a.batch < 1:
        raise ConfigError(f"--batch must be >= 1, got {a.batch}")
    if a.stride is not None and a.stride < 1:
        raise ConfigError(f"--stride must be >= 1, got {a.stride}")
    if a.threads < 0:
        raise ConfigError(f"--threads must be >= 0, got {a.threads}")
    log = lambda m: print(m, file=sys.stderr)  # noqa: E731
    from ..sample import load_model
    model, meta, path = load_model(a.checkpoint, log=log)
    spec = a.dataset if a.dataset is not None else meta.get("data") or "default"
    from ..data import load_dataset
    ds = load_dataset(spec, data_dir=a.data_dir, log=log)
    data = ds.split(split)
    ctx = model.cfg.ctx
    if a.stride is not None and a.stride > min(ctx, len(data) - 1):
        raise ConfigError(f"--stride must be <= ctx ({ctx}), got {a.stride}")
    from ..evaluate import sliding_bpb
    from ..threads import cpu_count, limit_blas, set_threads
    limit_blas(1)
    set_threads(a.threads or cpu_count())
    res = sliding_bpb(model, data, ctx, a.batch, n_bytes=a.bytes, progress=not a.quiet,
                      stride=a.stride)
    line = (f"{path}: {split} bpb {res['bpb']:.4f} over {res['bytes_scored']:,} bytes of {ds.name} "
            f"(window {res['ctx']}, stride {res['stride']}, mode {meta.get('mode', '?')}, "
            f"step {meta.get('step', '?')})")
    if a.json:
        print(line, file=sys.stderr)
        print(json.dumps({"bpb": res["bpb"], "bytes": res["bytes_scored"], "split": split,
                          "checkpoint": path, "dataset": spec, "step": meta.get("step"),
                          "mode": meta.get("mode"), "ctx": res["ctx"], "stride": res["stride"]}))
    else:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
