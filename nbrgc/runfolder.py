"""The run folder: its ``run.json`` says which run it holds, so that a new run never lands on an
earlier one by accident (``--resume`` continues it, ``--force`` starts over, removing its
checkpoints first so that a later ``--resume`` cannot find the old run)."""
import json
import os

from . import checkpoint as ckpt
from .atomic import write_json
from .errors import NbrgcError

CONFIG_FILE = "run.json"


def prepare_run_folder(out, mine, resume, force, info):
    """Create or check ``out`` for the run described by ``mine`` (model_config, train_config, data)
    and write its run.json; a one-line NbrgcError when the folder cannot take this run."""
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise NbrgcError(f"cannot use {out} as the run folder: {exc.strerror or exc}") from None
    path = os.path.join(out, CONFIG_FILE)
    if os.path.exists(path) and not force:
        try:
            with open(path) as f:
                theirs = json.load(f)
            if not isinstance(theirs, dict):
                raise ValueError
        except (OSError, ValueError):
            raise NbrgcError(f"{path} is unreadable; pass --force to start a new run there") from None
        if not resume:
            raise NbrgcError(f"{out} already holds a run; pass --resume to continue it or "
                             "--force to start over")
        if theirs.get("model_config") != mine["model_config"]:
            raise NbrgcError(f"{out} holds a run with another model config; use another --out or "
                             "--force")
    if force and not resume:  # starting over: a later --resume must not find the old run
        old = ckpt.list_checkpoints(out)
        for p in old:
            try:
                os.remove(p)
            except OSError as exc:
                raise NbrgcError(f"--force: cannot remove {p}: {exc.strerror or exc}") from None
        if old:
            info(f"--force: removed {len(old)} checkpoint(s) of the previous run in {out}")
    write_json(path, mine)
