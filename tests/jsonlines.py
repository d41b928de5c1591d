"""A stream for a Trainer's JSON lines that keeps the records and can ask the run to stop."""
import io
import json


class JsonLines(io.StringIO):
    """Collects the JSON records; calls ``trainer.request_stop("test stop")`` on the first record for
    which ``stop_when(rec)`` is true (set ``trainer`` after building the Trainer)."""

    def __init__(self, stop_when=None):
        super().__init__()
        self.stop_when, self.trainer, self.records, self._buf = stop_when, None, [], ""

    def write(self, s):
        self._buf += s
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            if not line.strip():
                continue
            rec = json.loads(line)
            self.records.append(rec)
            if self.stop_when is not None and self.stop_when(rec):
                self.trainer.request_stop("test stop")
        return len(s)
