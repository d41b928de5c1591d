"""Peers to benchmark nbrgc against. Each is optional: the package never depends on them.

``torch``: the same architecture and optimizer in eager PyTorch (:mod:`nbrgc.measure.peers.torch_peer`).
"""
import importlib.util

PEERS = ("torch",)


def available(name):
    """(True, version) when peer ``name`` can run here, else (False, a one-line reason)."""
    if name != "torch":
        return False, f"unknown peer {name!r} (known: {', '.join(PEERS)})"
    if importlib.util.find_spec("torch") is None:
        return False, "PyTorch is not installed (pip install torch): the torch peer is skipped"
    from importlib import metadata
    try:
        return True, metadata.version("torch")
    except metadata.PackageNotFoundError:  # pragma: no cover - a torch without metadata
        return True, "unknown"
