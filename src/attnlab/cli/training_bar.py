"""The progress of ``attnlab train``: a bar per run (a plain line per validation in a log), and
the line Ctrl-C ends with."""

from __future__ import annotations

import threading
import time

from .common import err

__all__ = ["BUILDING_NOTICE_SECONDS", "TrainingBar", "interrupted_message"]

BUILDING_NOTICE_SECONDS = 3.0
"""In a log, a run still building its task and model after this many seconds says so (a quick
refusal stays one line)."""


class TrainingBar:
    """The progress of one training run: a bar (step, loss, the last validation score, steps per
    second) where stderr is a terminal, else one plain line per validation (a log file shows the
    run as it goes), a line at its first step and, with ``notice``, one when setting the run up
    takes over :data:`BUILDING_NOTICE_SECONDS` (the bar of the phase that steps first: a run's
    self-pretraining, when it has one)."""

    def __init__(self, bar, label: str, seconds: float | None = None, *, notice: bool = True):
        self.bar, self.label = bar, label
        # a time budget, shown instead of its step cap (TIME_BUDGET_STEPS), and its seconds used
        self.seconds, self.used = seconds, 0.0
        self.task = bar.add_task(f"{label} (building the task and the model)", total=None)
        self.start: float | None = None
        self.first_step = 0
        self.step: int | None = None  # the last step done in this call
        self.val: float | None = None
        self.loss, self.total, self.rate = float("nan"), None, 0.0
        self.plain = bar.disable  # no bar (stderr is not a terminal): plain lines
        self._notice: threading.Timer | None = None
        # a log shows a long setup (a tokenizer trained on a big file) as it goes, not from the first validation
        if self.plain and notice:
            self._notice = threading.Timer(BUILDING_NOTICE_SECONDS, lambda: err.print(
                f"{label}: building the task and the model", highlight=False, soft_wrap=True))
            self._notice.daemon = True
            self._notice.start()

    def close(self) -> None:
        """The run ended, failed or stepped: no notice of its setup any more."""
        if self._notice is not None:
            self._notice.cancel()

    def on_step(self, step: int, total: int, loss: float) -> None:
        """After each optimizer step."""
        now = time.perf_counter()
        self.total = total
        if self.start is None:
            self.close()
            self.start, self.first_step = now, step
            if self.plain:
                err.print(f"{self.label}: {self._where(step)} loss {loss:.4f}: training (a line at each validation)",
                          highlight=False, soft_wrap=True)
        self.rate = (step - self.first_step) / max(now - self.start, 1e-9)
        self.step = step
        self.loss, self.total = loss, total
        val = "" if self.val is None else f" val={self.val:.4f}"
        if self.seconds is not None:  # the bar follows the seconds (wall time of this call, capped at the budget)
            self.used = min(now - self.start, self.seconds)
            self.bar.update(self.task, completed=self.used, total=self.seconds,
                            description=f"{self.label} {self._where(step)} loss={loss:.4f}{val} "
                                        f"{self.rate:.1f} steps/s")
            return
        self.bar.update(self.task, completed=step, total=total,
                        description=f"{self.label} loss={loss:.4f}{val} {self.rate:.1f} steps/s")

    def _where(self, step: int) -> str:
        """``step 21/400``, or under a time budget ``step 21, 12 s of 30 s,`` (its step cap is no limit)."""
        from ..training.config import TIME_BUDGET_STEPS

        of = "" if self.total in (None, TIME_BUDGET_STEPS) else f"/{self.total}"
        return (f"step {step}{of}" if self.seconds is None
                else f"step {step}{of}, {self.used:.0f} s of {self.seconds:g} s,")

    def on_eval(self, step: int, val: float) -> None:
        """After each validation."""
        self.val = val
        if self.plain:
            err.print(f"{self.label}: {self._where(step)} loss {self.loss:.4f} val {val:.4f} {self.rate:.1f} steps/s",
                      highlight=False, soft_wrap=True)


def interrupted_message(folder: str, meter: TrainingBar, pre: TrainingBar | None, *, baseline: bool, again: str) -> str:
    """Ctrl-C: the one line saying where the run in ``folder`` stopped, what its checkpoint holds,
    and ``again``, the command that resumes it (or that nothing was saved yet)."""
    from ..training import CheckpointError, load_checkpoint
    from ..training.config import TIME_BUDGET_STEPS

    try:
        ck = load_checkpoint(folder)
        saved, where = ck.meta.get("step", 0), ck.path
    except (CheckpointError, OSError):
        saved, where = None, None
    pretraining = pre is not None and pre.step is not None and meter.step is None
    now = pre if pretraining else meter
    step = now.step if now.step is not None else saved or 0
    of = "" if now.total in (None, TIME_BUDGET_STEPS) else f" of {now.total}"
    what = ("the no-attention baseline " if baseline else "") + ("self-pretraining " if pretraining else "")
    head = f"interrupted {what}at step {step}{of}"
    if where is None and not baseline:
        return f"{head}, before its first checkpoint: nothing was saved; run the same command again to start over"
    kept = "nothing of the baseline yet" if where is None else f"the checkpoint of step {saved} in {where}"
    return f"{head}; saved: {kept}; resume with: {again}"
