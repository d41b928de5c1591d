"""Held-out bits per byte, stage by stage (each stage boundary read out through the shared decoder).

Runs on a workspace sized for one stage, reused stage after stage, so evaluation adds no memory to an
RGC run; for BP (one stage) it reuses the training workspace.
"""
import math

import numpy as np

LN2 = math.log(2.0)


def stage_losses(model, x, y, stages, ws):
    """Mean loss (nats) at the output of every stage for one batch."""
    x, y = model._check_xy(x, y)
    h = model.embed(x, ws)
    out = []
    for lo, hi in stages:
        h = model.forward_blocks(h, lo, hi, ws)  # copies h into the reused workspace's input
        out.append(float(model.decoder_loss(h, y, ws)))
    return out


def evaluate(model, batches, stages, ws):
    """{'val_loss', 'val_bpb', 'val_stage_bpb'} averaged over ``batches`` (a list of (x, y))."""
    if not batches:
        return {}
    tot = np.zeros(len(stages))
    for x, y in batches:
        tot += stage_losses(model, x, y, stages, ws)
    tot /= len(batches)
    return {"val_loss": float(tot[-1]), "val_bpb": float(tot[-1] / LN2),
            "val_stage_bpb": [float(v / LN2) for v in tot]}
