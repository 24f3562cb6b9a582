"""PNG plots of a bench run (matplotlib, Agg; no pyplot state, safe off the main thread).

Each function returns the PNG bytes.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from trtspec.bench import memory as mem
from trtspec.bench.records import RequestRecord

ARM_COLORS = {"auto": "tab:blue", "on": "tab:green", "off": "tab:orange"}


def to_png(fig: Figure, dpi: int = 100) -> bytes:
    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _cdf(ax, values: Sequence[float], label: str, color: str | None) -> None:
    if not values:
        return
    xs = np.sort(np.asarray(values, dtype=float))
    ys = np.arange(1, xs.size + 1) / xs.size
    ax.step(xs, ys, where="post", label=f"{label} (n={xs.size})", color=color)


def latency_cdfs(records: Sequence[RequestRecord], arms: Sequence[str]) -> bytes:
    """TTFT, inter-token and end-to-end latency CDFs, one line per arm (speculation auto/on vs off)."""
    fig = Figure(figsize=(13, 3.8))
    axes = fig.subplots(1, 3)
    panels = (
        ("time to first token (ms)", lambda rs: [r.ttft_s * 1000 for r in rs if r.ttft_s is not None]),
        ("inter-token latency (ms)", lambda rs: [x * 1000 for r in rs for x in r.itl_s()]),
        ("end-to-end latency (s)", lambda rs: [r.e2e_s for r in rs if r.e2e_s is not None]),
    )
    for ax, (title, values) in zip(axes, panels, strict=True):
        for arm in arms:
            _cdf(ax, values([r for r in records if r.arm == arm and r.answered]), arm, ARM_COLORS.get(arm))
        ax.set_title(title)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.set_ylabel("cumulative share (ITL: of chunks)" if ax is axes[0] else "")
        if ax.lines:
            ax.legend(loc="lower right", fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle("Latency CDFs by speculation arm", y=1.03)
    return to_png(fig)


def acceptance_by_position(by_position: Mapping[str, float] | None, source: str = "") -> bytes:
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    if by_position:
        labels = list(by_position)
        ax.bar(labels, [by_position[k] for k in labels], color="tab:blue")
        ax.set_ylim(0, 1.05)
        for i, k in enumerate(labels):
            ax.text(i, by_position[k] + 0.02, f"{by_position[k]:.0%}", ha="center", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no speculating requests", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted")
    ax.set_title(f"Acceptance by draft position{f' ({source})' if source else ''}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    return to_png(fig)


def memory_over_time(samples: Sequence[mem.MemorySample]) -> bytes:
    """The server's memory during the run: process PSS/RSS sums (local server), GPU, the models' gauges, host."""
    fig = Figure(figsize=(9, 4))
    ax = fig.subplots()
    labels = {
        "pss_bytes": "server processes, PSS sum",
        "rss_bytes": "server processes, RSS sum",
        "gpu_used_bytes": "GPU memory used (nv_gpu_memory_used_bytes)",
    }
    drawn = False
    for name, label in labels.items():
        ts, vs = mem.series(list(samples), name)
        if vs:
            ax.plot(ts, np.asarray(vs) / 2**20, label=label, marker=".", markersize=3)
            drawn = True
    for role in sorted({r for s in samples for r in s.model_bytes}):
        pts = [(s.t_s, s.model_bytes[role]) for s in samples if role in s.model_bytes]
        ax.plot([t for t, _ in pts], np.asarray([v for _, v in pts]) / 2**20, label=f"trtspec_model_memory_bytes {role}")
        drawn = True
    ax.set_xlabel("seconds from the start of the run")
    ax.set_ylabel("MiB")
    ts, host = mem.series(list(samples), "host_used_bytes")
    if host:
        ax2 = ax.twinx()
        ax2.plot(ts, np.asarray(host) / 2**30, color="grey", linestyle=":", label="host RAM used (nv_cpu_memory_used_bytes)")
        ax2.set_ylabel("host GiB", color="grey")
        ax2.legend(loc="lower right", fontsize=8)
        drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "no memory samples (no --metrics-url / --server-pid)", ha="center", va="center",
                transform=ax.transAxes)
    elif ax.lines:
        ax.legend(loc="upper left", fontsize=8)
    ax.set_title("Server memory over the run")
    ax.grid(alpha=0.3)
    return to_png(fig)
