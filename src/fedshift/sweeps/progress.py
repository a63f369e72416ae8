"""What a sweep prints while it runs."""

from __future__ import annotations

import math
import sys

from fedshift.sweeps.execute import RunOutcome
from fedshift.sweeps.planning import PlannedRun


class SweepProgress:
    """The sweep's progress: one line per started (sequential) and per finished run, with
    its target accuracy; with parallel runs on a terminal, a bar of finished/running/left."""

    def __init__(self, total: int, earlier: int, *, enabled: bool, parallel: bool) -> None:
        self.total = total
        self.finished = earlier
        self.enabled = enabled
        self.bar = None
        if enabled and parallel and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=earlier, desc="sweep", unit="run", leave=False)

    def line(self, text: str, *, always: bool = False) -> None:
        if not (self.enabled or always):
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def started(self, run: PlannedRun, index: int, resuming: bool) -> None:
        note = " (resuming)" if resuming else ""
        self.line(f"[{index}/{self.total}] {run.name}{note}")

    def ended(self, run: PlannedRun, outcome: RunOutcome, running: int) -> None:
        self.finished += 1
        left = self.total - self.finished - running
        counts = f"finished {self.finished}/{self.total}, running {running}, left {left}"
        if outcome.status == "failed":
            self.line(f"{run.name}: FAILED: {outcome.message} ({counts})", always=True)
        elif outcome.status == "busy":
            self.line(f"{run.name}: {outcome.message} ({counts})", always=True)
        else:
            self.line(f"{run.name}: {accuracy_text(outcome)} ({counts})")
        if self.bar is not None:
            self.bar.set_postfix(running=running, left=left)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def accuracy_text(outcome: RunOutcome) -> str:
    summary = outcome.summary or {}
    value = summary.get("target_accuracy", summary.get("personalized_accuracy"))
    took = f" in {outcome.seconds:.1f}s" if outcome.seconds else ""
    if isinstance(value, int | float) and not math.isnan(value):
        return f"target accuracy {100 * value:.1f}%{took}"
    return f"done{took}"
