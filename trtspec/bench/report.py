"""Write a bench run's files: ``results.json``, three PNGs, ``report.md`` and ``report.html``.

Both reports are self-contained (the PNGs are embedded as base64); the PNG
files are written beside them too.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.bench import plots
from trtspec.bench.doc import Doc, fmt
from trtspec.bench.runner import BenchResult

FILES = {
    "json": "results.json",
    "latency_png": "latency_cdf.png",
    "acceptance_png": "acceptance_by_position.png",
    "memory_png": "memory.png",
    "markdown": "report.md",
    "html": "report.html",
}

_MIB = 2**20


def headline_rows(result: BenchResult) -> list[list]:
    """One row per arm: the figures the on/off comparison is about."""
    rows = []
    for arm, s in result.summary["by_arm"].items():
        rows.append([
            arm,
            s["sent"],
            s["answered"],
            s["errors"],
            s["ttft_ms"]["p50"],
            s["ttft_ms"]["p99"],
            s["itl_ms"]["p50"],
            s["itl_ms"]["p99"],
            s["e2e_ms"]["p50"],
            s["e2e_ms"]["p99"],
            s["tokens_per_s"],
            s["goodput_rps"],
            None if s["acceptance_rate"] is None else f"{s['acceptance_rate']:.1%}",
            result.summary["speedup_vs_off"].get(arm),
        ])
    return rows


HEADLINE = ["arm", "sent", "answered", "errors", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms",
            "E2E p50 ms", "E2E p99 ms", "tokens/s", "goodput req/s", "acceptance", "speedup vs off"]


def text_summary(result: BenchResult) -> str:
    """A plain-text table for the terminal."""
    rows = [[fmt(c, 2 if isinstance(c, float) and abs(c) < 10 else 1) for c in r] for r in headline_rows(result)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADLINE)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    s = result.summary
    o = s["overall"]
    errs = ", ".join(f"{k} {v}" for k, v in o["errors_by_category"].items()) or "none"
    cfg = result.config
    load = f"{cfg['rate_rps']:g} req/s (Poisson)" if cfg["mode"] == "open" else f"concurrency {cfg['concurrency']}"
    out = [
        f"bench {cfg['url']} ({cfg['protocol']}): {load}, {s['wall_s']:.1f}s, max_tokens {cfg['max_tokens']}, arms {cfg['ab']}, "
        f"drafter {result.drafter}"
        + (" (INTERRUPTED)" if result.interrupted else ""),
        line(HEADLINE),
        *(line(r) for r in rows),
        f"sent {o['sent']} = answered {o['answered']} + errors {o['errors']} ({errs})",
        f"client: max send rate {fmt(result.client.get('max_send_rate_rps'))} req/s, "
        f"achieved {fmt(result.client.get('achieved_send_rate_rps'), 2)} req/s, lag p99 {fmt(result.client.get('lag_ms_p99'))} ms"
        + f", CPU {fmt(result.client.get('cpu_ms_per_request'), 2)} ms/request ({fmt(result.client.get('cpu_cores'), 2)} cores)"
        + (" (CLIENT-BOUND)" if result.client.get("client_bound") else ""),
    ]
    m = result.memory_summary
    for key, label in (("pss_bytes", "server PSS"), ("rss_bytes", "server RSS"), ("gpu_used_bytes", "GPU")):
        if key in m:
            v = m[key]
            out.append(f"memory ({label}): {v['first'] / _MIB:.0f} -> {v['last'] / _MIB:.0f} MiB, peak {v['peak'] / _MIB:.0f}, "
                       f"growth {v['growth'] / _MIB:+.1f} MiB ({v['slope_bytes_per_min'] / _MIB:+.2f} MiB/min)")
            break
    return "\n".join(out)


def build_doc(result: BenchResult, images: dict[str, bytes]) -> Doc:
    """The report: the run, on vs off, accounting, latency, speculation, server memory, the client."""
    doc = Doc("trtspec bench report")
    _run_section(doc, result)
    _latency_section(doc, result, images["latency_png"])
    _speculation_section(doc, result, images["acceptance_png"])
    _memory_section(doc, result, images["memory_png"])
    _client_section(doc, result.client)
    return doc


def _run_section(doc: Doc, result: BenchResult) -> None:
    """What ran, on vs off, and where every request went."""
    s, cfg = result.summary, result.config
    o = s["overall"]
    load = f"open loop, Poisson arrivals at {cfg['rate_rps']:g} req/s" if cfg["mode"] == "open" else f"closed loop, concurrency {cfg['concurrency']}"
    doc.p(f"Server {cfg['url']} over {cfg['protocol']}; {load}; started {result.started_at}; wall time {s['wall_s']:.1f} s; "
          f"max_tokens {cfg['max_tokens']}; A/B arms {cfg['ab']} (speculation input per request, interleaved); "
          f"drafter of the speculating arms: {result.drafter}.")
    if result.interrupted:
        doc.p("The run was interrupted: the figures cover what was sent before.")
    doc.h2("On vs off")
    doc.table(HEADLINE, headline_rows(result))
    doc.p("Speedup vs off: the off arm's median milliseconds per output token (end-to-end latency / tokens) over the arm's. "
          "Goodput: answered requests meeting the SLO per second"
          + (f" (TTFT <= {cfg['slo_ttft_ms']:g} ms" if cfg.get("slo_ttft_ms") else " (no TTFT SLO")
          + (f", TPOT <= {cfg['slo_itl_ms']:g} ms)." if cfg.get("slo_itl_ms") else ", no ITL SLO)."))
    doc.h2("Accounting")
    errs = ", ".join(f"{k}: {v}" for k, v in o["errors_by_category"].items()) or "none"
    doc.p(f"sent {o['sent']} = answered {o['answered']} + errors {o['errors']} (accounted: {s['accounted']}). Errors by category: {errs}.")
    examples = _error_examples(result)
    if examples:
        doc.table(["category", "count", "example message"], examples)


def _latency_section(doc: Doc, result: BenchResult, cdf_png: bytes) -> None:
    doc.h2("Latency percentiles")
    rows = []
    for arm, a in result.summary["by_arm"].items():
        for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            p = a[metric]
            rows.append([arm, metric.replace("_ms", ""), p["p50"], p["p90"], p["p99"], p["n"]])
    doc.table(["arm", "metric (ms)", "p50", "p90", "p99", "n"], rows)
    doc.image("Latency CDFs: speculation on vs off", cdf_png)


def _speculation_section(doc: Doc, result: BenchResult, acceptance_png: bytes) -> None:
    """Drafted and accepted per arm, the fallback ratio, acceptance by drafter and by position."""
    s = result.summary
    doc.h2("Speculation")
    rows = []
    for arm, a in s["by_arm"].items():
        rows.append([arm, a["drafted"], a["accepted"],
                     None if a["acceptance_rate"] is None else f"{a['acceptance_rate']:.1%}",
                     None if a["speculated_share"] is None else f"{a['speculated_share']:.0%}",
                     a["k_estimate"], a["tokens_per_chunk"], a["chunk_interval_ms_p50"]])
    doc.table(["arm", "drafted", "accepted", "acceptance", "speculated share", "k (est.)", "tokens/chunk", "chunk interval p50 ms"],
              rows, digits=2)
    fr = s.get("fallback_ratio")
    doc.p("Fallback ratio (server counters): " + (f"{fr:.1%}" if fr is not None else "not exported by this server") + ".")
    abd = s.get("acceptance_by_drafter")
    if abd:
        doc.table(["drafter", "drafted", "accepted", "acceptance"],
                  [[name, v["drafted"], v["accepted"], f"{v['acceptance_rate']:.1%}"] for name, v in abd.items()],
                  digits=0)
    abp = s.get("acceptance_by_position")
    doc.image("Acceptance by draft position", acceptance_png)
    if abp and abp.get("source", "").startswith("estimate"):
        doc.p("Acceptance by position is estimated from stream chunks (one chunk per draft-verify iteration; its tokens "
              "estimated from its characters): the server did not export per-position counters.")


def _memory_section(doc: Doc, result: BenchResult, memory_png: bytes) -> None:
    doc.h2("Server memory")
    mrows = []
    for key, v in result.memory_summary.items():
        if isinstance(v, dict):
            mrows.append([key, v["first"] / _MIB, v["last"] / _MIB, v["peak"] / _MIB, v["growth"] / _MIB,
                          v["slope_bytes_per_min"] / _MIB])
    if mrows:
        doc.table(["series", "first MiB", "last MiB", "peak MiB", "growth MiB", "MiB/min"], mrows, digits=1)
    doc.image("Server memory over time", memory_png)


def _client_section(doc: Doc, c: dict) -> None:
    """Whether the load generator kept up (its send rate, lag and CPU)."""
    doc.h2("Client")
    doc.p(f"Max send rate (refused probe requests): {fmt(c.get('max_send_rate_rps'))} req/s; achieved send rate "
          f"{fmt(c.get('achieved_send_rate_rps'), 2)} req/s; send lag p99 {fmt(c.get('lag_ms_p99'))} ms; client CPU "
          f"{fmt(c.get('cpu_ms_per_request'), 2)} ms per request, {fmt(c.get('cpu_cores'), 2)} cores on average; "
          + ("the client may have been the bottleneck (sends were late or its probe rate is under twice the target; "
             "with a CPU share well below one core, it was starved by other processes on its machine)."
             if c.get("client_bound") else "the client was not the bottleneck."))


def _error_examples(result: BenchResult) -> list[list]:
    seen: dict[str, list] = {}
    for r in result.records:
        if r.error is not None:
            cat = r.error_category or "other"
            if cat not in seen:
                seen[cat] = [cat, 0, r.error[:160]]
            seen[cat][1] += 1
    return list(seen.values())


def write_report(result: BenchResult, out_dir: str | Path) -> dict[str, str]:
    """Write every file into ``out_dir``; returns ``{kind: path}``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    arms = list(result.summary["by_arm"])
    abp = result.summary.get("acceptance_by_position") or {}
    images = {
        "latency_png": plots.latency_cdfs(result.records, arms),
        "acceptance_png": plots.acceptance_by_position(abp.get("by_position"), abp.get("source", "")),
        "memory_png": plots.memory_over_time(result.memory),
    }
    paths = {k: out / v for k, v in FILES.items()}
    paths["json"].write_text(json.dumps(result.to_dict(), indent=1, default=str) + "\n")
    for k, png in images.items():
        paths[k].write_bytes(png)
    doc = build_doc(result, images)
    paths["markdown"].write_text(doc.to_markdown())
    paths["html"].write_text(doc.to_html())
    return {k: str(v) for k, v in paths.items()}


def load_result(path: str | Path) -> BenchResult:
    """A ``results.json`` written by :func:`write_report`, back as a :class:`BenchResult`."""
    from trtspec.bench.runner import result_from_dict
    from trtspec.bench.workload import BenchError

    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise BenchError(f"cannot read bench results {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise BenchError(f"cannot read bench results {path}: not JSON ({e})") from None
    try:
        return result_from_dict(data)
    except (KeyError, TypeError, ValueError) as e:
        raise BenchError(f"{path}: not a trtspec bench result ({type(e).__name__}: {e})") from None
