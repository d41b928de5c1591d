"""Quality and the non-inferiority test: BP against RGC over paired seeds (the engine of
``nbrgc-study``).

Every (method, seed) run trains with the same model config, dataset and token budget; seed ``s`` gives
every method the same initial weights and the same training batches (``Trainer`` seeds both
``Model`` and ``Batches`` with ``TrainConfig.seed``) and the same held-out batches. For each seed the
relative gap is ``Δ_s = (bpb_rgc - bpb_bp) / bpb_bp`` of the final validation bits per byte; the
verdict is :func:`nbrgc.stats.noninferiority`'s: non-inferior only when the upper bound of the
two-sided 95% t-interval of mean Δ is below the margin (the paired bootstrap is reported alongside).

Runs live in ``OUT/runs/<method>-s<seed>-<hash>/`` (the hash covers the method, seed, model config,
training config, budget and dataset), each a normal ``Trainer`` run folder (``run.json``,
``log.jsonl``, checkpoints at every evaluation) plus ``result.json``, written atomically when the run
completes. A second call reuses every ``result.json`` whose key matches and resumes any run folder
without one from its newest checkpoint, so only what is missing is computed.
"""
import hashlib
import json
import math
import os
import shutil
import sys
import time

from .errors import ConfigError, NbrgcError

RESULT_FILE = "result.json"
REPORT_FILE = "study.json"
CURVES_FILE = "curves.png"
BASE = "bp"
METHODS = ("bp", "rgc-sync", "rgc-async")
# fields that cannot change a run's result (the worker count and the attention memory mode give the
# same bits, tested): a study continued with other values reuses its finished runs
_NOT_IN_KEY = ("log_every", "keep", "ckpt_every", "stage_workers", "attention")


class StudyInterrupted(NbrgcError):
    """A run was stopped (SIGINT/SIGTERM) after checkpointing; rerunning resumes it."""


def parse_methods(text):
    methods = [m.strip().lower() for m in str(text).split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ConfigError(f"unknown method {bad[0]!r} in --methods; choose from {', '.join(METHODS)}")
    if len(set(methods)) != len(methods):
        raise ConfigError(f"--methods lists a method twice: {text!r}")
    if BASE not in methods:
        raise ConfigError("--methods must include bp (every gap is measured against it)")
    if len(methods) < 2:
        raise ConfigError("--methods needs bp and at least one RGC method (rgc-async, rgc-sync)")
    return [BASE] + [m for m in methods if m != BASE]


def parse_seeds(text):
    """``"5"`` -> [0, 1, 2, 3, 4]; ``"0,3,7"`` -> [0, 3, 7]."""
    s = str(text).strip()
    try:
        if "," in s:
            seeds = [int(v) for v in s.split(",") if v.strip()]
        else:
            n = int(s)
            if n < 1:
                raise ConfigError(f"--seeds must be >= 1, got {n}")
            seeds = list(range(n))
    except ValueError:
        raise ConfigError(f"--seeds must be a count or a comma list of seeds, got {text!r}") from None
    if not seeds or any(v < 0 for v in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds must be distinct integers >= 0, got {text!r}")
    return seeds


def train_config(method, seed, base):
    """The TrainConfig of one run: ``base`` (a dict of TrainConfig fields) with this mode and seed."""
    from .config import TrainConfig
    d = dict(base, mode=method, seed=seed)
    if method == BASE:
        d["n_stages"] = 1
        d["stage_threads"] = "auto"
        d["stage_workers"] = 0
    return TrainConfig(**d)


def run_key(method, seed, mcfg, tc, data_spec, data_bytes):
    tcd = {k: v for k, v in tc.to_dict().items() if k not in _NOT_IN_KEY}
    return {"method": method, "seed": int(seed), "model_config": mcfg.to_dict(), "train_config": tcd,
            "budget": {"steps": tc.steps, "tokens": tc.steps * tc.batch * (tc.seq or mcfg.ctx)},
            "data": data_spec, "data_bytes": list(data_bytes)}


def run_id(key):
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return f"{key['method']}-s{key['seed']}-{h}"


def _write_json_atomic(path, obj):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_result(run_dir, key):
    """The cached result of a completed run, or None (missing, unreadable or another key)."""
    path = os.path.join(run_dir, RESULT_FILE)
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError):
        return None
    if res.get("key") != json.loads(json.dumps(key)):
        return None
    return res


def read_curve(log_path, tokens_per_step):
    """[(step, tokens, val_bpb)] from a run's log.jsonl (the last record wins for a repeated step,
    e.g. after a resume)."""
    pts = {}
    try:
        with open(log_path) as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut by an interruption
                if rec.get("summary") or rec.get("val_bpb") is None or "step" not in rec:
                    continue
                pts[int(rec["step"])] = float(rec["val_bpb"])
    except OSError:
        return []
    return [[s, s * tokens_per_step, v] for s, v in sorted(pts.items())]


def compare(bpb, methods, seeds, margin=0.01, conf=0.95, n_boot=10000):
    """Per RGC method: :func:`nbrgc.stats.noninferiority` on the seeds both it and BP have.

    ``bpb``: {(method, seed): final val bpb}. Returns {method: dict(noninferiority(...), seeds,
    bpb_bp, bpb)}.
    """
    from .stats import noninferiority
    out = {}
    for m in methods:
        if m == BASE:
            continue
        paired = [s for s in seeds if (BASE, s) in bpb and (m, s) in bpb]
        if not paired:
            out[m] = {"n": 0, "seeds": [], "non_inferior": False, "verdict": "no paired seeds yet"}
            continue
        bp = [bpb[(BASE, s)] for s in paired]
        rg = [bpb[(m, s)] for s in paired]
        res = noninferiority(bp, rg, margin=margin, conf=conf, n_boot=n_boot, seed=0)
        out[m] = dict(res, seeds=paired, bpb_bp=bp, bpb=rg)
    return out


class Study:
    """``Study(...).run()`` trains what is missing and returns the report dict."""

    def __init__(self, dataset="default", config="small", methods=("bp", "rgc-async"), seeds=(0, 1),
                 steps=None, tokens=None, margin=0.01, out=None, batch=None, seq=0, lr=1e-3,
                 warmup=None, eval_every=None, eval_batches=8, n_stages=None, stage_threads="auto",
                 stage_workers=0, attention="store", max_staleness=1, threads=0, data_dir=None,
                 model_overrides=None, conf=0.95,
                 n_boot=10000, delete_checkpoints=False, log=None, verbose=False, dataset_obj=None):
        from .bench import default_n_stages
        from .config import PRESET_BATCH, preset
        if not out:
            raise ConfigError("a study needs an output folder (--out DIR)")
        self.out = out
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.verbose = verbose
        self.config = config
        self.mcfg = preset(config, **(model_overrides or {}))
        self.methods = list(methods)
        for m in self.methods:
            if m not in METHODS:
                raise ConfigError(f"unknown method {m!r}; choose from {', '.join(METHODS)}")
        if BASE not in self.methods or len(self.methods) < 2:
            raise ConfigError("methods must include bp and at least one RGC method")
        self.methods = [BASE] + [m for m in self.methods if m != BASE]
        self.seeds = list(seeds)
        if not self.seeds:
            raise ConfigError("no seeds")
        self.margin = float(margin)
        if not (math.isfinite(self.margin) and self.margin > 0):
            raise ConfigError(f"margin must be a finite number > 0, got {margin!r}")
        self.conf, self.n_boot = conf, n_boot
        batch = batch if batch is not None else PRESET_BATCH.get(config, 8)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"batch must be an integer >= 1, got {batch!r}")
        seq_eff = seq or self.mcfg.ctx
        if tokens is not None:
            if tokens < 1:
                raise ConfigError(f"tokens must be >= 1, got {tokens}")
            steps = max(1, -(-int(tokens) // (batch * seq_eff)))
        if steps is None:
            steps = 300
        if steps < 1:
            raise ConfigError(f"steps must be >= 1, got {steps}")
        eval_every = eval_every if eval_every is not None else max(1, steps // 10)
        self.base_tc = dict(steps=int(steps), batch=batch, seq=seq, lr=lr,
                            warmup=warmup if warmup is not None else max(0, steps // 20),
                            eval_every=eval_every, eval_batches=eval_batches, threads=threads,
                            n_stages=n_stages or default_n_stages(self.mcfg.n_layer),
                            stage_threads=stage_threads, stage_workers=stage_workers,
                            attention=attention, max_staleness=max_staleness, keep=1,
                            ckpt_every=0, log_every=max(1, min(10, steps)))
        self.tcs = {m: train_config(m, self.seeds[0], self.base_tc) for m in self.methods}
        for tc in self.tcs.values():
            self.seq = tc.validate_for(self.mcfg)
        self.dataset, self.data_dir = dataset, data_dir
        self.delete_checkpoints = delete_checkpoints
        self._ds = dataset_obj

    # ------------------------------------------------------------------ pieces
    def data(self):
        if self._ds is None:
            from .data import load_dataset
            self._ds = load_dataset(self.dataset, data_dir=self.data_dir, log=self.log, seq=self.seq)
        return self._ds

    def plan(self):
        """[(method, seed, key, run_dir)] in run order: seed by seed, every method of a seed together
        (an interrupted study leaves complete pairs)."""
        ds = self.data()
        out = []
        for s in self.seeds:
            for m in self.methods:
                tc = train_config(m, s, self.base_tc)
                key = run_key(m, s, self.mcfg, tc, self.dataset, (len(ds.train), len(ds.val)))
                out.append((m, s, key, os.path.join(self.out, "runs", run_id(key))))
        return out

    def _train(self, method, seed, key, run_dir):
        from .trainer import Trainer
        tc = train_config(method, seed, self.base_tc)
        resume = os.path.exists(os.path.join(run_dir, "run.json"))
        note = (lambda m: self.log("    " + m)) if self.verbose else (lambda m: None)
        t0 = time.perf_counter()
        trainer = Trainer(self.mcfg, tc, self.data(), run_dir, resume=resume, json_lines=False,
                          progress=False, log=note, data_spec=self.dataset)
        summary = trainer.run()
        if summary.get("stopped"):
            raise StudyInterrupted(f"{summary['stopped']}: {method} seed {seed} checkpointed at step "
                                   f"{summary['steps']}; rerun the same command to resume")
        curve = read_curve(os.path.join(run_dir, "log.jsonl"), tc.batch * self.seq)
        val = summary.get("val_bpb")
        if val is None and summary["steps"] == tc.steps and curve and curve[-1][0] == tc.steps:
            val = curve[-1][2]  # finished before, result.json not yet written: its final evaluation
        if val is None:
            raise NbrgcError(f"{method} seed {seed}: no validation bpb (empty validation split?)")
        res = {"key": key, "method": method, "seed": seed, "run_dir": os.path.basename(run_dir),
               "val_bpb": val, "val_stage_bpb": summary.get("val_stage_bpb"),
               "steps": summary["steps"], "tokens": tc.steps * tc.batch * self.seq,
               "train_tokens_per_s": summary["tokens_per_s"], "wall_s": summary["wall_s"],
               "resumed": resume, "this_call_s": time.perf_counter() - t0,
               "stage_threads": summary.get("stage_threads"), "curve": curve}
        _write_json_atomic(os.path.join(run_dir, RESULT_FILE), res)
        if self.delete_checkpoints:
            from .checkpoint import list_checkpoints
            for p in list_checkpoints(run_dir):
                try:
                    os.remove(p if os.path.isabs(p) else os.path.join(run_dir, p))
                except OSError:
                    pass
        return res

    # ------------------------------------------------------------------ the study
    def run(self):
        os.makedirs(os.path.join(self.out, "runs"), exist_ok=True)
        plan = self.plan()
        results, computed, cached = [], [], []
        for i, (m, s, key, d) in enumerate(plan):
            res = load_result(d, key)
            tag = f"[{i + 1}/{len(plan)}] {m} seed {s}"
            if res is None and os.path.exists(os.path.join(d, RESULT_FILE)):
                self.log(f"{tag}: {os.path.join(d, RESULT_FILE)} is unreadable or another run's: "
                         "training it again")
                shutil.rmtree(d)
            if res is not None:
                cached.append(res["run_dir"])
                self.log(f"{tag}: cached, val bpb {res['val_bpb']:.4f}")
            else:
                self.log(f"{tag}: training {self.base_tc['steps']} steps"
                         + (" (resuming)" if os.path.exists(os.path.join(d, "run.json")) else ""))
                try:
                    res = self._train(m, s, key, d)
                except StudyInterrupted:
                    raise
                except NbrgcError as exc:
                    raise NbrgcError(f"{m} seed {s} ({d}): {exc}") from exc
                computed.append(res["run_dir"])
                self.log(f"{tag}: val bpb {res['val_bpb']:.4f} in {res['this_call_s']:.1f} s")
            results.append(res)
        return self.report(results, computed, cached)

    def report(self, results, computed=(), cached=()):
        from .machine import describe_machine, machine_line
        bpb = {(r["method"], r["seed"]): r["val_bpb"] for r in results}
        comparisons = compare(bpb, self.methods, self.seeds, self.margin, self.conf, self.n_boot)
        machine = describe_machine()
        tc = self.tcs[BASE]
        settings = {"dataset": self.dataset, "config": self.config, "model": self.mcfg.to_dict(),
                    "methods": self.methods, "seeds": self.seeds, "steps": tc.steps,
                    "batch": tc.batch, "seq": self.seq, "tokens": tc.steps * tc.batch * self.seq,
                    "margin": self.margin, "conf": self.conf, "train_config": self.base_tc}
        return {"settings": settings, "machine": machine, "machine_line": machine_line(machine),
                "runs": list(results), "comparisons": comparisons, "computed": list(computed),
                "cached": list(cached), "notes": []}


# ---------------------------------------------------------------------------------------------- output
def _pct(x, nd=3):
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.{nd}f}%"


def markdown(report):
    s = report["settings"]
    m = s["model"]
    methods, seeds = s["methods"], s["seeds"]
    rgc = [x for x in methods if x != BASE]
    bpb = {(r["method"], r["seed"]): r["val_bpb"] for r in report["runs"]}
    lines = [f"## nbrgc-study: {s['config']} (L{m['n_layer']} d{m['d_model']} H{m['n_head']} "
             f"ctx{m['ctx']}) on {s['dataset']}, {s['tokens']:,} tokens per run ({s['steps']} steps × "
             f"{s['batch']} × {s['seq']}), {len(seeds)} paired seed(s), margin {100 * s['margin']:g}%",
             "", f"Machine: {report['machine_line']}", "",
             "| seed | " + " | ".join(f"{x} val bpb" for x in methods) + " | "
             + " | ".join(f"Δ {x}" for x in rgc) + " |",
             "|---:|" + "---:|" * (len(methods) + len(rgc))]
    for sd in seeds:
        cells = [f"{bpb[(x, sd)]:.4f}" if (x, sd) in bpb else "–" for x in methods]
        gaps = [_pct((bpb[(x, sd)] - bpb[(BASE, sd)]) / bpb[(BASE, sd)])
                if (x, sd) in bpb and (BASE, sd) in bpb else "–" for x in rgc]
        lines.append(f"| {sd} | " + " | ".join(cells + gaps) + " |")
    lines += ["", "| method | seeds | mean Δ | 95% t-interval | paired bootstrap 95% | verdict |",
              "|---|---:|---:|---|---|---|"]
    for x in rgc:
        c = report["comparisons"][x]
        if not c.get("n"):
            lines.append(f"| {x} | 0 | – | – | – | {c['verdict']} |")
            continue
        lines.append(f"| {x} | {c['n']} | {_pct(c['mean_gap'])} | [{_pct(c['t_lo'])}, {_pct(c['t_hi'])}]"
                     f" | [{_pct(c['boot_lo'])}, {_pct(c['boot_hi'])}] | {c['verdict']} |")
    runs = report["runs"]
    if runs:
        lines.append("")
        for x in methods:
            rs = [r for r in runs if r["method"] == x and r.get("train_tokens_per_s")]
            if rs:
                tps = sum(r["train_tokens_per_s"] for r in rs) / len(rs)
                wall = sum(r["wall_s"] for r in rs) / len(rs)
                lines.append(f"{x}: mean training throughput {tps:,.0f} tokens/s, mean run wall "
                             f"{wall:.1f} s (over {len(rs)} run(s)).")
    lines.append("")
    lines.append("Δ = (bpb_rgc − bpb_bp) / bpb_bp per seed (positive: RGC worse); non-inferior only "
                 "when the upper bound of the t-interval is below the margin.")
    lines.append(f"This call trained {len(report['computed'])} run(s) and reused "
                 f"{len(report['cached'])} cached.")
    for n in report.get("notes", []):
        lines.append(f"Note: {n}")
    return "\n".join(lines) + "\n"


def plot_curves(report, path):
    """Validation bpb against tokens, every method and seed; returns the path or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = {}
    for r in report["runs"]:
        if not r.get("curve"):
            continue
        c = colors.setdefault(r["method"], f"C{len(colors)}")
        xs = [p[1] for p in r["curve"]]
        ys = [p[2] for p in r["curve"]]
        ax.plot(xs, ys, color=c, alpha=0.7, lw=1,
                label=r["method"] if sum(1 for q in report["runs"][:report["runs"].index(r)]
                                         if q["method"] == r["method"]) == 0 else None)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("validation bits per byte")
    ax.set_title(f"nbrgc-study {report['settings']['config']} on {report['settings']['dataset']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(report, out, plot=False):
    """study.json (+ curves.png with ``plot`` when matplotlib is importable) in ``out``."""
    if plot:
        p = plot_curves(report, os.path.join(out, CURVES_FILE))
        if p:
            report["plot"] = p
        else:
            report["notes"].append("matplotlib is not installed: no learning-curve plot "
                                   "(pip install matplotlib)")
    path = os.path.join(out, REPORT_FILE)
    _write_json_atomic(path, report)
    return path
