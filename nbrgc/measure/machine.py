"""A description of the machine a benchmark or study ran on, for the JSON next to its figures.

    from nbrgc.measure.machine import describe_machine, machine_line
    desc = describe_machine()     # dict: cpu, cores, memory, threading layer, BLAS, versions, env
    print(machine_line(desc))     # one line for a Markdown report

Everything here is read-only and best effort: a field that cannot be read is ``None``, never an error.
"""
import os
import platform
import sys

_ENV_PREFIXES = ("OPENBLAS_", "OMP_", "MKL_", "GOTO", "BLIS_", "NUMBA_", "NBRGC_", "KMP_")
_PACKAGES = ("numpy", "numba", "llvmlite", "scipy", "threadpoolctl", "tbb", "torch", "matplotlib")
_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "asimd", "sve")


def _cpuinfo():
    model, flags, sockets, cores = None, None, set(), set()
    phys = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key, val = key.strip(), val.strip()
                if key in ("model name", "Model", "cpu model") and model is None:
                    model = val
                elif key in ("flags", "Features") and flags is None:
                    flags = set(val.split())
                elif key == "physical id":
                    phys = val
                    sockets.add(val)
                elif key == "core id":
                    cores.add((phys, val))
    except OSError:
        pass
    if model is None:
        model = platform.processor() or None
    return {"model": model,
            "flags": sorted(f for f in _FLAGS if flags and f in flags) if flags else None,
            "sockets": len(sockets) or None,
            "physical_cores": len(cores) or None}


def _mem_total_mib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _version(name):
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def blas_info():
    """threadpoolctl's view of every loaded BLAS/OpenMP library: API, version, kernel/architecture,
    threading layer, thread count, file."""
    try:
        import numpy  # noqa: F401  (numpy's BLAS)
        import scipy.linalg.cython_blas  # noqa: F401  (the BLAS nbrgc's GEMMs call)
        from threadpoolctl import threadpool_info
        infos = threadpool_info()
    except Exception as exc:  # noqa: BLE001 - a description must never fail
        return [{"error": f"{type(exc).__name__}: {exc}"}]
    keep = ("user_api", "internal_api", "prefix", "version", "architecture", "threading_layer",
            "num_threads", "filepath")
    try:
        from ..kernels.blas import choose
        gemm_blas = choose()
    except Exception:  # noqa: BLE001
        gemm_blas = None
    out = []
    for i in infos:
        d = {k: i.get(k) for k in keep if k in i}
        path = (d.get("filepath") or "").replace(os.sep, "/")
        if d.get("user_api") == "blas":
            users = ["np.dot (numpy)"] if "/numpy" in path else (["scipy.linalg"] if "/scipy" in path
                                                                  else [])
            if gemm_blas is not None and gemm_blas.loaded_from(d.get("filepath")):
                users.insert(0, "nbrgc GEMMs")
            d["used_by"] = ", ".join(users) or "other"
        out.append(d)
    return out


def describe_machine():
    """A JSON-serialisable dict describing this machine and the software the figures came from."""
    from ..threads import cpu_count
    try:
        import numba
        from ..threads import select_layer
        layer = select_layer()
        numba_threads = numba.config.NUMBA_NUM_THREADS
    except Exception as exc:  # noqa: BLE001
        layer, numba_threads = f"unavailable ({exc})", None
    from .. import __version__
    cpu = _cpuinfo()
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": cpu_count(),
        "memory_mib": _mem_total_mib(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "threading_layer": layer,
        "numba_threads_launched": numba_threads,
        "blas": blas_info(),
        "versions": dict({"nbrgc": __version__}, **{p: _version(p) for p in _PACKAGES}),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
    }


def machine_key(line):
    """A stored machine line with its BLAS libraries in machine_line's order (sorted), so that runs
    on one machine count as one machine, lines written before the sorting included."""
    if not line:
        return "not recorded (a run from before results named their machine)"
    head, sep, blas = line.partition("BLAS: ")
    return head + sep + "; ".join(sorted(blas.split("; "))) if sep else line


def machine_line(desc):
    """One human line: CPU, cores, threading layer, the BLAS nbrgc calls and its kernel."""
    cpu = desc.get("cpu") or {}
    blas = [b for b in desc.get("blas") or [] if b.get("user_api") == "blas"]
    # sorted: one machine gives one line, whatever order the libraries were loaded in
    blas_txt = "; ".join(sorted(f"{b.get('internal_api')} {b.get('version')} {b.get('architecture')} "
                                f"kernel [{b.get('used_by')}]" for b in blas)) or "unknown"
    v = desc.get("versions") or {}
    return (f"{cpu.get('model') or 'unknown CPU'}, {desc.get('usable_cores')} usable of "
            f"{desc.get('logical_cores')} logical cores ({cpu.get('physical_cores') or '?'} physical), "
            f"Numba {v.get('numba')} {desc.get('threading_layer')} layer, NumPy {v.get('numpy')}, "
            f"BLAS: {blas_txt}")
