"""Plots people would rather look at than read: JCT per policy and the JCT distribution."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_jct(runs, path: str | Path, title: str = "Job completion time") -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    fig, (bars, cdf) = plt.subplots(1, 2, figsize=(12, 4.5))
    labels = [r.policy if len({x.placement for x in runs}) == 1 else f"{r.policy}\n{r.placement}" for r in runs]
    avg = [r.result.summary()["avg_jct_s"] / 3600 for r in runs]
    p95 = [r.result.summary()["p95_jct_s"] / 3600 for r in runs]
    x = np.arange(len(runs))
    bars.bar(x - 0.2, avg, 0.4, label="average")
    bars.bar(x + 0.2, p95, 0.4, label="p95")
    ideal = runs[0].result.summary()["ideal_avg_jct_s"] / 3600
    bars.axhline(ideal, color="k", linestyle="--", linewidth=1, label="ideal average")
    bars.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    bars.set_ylabel("JCT (hours)")
    bars.set_title(title)
    bars.legend()
    for r, label in zip(runs, labels):
        jct = np.sort(np.array(list(r.result.jct_s.values())) / 3600)
        cdf.plot(jct, np.arange(1, len(jct) + 1) / max(len(jct), 1), label=label.replace("\n", " / "))
    cdf.set_xscale("log")
    cdf.set_xlabel("JCT (hours, log scale)")
    cdf.set_ylabel("fraction of jobs")
    cdf.set_title("JCT distribution")
    cdf.legend(fontsize=7)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
