"""``run_bench``: plan the variants, launch every (variant, round) in its own process, and build the
report; ``write_json`` stores it."""
import os

from ...atomic import write_json as _write_json_atomic
from ...config import MODES
from ...errors import ConfigError, NbrgcError
from .figures import aggregate
from .flops import (FLOPS_FORMULA, executed_flops_per_token, flops_per_token, gemm_shape_for,
                    non_embedding_params)
from .launch import launch
from .plan import BASE, arm_overrides, default_n_stages, interleaved, plan_variants


def run_bench(config="small", modes=MODES, threads=(2,), repeats=3,
              warmup_steps=3, steps=20, batch=None, seq=0, n_stages=None, stage_groups=("auto",),
              stage_workers=(0,), max_staleness=1, attention=("store",), dataset="default",
              data_dir=None, seed=0, gemm_peak=False,
              gemm_shape=None, timeout=None, model_overrides=None, log=None, kernel_profile=0):
    """Run the benchmark and return the report dict (``settings``, ``machine``, ``runs`` with every
    raw figure, ``summary`` rows, ``gemm_peak``, ``kernel_profile``, ``notes``). ``kernel_profile``
    > 0 also times one BP step kernel by kernel, averaged over that many steps, in a fresh process
    per thread count and attention setting."""
    from ...config import TrainConfig, preset, preset_batch
    from ..machine import describe_machine, machine_line
    from ...model import Layout
    from ..peers import available
    log = log or (lambda msg: None)
    mcfg = preset(config, **(model_overrides or {}))
    batch = batch if batch is not None else preset_batch(config)
    modes = list(modes)
    for name, v, lo in (("repeats", repeats, 1), ("steps", steps, 1), ("warmup_steps", warmup_steps, 0),
                        ("batch", batch, 1), ("seq", seq, 0), ("kernel_profile", kernel_profile, 0)):
        if not isinstance(v, int) or v < lo:
            raise ConfigError(f"{name.replace('_', '-')} must be an integer >= {lo}, got {v!r}")
    threads = list(threads)
    if not threads or any((not isinstance(t, int)) or t < 1 for t in threads):
        raise ConfigError(f"threads must be integers >= 1, got {threads!r}")
    n_stages = n_stages if n_stages else default_n_stages(mcfg.n_layer)
    notes = []
    if "torch" in modes:
        ok, why = available("torch")
        if not ok:
            modes.remove("torch")
            notes.append(why)
            log(why)
    if not modes:
        raise ConfigError("no mode left to run")
    stage_groups = list(stage_groups) if stage_groups else ["auto"]
    tcs = {}
    for m in modes:
        for _, _, g, w, att in plan_variants([m], stage_groups, stage_workers, attention):
            arm = arm_overrides(m) or {}  # a study arm: its own fields
            mode = arm.get("mode", m if m != "torch" else "bp")
            kw = dict(max_staleness=max_staleness)
            kw.update(arm, mode=mode)
            kw.setdefault("n_stages", n_stages if mode != "bp" else 1)
            tc = TrainConfig(steps=warmup_steps + steps,
                             warmup=max(1, (warmup_steps + steps) // 20), batch=batch, seq=seq,
                             seed=seed, threads=threads[0], stage_threads=g, stage_workers=w,
                             attention=att, **kw)
            seq_eff = tc.validate_for(mcfg)
            tcs[(m, g, w, att)] = tc
    from ...data import load_dataset
    ds = load_dataset(dataset, data_dir=data_dir, log=log, seq=seq_eff)  # downloads/checks once
    if len(ds.train) < seq_eff + 1:
        raise NbrgcError(f"train split of {ds.name} is shorter than one window of {seq_eff}")
    if BASE not in modes:
        notes.append("bp not among --modes: no ratios to BP")
    flops = flops_per_token(mcfg, seq_eff)
    variants = plan_variants(modes, stage_groups, stage_workers, attention)
    machine = describe_machine()
    gemm = {}
    if gemm_peak:
        shape = list(gemm_shape or gemm_shape_for(mcfg, batch, seq_eff))
        for t in threads:
            log(f"GEMM peak, {t} thread(s), shape {shape}")
            gemm[t] = launch({"kind": "gemm", "shape": shape, "threads": t}, timeout=timeout)
    records = []
    order = interleaved(variants, threads, repeats)
    for i, (t, rnd, (label, mode, groups, workers, att)) in enumerate(order):
        tc = tcs[(mode, groups, workers, att)]
        tc_d = dict(tc.to_dict(), threads=t)
        spec = {"kind": "train", "mode": mode, "label": label, "threads": t, "round": rnd,
                "model": mcfg.to_dict(), "train": tc_d, "warmup_steps": warmup_steps, "steps": steps,
                "data": dataset, "data_dir": data_dir,
                "groups": None if groups == "auto" else [int(v) for v in groups.split(",")]}
        log(f"[{i + 1}/{len(order)}] {label}, {t} thread(s), round {rnd + 1}")
        res = launch(spec, timeout=timeout)
        res.update(label=label, round=rnd, threads=t, mode=mode,
                   flops_per_token=flops,
                   executed_flops_per_token=executed_flops_per_token(
                       mcfg, seq_eff, tc.mode if mode != "torch" else mode,
                       tc.n_stages if mode != "torch" else 1, tc))
        log(f"    {res['tokens_per_s']:,.0f} tokens/s, {res['ms_per_step']:.1f} ms/step, peak RSS "
            f"{res['peak_rss_mib']:.0f} MiB")
        records.append(res)
    profiles = []
    for t in threads if kernel_profile else ():
        for att in attention:
            log(f"kernel profile of a BP step, {t} thread(s), attention {att}")
            profiles.append(launch({"kind": "profile", "model": mcfg.to_dict(), "batch": batch,
                                    "seq": seq_eff, "threads": t, "attention": att, "seed": seed,
                                    "repeats": kernel_profile}, timeout=timeout))
    settings = {"config": config, "model": mcfg.to_dict(), "modes": modes,
                "variants": [v[0] for v in variants], "threads": threads, "repeats": repeats,
                "warmup_steps": warmup_steps, "steps": steps, "batch": batch, "seq": seq_eff,
                "n_stages": n_stages, "stage_groups": stage_groups, "stage_workers": list(stage_workers),
                "attention": list(attention),
                "max_staleness": max_staleness,
                "dataset": dataset, "seed": seed, "order": [[t, r, v[0]] for t, r, v in order],
                "n_params": Layout(mcfg).size, "non_embedding_params": non_embedding_params(mcfg)}
    report = {"settings": settings, "machine": machine, "machine_line": machine_line(machine),
              "flops_formula": FLOPS_FORMULA, "flops_per_token": flops,
              "gemm_peak": {str(t): g for t, g in gemm.items()}, "kernel_profile": profiles,
              "runs": records,
              "summary": aggregate(records, flops, gemm), "notes": notes,
              "method": ("each run in a fresh process, rounds interleaved; timed span: after warm-up "
                         "steps and a drain, from the first timed submit to the end of drain(); "
                         "tokens/s = completed tokens / wall; ratios to BP per round, then median")}
    return report


def write_json(report, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return _write_json_atomic(path, report)
