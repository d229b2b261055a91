"""TTFT against fidelity over the blend recompute settings, from a ``bench.generation`` results file.

``python -m bench.gen_plot bench/results/generation-blend.json docs/blend_ttft_fidelity.png``: one
panel per workload; x = identical-answer rate against exact prefill of the same prompt (%), y =
mean TTFT relative to no reuse (mode a, speed-up ×); one point per blend mode (e1, e2, ...)
labelled with its recompute policy, plus the exact modes (d at 100%) when present.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def plot(results: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = json.loads(results.read_text())["workloads"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.2), squeeze=False)
    for ax, (name, res) in zip(axes[0], workloads.items(), strict=True):
        modes = res["modes"]
        base = modes["a"]["ttft_mean_s"]
        for key, m in modes.items():
            if key == "a":
                continue
            fidelity = m.get("identical", 100.0)  # exact modes are identical by construction
            speed = base / m["ttft_mean_s"]
            ax.scatter(fidelity, speed, color="tab:red" if "identical" in m else "tab:blue")
            ax.annotate(m["label"].removeprefix("blend "), (fidelity, speed), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.axvline(90.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{name} ({res['questions']} requests)")
        ax.set_xlabel("identical answers vs exact, same prompt (%)")
        ax.set_ylabel("TTFT speed-up vs no reuse (×)")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    plot(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"wrote {sys.argv[2]}")
