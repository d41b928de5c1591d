"""The trainer's throughput clock: what its tokens/s counts and what it leaves out."""
import time


class TrainingClock:
    """Training throughput: tokens of steps over the time spent in steps, without start-up, pauses
    (evaluation, checkpoints) and the first step of a process, which loads the kernels."""

    def __init__(self, start, tokens_per_step):
        self.first_timed, self.tokens_per_step = start + 1, tokens_per_step
        self.train_time, self.timed_tokens, self.seg_t0 = 0.0, 0, time.perf_counter()

    def restart(self):
        """A training segment starts (after set-up or a pause)."""
        self.seg_t0 = time.perf_counter()

    def submitting(self, step, t):
        if step == self.first_timed:
            self.seg_t0 = t

    def finished(self, step):
        if step >= self.first_timed:
            self.timed_tokens += self.tokens_per_step

    def pause(self, step, now):
        """The segment ends at ``now``, after ``step`` steps were submitted."""
        if step > self.first_timed:
            self.train_time += now - self.seg_t0

    def tokens_per_s_at(self, now):
        """The rate so far, the current segment up to ``now`` included (the log lines)."""
        if not self.timed_tokens:
            return 0.0
        return self.timed_tokens / max(1e-9, self.train_time + now - self.seg_t0)

    def tokens_per_s(self):
        """The rate over the closed segments (the summary)."""
        return self.timed_tokens / self.train_time if self.train_time > 0 else 0.0
