"""Render the recommendation JSON as Markdown and as one self-contained HTML page, and write
every report file of a run."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from tuner.report.plots import FIGURE_TITLES, PARAM_LABELS
from tuner.report.simulated import band_note, band_table, sim_note, sim_table
from tuner.report.summary import (
    bought_line,
    ms_text,
    same_rate_sentence,
    short_config,
    term_text,
)
from tuner.store.runfiles import RunFiles


def write_reports(rec: dict[str, Any], figures: dict[str, bytes], files: RunFiles) -> list[Path]:
    """recommendation.json, .md (plots as PNG files) and a self-contained .html."""
    for name, png in figures.items():
        files.write_bytes(files.plots_dir / f"{name}.png", png)
    paths = [files.write_json("recommendation.json", rec)]
    for name, text in (
        ("recommendation.md", render_markdown(rec, figures)),
        ("recommendation.html", render_html(rec, figures)),
    ):
        path = files.root / name
        files.write_text(path, text)
        paths.append(path)
    return paths


# ---- Markdown -------------------------------------------------------------------------------


def render_markdown(rec: dict[str, Any], figures: dict[str, bytes]) -> str:
    lines = [f"# Recommendation for {rec['slo']}", "", f"**{rec['summary']}**", ""]
    if bought := bought_line(rec):
        lines += [bought, ""]
    if rec.get("flags"):
        lines += ["## Flags", "", "vLLM:", "", "```", f"vllm serve MODEL {rec['flags']['vllm']}",
                  "```", "", "SGLang:", "", "```",
                  f"python -m sglang.launch_server --model-path MODEL {rec['flags']['sglang']}",
                  "```", ""]  # fmt: skip
        lines += [f"- {n}" for n in rec["flags"]["notes"]]
        lines.append("")
    lines += ["## Compared", "", _md_table(*comparison_table(rec)), ""]
    same = rec.get("default_at_recommended_rate")
    if rows := same_rate_rows(same):
        lines += ["## Same traffic", "", str(same_rate_sentence(same)), "", _md_table(*rows), ""]
    if rec.get("top"):
        lines += ["## Top configs, re-measured", "", _md_table(*top_table(rec)), ""]
    if sim := sim_table(rec):
        lines += ["## Simulated against measured", "", sim_note(rec), "", _md_table(*sim), ""]
    if band := band_table(rec):
        lines += ["## Across the traffic band (simulated)", "", band_note(rec), "",
                  _md_table(*band), ""]  # fmt: skip
    for name in figures:
        lines += [f"## {FIGURE_TITLES[name]}", "", f"![{name}](plots/{name}.png)", ""]
    lines += ["## Setup", "", _md_table(*setup_table(rec)), ""]
    lines += ["## Trials", "", _md_table(*trials_table(rec)), ""]
    return "\n".join(lines)


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


# ---- tables shared by both formats ----------------------------------------------------------


def comparison_table(rec: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["", "config", "capacity", "interval", "limited by", "tightest term", "vs default"]
    rows = []
    default_cap = (rec.get("default") or {}).get("capacity_rps")
    for label, key in (("recommended", "best"), ("vLLM default", "default"),
                       ("rule of thumb", "rule_of_thumb")):  # fmt: skip
        e = rec.get(key)
        if not e:
            continue
        if key == "rule_of_thumb":
            label = f"rule of thumb ({e.get('table')})"
        if e.get("measured") is False:  # screening measures only the default
            simulated = e.get("simulated_rps")
            told = "not measured"
            if simulated:
                told += f" (simulated {simulated:.2f} req/s)"
            rows.append([label, short_config(e["config"]), told, "-", "-", "-", "-"])
            continue
        cap = e.get("capacity_rps") or 0.0
        ratio = f"{cap / default_cap:.2f}x" if default_cap else "-"
        rows.append([label, short_config(e["config"]), f"{cap:.2f} req/s", _interval(e),
                     e.get("limited_by", "-"), _binding(e), ratio])  # fmt: skip
    return header, rows


def top_table(rec: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["trial", "config", "search", "confirmed", "capacity interval",
              "terms (point [interval])"]  # fmt: skip
    rows = []
    for c in rec["top"]:
        ci = c.get("capacity_ci") or c.get("goodput_ci") or {}
        terms = "; ".join(f"{t['metric']} {term_text(t)}" for t in c["terms"])
        confirmed = f"{c['confirmed_rps']:.2f}" if c["repeats"] else "not re-measured"
        if c["repeats"] and not c["confirmed_rps"]:
            # The default measured only at the recommended rate, and missing there, read "0.00".
            confirmed = f"cleared no re-measured rate ({c['repeats']} draws)"
        rows.append([str(c["trial"] + 1), short_config(c["config"]), f"{c['value']:.2f}",
                     confirmed, _ci(ci), terms])  # fmt: skip
    return header, rows


def same_rate_rows(same: dict[str, Any] | None) -> tuple[list[str], list[list[str]]] | None:
    """A config-by-term table of the recommended config and the default at the same rate."""
    if not same:
        return None
    metrics = [t["term"] for t in same["recommended"]["terms"]]
    header = ["at " + f"{same['rate_rps']:.2f} req/s", *metrics, "served", "meets SLO"]
    rows = []
    for label, key in (("recommended", "recommended"), ("vLLM default", "default")):
        e = same[key]
        cells = [term_text(t) for t in e["terms"]]
        meets = "yes" if e["meets_slo"] else "no"
        rows.append([label, *cells, f"{e['served_fraction']:.0%}", meets])
    return header, rows


def setup_table(rec: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    wl, tgt, env = rec.get("workload", {}), rec.get("target", {}), rec.get("environment", {})
    search = rec.get("search", {})
    versions = ", ".join(f"{k} {v}" for k, v in (env.get("versions") or {}).items() if v)
    rows = [
        ["SLO", str(rec["slo"])],
        ["objective", rec["objective"]["definition"]],
        ["workload", f"{wl.get('name')}: a seeded list of {wl.get('num_requests')} requests "
                     f"(seed {wl.get('seed')}, classes {wl.get('classes')}, fingerprint "
                     f"{wl.get('fingerprint')}); {wl.get('arrival')} arrivals; "
                     + _level_text(wl)],
        ["target", f"{tgt.get('description')} on {tgt.get('device')}"],
        ["model", f"{tgt.get('model')} (max_model_len {tgt.get('max_model_len')})"],
        ["default config", _default_text(tgt)],
        ["search", f"{search.get('sampler')}: {search.get('trials_finished')} trials "
                   f"({search.get('trials_pruned')} pruned), {search.get('levels_measured')} "
                   f"load levels, {search.get('measurement_s', 0):.0f} s measuring; stopped by "
                   f"{search.get('stopped_by')}"],
        ["time", _time_text(rec)],
        ["space", "; ".join(f"{PARAM_LABELS.get(k, k)}: {v}"
                            for k, v in search.get("space", {}).items())],
        ["pinned", ", ".join(f"{k}={v}" for k, v in search.get("fixed", {}).items()) or "-"],
        ["versions", versions],
        ["machine", f"{env.get('platform')}, {env.get('cpu_count')} CPUs" + _shared_text(search)],
    ]  # fmt: skip
    return ["", ""], rows


def _time_text(rec: dict[str, Any]) -> str:
    """The run's wall time and where it went, phase by phase."""
    elapsed, phases = rec.get("elapsed_s"), rec.get("phases_s") or {}
    text = f"{elapsed:.0f} s to the recommendation" if elapsed is not None else "-"
    parts = [f"{name} {seconds:.0f} s" for name, seconds in phases.items() if seconds >= 0.5]
    return text + (f" ({'; '.join(parts)})" if parts else "")


def trials_table(rec: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["trial", "role", "state", "config", "capacity", "levels", "seconds"]
    rows = []
    for t in rec["trials"]:
        cap = t.get("capacity_rps")
        if t["state"] == "pruned" and t.get("upper_bound_rps"):
            cap_text = f"< {t['upper_bound_rps']:.2f}"
        else:
            cap_text = f"{cap:.2f}" if cap is not None else "-"
        levels = str(t["levels"])
        if t.get("carried_levels"):  # went on from an earlier attempt's search (trial.py)
            levels += f" (+{t['carried_levels']} of trial {t['continues'] + 1})"
        rows.append([str(t["trial"] + 1), t["role"], t["state"], short_config(t["config"]),
                     cap_text, levels, f"{t['measurement_s']:.0f}"])  # fmt: skip
    return header, rows


def _default_text(target: dict[str, Any]) -> str:
    """The config every comparison is against, and where it comes from (a device row)."""
    config = target.get("default_config")
    return f"{short_config(config)} ({target.get('default_source')})" if config else "-"


def _shared_text(search: dict[str, Any]) -> str:
    """How much the machine was shared while the search measured."""
    foreign, again = search.get("max_foreign_cpu_cores"), search.get("levels_remeasured")
    if foreign is None:
        return ""
    text = f"; other processes used at most {foreign:.2f} cores during a level kept"
    if search.get("max_step_pace") is not None:
        text += f", the engine's steps at most {search['max_step_pace']:.2f}x their usual time"
    return text + (f", {again} levels measured again" if again else "")


def _level_text(wl: dict[str, Any]) -> str:
    if wl.get("level_s"):
        # Runs saved before levels drew by stratum took contiguous stretches.
        how = ("one of each prompt-length stratum" if wl.get("level_mix") == "stratified"
               else "a contiguous stretch")  # fmt: skip
        return (f"each load level replays rate x {wl['level_s']:g} s of them "
                f"(at least {wl.get('min_requests_per_level')}), {how}")  # fmt: skip
    return "each load level replays all of them"


def _interval(e: dict[str, Any]) -> str:
    return _ci(e.get("capacity_ci") or e.get("goodput_ci") or {}) if e.get("confirmed") else "-"


def _ci(ci: dict[str, Any]) -> str:
    bounds = (ci.get("low"), ci.get("high"))
    return "-" if None in bounds else f"[{bounds[0]:.2f}, {bounds[1]:.2f}]"


def _binding(e: dict[str, Any]) -> str:
    term = next((t for t in e.get("terms", []) if t["metric"] == e.get("binding")), None)
    if term is None:
        return "-"
    limit = term.get("limit_ms")
    return f"{term['metric']} {ms_text(term['value_ms'])}" + (f" / {limit:g} ms" if limit else "")


# ---- HTML -----------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;
margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.8em;
border-bottom:1px solid #ddd;padding-bottom:.2em}
.summary{font-size:1.1em;background:#f3f8f3;border-left:4px solid #2ca02c;padding:.6em 1em}
.infeasible{background:#fbf1f1;border-left-color:#d62728}
pre{background:#f6f6f6;padding:.7em;white-space:pre-wrap;word-break:break-word;
border-radius:4px}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4} img{max-width:100%;margin:.5em 0} .note{color:#666;font-size:.9em}
"""


def render_html(rec: dict[str, Any], figures: dict[str, bytes]) -> str:
    e = html.escape
    css_class = "summary" if rec["feasible"] else "summary infeasible"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>tune: {e(str(rec['slo']))}"
             f"</title><style>{_CSS}</style></head><body>",
             f"<h1>Recommendation for {e(str(rec['slo']))}</h1>",
             f"<p class='{css_class}'>{e(rec['summary'])}</p>"]  # fmt: skip
    if bought := bought_line(rec):
        parts.append(f"<p>{e(bought)}</p>")
    if rec.get("flags"):
        flags = rec["flags"]
        parts += ["<h2>Flags</h2>", "<p>vLLM</p>",
                  f"<pre>vllm serve MODEL {e(flags['vllm'])}</pre>", "<p>SGLang</p>",
                  f"<pre>python -m sglang.launch_server --model-path MODEL {e(flags['sglang'])}"
                  "</pre>"]  # fmt: skip
        parts += [f"<p class='note'>{e(n)}</p>" for n in flags["notes"]]
    parts += ["<h2>Compared</h2>", _html_table(*comparison_table(rec))]
    same = rec.get("default_at_recommended_rate")
    if rows := same_rate_rows(same):
        parts += ["<h2>Same traffic</h2>", f"<p>{e(str(same_rate_sentence(same)))}</p>",
                  _html_table(*rows)]  # fmt: skip
    if rec.get("top"):
        parts += ["<h2>Top configs, re-measured</h2>", _html_table(*top_table(rec)),
                  "<p class='note'>Intervals are 95% bootstrap intervals over requests; a config "
                  "is confirmed at the highest rate whose runs hold pooled with every "
                  "term's whole interval and each on its own, below any rate that does "
                  "not. A config whose search capacity is at most a rate already confirmed "
                  "is not re-measured: re-measuring only steps down from it. Nor is the "
                  "default below such a rate: the same-traffic check measures it at the "
                  "recommended rate instead.</p>"]  # fmt: skip
    if sim := sim_table(rec):
        parts += ["<h2>Simulated against measured</h2>", f"<p>{e(sim_note(rec))}</p>",
                  _html_table(*sim)]  # fmt: skip
    if band := band_table(rec):
        parts += ["<h2>Across the traffic band (simulated)</h2>", f"<p>{e(band_note(rec))}</p>",
                  _html_table(*band)]  # fmt: skip
    for name, png in figures.items():
        data = base64.b64encode(png).decode("ascii")
        parts += [f"<h2>{FIGURE_TITLES[name]}</h2>",
                  f"<img alt='{name}' src='data:image/png;base64,{data}'>"]  # fmt: skip
    parts += ["<h2>Setup</h2>", _html_table(*setup_table(rec), header=False)]
    parts += ["<h2>Trials</h2>", _html_table(*trials_table(rec)), "</body></html>"]
    return "\n".join(parts)


def _html_table(head: list[str], rows: list[list[str]], header: bool = True) -> str:
    e = html.escape
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
    out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows]
    out.append("</table>")
    return "\n".join(out)
