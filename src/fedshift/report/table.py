"""Human-readable result tables."""

from __future__ import annotations

from typing import Any

from fedshift.engine.run.selection import LAST_ROUNDS_MEAN


def _pct(value: Any) -> str:
    return f"{100 * value:.2f}" if isinstance(value, float) else "-"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def format_summary(summary: dict[str, Any]) -> str:
    """A result table for one run: per-domain accuracy plus the headline numbers."""
    if not summary:
        return "run stopped before its last round (resume it with --resume)"
    # a segmentation run's "accuracy" figures are Dice scores: say so
    score = "Dice" if summary.get("problem") == "segmentation" else "accuracy"
    column = "test Dice %" if score == "Dice" else "test acc %"
    lines = [
        f"{summary['algorithm']} on {summary['dataset']} ({summary['protocol']}), "
        f"target {summary['target']}, seed {summary['seed']}, {summary['rounds']} rounds",
        "",
        f"{'domain':<16}{column:>11}{'':>4}",
    ]
    for domain, acc in summary["per_domain_accuracy"].items():
        tag = "  (target)" if domain == summary["target"] else ""
        lines.append(f"{domain:<16}{_pct(acc):>11}{tag}")
    lines += [
        "",
        f"target {score} ({summary.get('model_selection', 'source-val')} selected, "
        f"round {summary['selected_round']}): "
        f"{_pct(summary['target_accuracy'])}",
        f"target {score} (last round): {_pct(summary['target_accuracy_last'])}",
    ]
    rounds = summary.get("rounds")
    if not isinstance(rounds, int) or rounds >= LAST_ROUNDS_MEAN:
        span = f"the last {LAST_ROUNDS_MEAN} evaluated rounds"
    else:  # a short run: the mean covers all its evaluated rounds (one: the last round)
        span = f"all evaluated rounds, fewer than {LAST_ROUNDS_MEAN}" if rounds > 1 else ""
    if span:
        mean = _pct(summary.get("target_accuracy_last5"))
        lines.append(f"target {score} (mean of {span}): {mean}")
    lines += [
        f"target {score} (oracle, round {summary['oracle_round']}; uses target labels): "
        f"{_pct(summary['target_accuracy_oracle'])}",
    ]
    for key, value in summary.items():  # an algorithm's label-free selection (FACT: min_idd)
        rule = key.removeprefix("target_accuracy_")
        if key != rule and rule != "oracle" and f"{rule}_round" in summary:
            lines.append(
                f"target {score} ({rule} selected, round {summary[f'{rule}_round']}; "
                f"the algorithm's label-free score): {_pct(value)}"
            )
    if "personalized_accuracy" in summary:
        lines.append(
            f"personalized accuracy: {_pct(summary['personalized_accuracy'])} "
            f"± {_pct(summary['personalized_accuracy_std'])}"
        )
    if "dp_epsilon" in summary:
        lines.append(
            f"differential privacy (client level): epsilon {summary['dp_epsilon']:.2f} "
            f"at delta {summary['dp_delta']:g}"
        )
    for key, which in (
        ("at_chance", "the selected round"),
        ("at_chance_last", "the last round"),
    ):
        if key in summary:
            lines.append(
                f"warning: at {which} every scored domain's accuracy is exactly one class's "
                "share of its test images: the model predicts one class for every image, a "
                "chance-level result (a falling training loss does not change that)"
            )
    lines.append(
        f"communication: {_bytes(summary['bytes_up'])} up, {_bytes(summary['bytes_down'])} down; "
        f"{summary['wall_seconds']:.1f} s, {summary['samples_per_second']:.0f} samples/s"
    )
    return "\n".join(lines)
