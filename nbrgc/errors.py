"""The one exception type users see: a clear, one-line message naming the problem."""


class NbrgcError(Exception):
    """A user-facing error (bad flag, bad file, impossible config). The CLI prints it on one line."""


class ConfigError(NbrgcError, ValueError):
    """A configuration value that cannot work."""


class DataError(NbrgcError):
    """A dataset file that is missing, corrupt, too short or unreachable."""


class CheckpointError(NbrgcError):
    """A checkpoint that cannot be loaded (truncated, corrupt, wrong config or version)."""


class DivergenceError(NbrgcError):
    """Non-finite loss or gradients."""


class StageError(NbrgcError):
    """A stage worker of the asynchronous pipeline raised; carries the stage index."""

    def __init__(self, stage, cause):
        self.stage = stage
        self.cause = cause
        super().__init__(f"stage {stage} failed: {type(cause).__name__}: {cause}")
