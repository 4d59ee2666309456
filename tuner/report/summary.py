"""The words of a report: the summary line, the same-traffic sentence, the console end, and the
vLLM / SGLang flags (only for knobs the config has). They read the recommendation JSON, so the
Markdown, the HTML and the console say the same thing."""

from __future__ import annotations

import math
from typing import Any

from engine_lite import Policy
from tuner.targets.knobs import KNOBS


def short_config(config: dict[str, Any]) -> str:
    """`budget=2048 threshold=512 ...`: every knob under its short label."""
    parts = []
    for name, value in config.items():
        label = KNOBS[name].label if name in KNOBS else name
        parts.append(f"{label}={getattr(value, 'value', value)}")
    return " ".join(parts)


def summary_line(rec: dict[str, Any]) -> str:
    """The one sentence a reader needs."""
    slo = rec["slo"]
    if not rec["feasible"]:
        c = rec.get("closest")
        if not c:
            return f"no config meets {slo}; nothing finished a load level" + _time_cut_text(rec)
        return (
            f"no config meets {slo}; the closest is trial {c['trial'] + 1} "
            f"({short_config(c['config'])}) with {c['metric']} {ms_text(c['value_ms'])} "
            f"(limit {c['limit_ms']:g} ms) at {c['rate_rps']:.2f} req/s" + _time_cut_text(rec)
        )
    best = rec["best"]
    unit = "good req/s" if rec["objective"]["mode"] == "goodput" else f"req/s within {slo}"
    ratio, default = rec.get("ratio_vs_default"), rec.get("default")
    basis = (rec.get("headline") or {}).get("basis")
    if basis == DEFAULT_BEST:
        return (f"keep the vLLM default ({short_config(best['config'])}): no config measured "
                f"beat its {best['capacity_rps']:.2f} {unit}{_cut(best)}")  # fmt: skip
    if basis == WITHIN_NOISE:
        rate = rec["default_at_recommended_rate"]["rate_rps"]
        held = draws_held(rec["default_at_recommended_rate"]["default"])
        text = (f"keep the vLLM default: at {rate:.2f} req/s, where "
                f"{short_config(best['config'])} was confirmed, the default also meets {slo}"
                f"{held}, so ")  # fmt: skip
        if default is not None and default.get("held_when_remeasured") is False:
            return text + (f"the two are within noise of each other (the default's own "
                           f"{default['capacity_rps']:.2f} req/s did not hold when "
                           "re-measured)")  # fmt: skip
        return text + f"the {ratio:.2f}x measured between their capacities is within noise"
    text = f"recommended: {short_config(best['config'])} serves {best['capacity_rps']:.2f} {unit}"
    if ratio is not None and basis == SAME_TRAFFIC and _default_fell(default):
        # Re-measured, the default passed at no rate, yet missed at the recommended one: the
        # gap is shown, its size is not (a ratio over its search figure read 0.98x).
        text += (f"; the vLLM default's search read {default['capacity_rps']:.2f} req/s, a "
                 "figure that did not hold when re-measured")  # fmt: skip
    elif ratio is not None:
        text += f", {ratio:.2f}x the vLLM default's {default['capacity_rps']:.2f}"
        if default.get("lower_bound"):
            text += _cut(default)
        elif default.get("held_when_remeasured") is False:
            text += ", a figure that did not hold when re-measured"
        if basis == UNCHECKED:
            text += " (not checked at the same traffic)"
    elif default is not None:
        text += f"; the vLLM default meets {slo} at no measured rate"
    same = rec.get("default_at_recommended_rate")
    if same and not same["default"]["meets_slo"]:
        misses = missed_terms(same["default"])
        what = "it falls behind"
        if misses:
            what = f"{misses[0]['metric']} {ms_text(misses[0]['value_ms'])}"
        interval = unsettled_interval(misses[0]) if misses else None
        if interval:
            what += f", {interval}"
        text += f"; at that rate the default misses the SLO ({what})"
    return text


def _time_cut_text(rec: dict[str, Any]) -> str:
    """What a target too slow for the budget needs: a level at its rates takes minutes."""
    if not (cut := rec.get("time_cut")):
        return ""
    minutes = math.ceil(cut["budget_needed_s"] / 60)
    return (f"; no level passed before the time budget ran out: the next, at {cut['rate_rps']:.2f} "
            f"req/s, needed {cut['level_s'] / 60:.1f} min for its {cut['requests']} requests, so "
            f"give --time-budget {minutes}m or more (--resume goes on from there), or a smaller "
            "--min-requests (a p99 over fewer requests is noisier)")  # fmt: skip


def _cut(config: dict[str, Any]) -> str:
    return " (a lower bound: its measurement was cut short)" if config.get("lower_bound") else ""


# How far the headline's ratio over the default can be trusted (rec["headline"]["basis"]).
SAME_TRAFFIC = "same_traffic"  # the default, measured at the recommended rate, missed the SLO
WITHIN_NOISE = "within_noise"  # ... and met it: the capacities differ by less than the noise
UNCHECKED = "unchecked"  # no same-traffic measurement (--repeats 0, or no time left for it)
DEFAULT_BEST = "default_best"  # the best config confirmed is the default itself: nothing to claim


def headline(rec: dict[str, Any]) -> dict[str, Any]:
    """Claim a ratio over the default only when the same traffic shows it: the default missing
    the SLO at the rate the recommendation was confirmed at. When the default holds there too,
    the difference is within noise and the default (the smaller change) is recommended."""
    ratio, same = rec.get("ratio_vs_default"), rec.get("default_at_recommended_rate")
    if ratio is None or not rec.get("feasible"):
        return {"basis": None, "claimed_ratio": None}
    if rec["best"]["config"] == (rec.get("default") or {}).get("config"):
        return {"basis": DEFAULT_BEST, "claimed_ratio": None, "recommend": "default"}
    if not same:
        return {"basis": UNCHECKED, "claimed_ratio": None}
    if same["default"]["meets_slo"] or not _missed_on_most_draws(same["default"]):
        return {"basis": WITHIN_NOISE, "claimed_ratio": None, "recommend": "default"}
    if _default_fell(rec.get("default")):
        return {"basis": SAME_TRAFFIC, "claimed_ratio": None}
    return {"basis": SAME_TRAFFIC, "claimed_ratio": ratio}


def _default_fell(default: dict[str, Any] | None) -> bool:
    """The default, re-measured, passed at no rate: its capacity is its search's figure, one
    a ratio cannot rest on."""
    return bool(default) and default.get("held_when_remeasured") is False


def _missed_on_most_draws(default: dict[str, Any]) -> bool:
    """Pooled, one bad draw can sink the default's p99: on vLLM CPU it read 64 ms over three
    draws at a rate where two of them, alone, met 30 ms. A miss counts when most draws miss on
    their own (a report written before draws were judged alone goes by the pooled verdict)."""
    missed = default.get("draws_missed")
    return missed is None or 2 * missed > default.get("draws", 1)


def draws_held(default: dict[str, Any]) -> str:
    """' on 2 of its 3 arrival draws alone' when the pooled verdict missed but most draws did
    not; '' when it met the SLO pooled."""
    if default["meets_slo"] or default.get("draws_missed") is None:
        return ""
    draws = default.get("draws", 1)
    return f" on {draws - default['draws_missed']} of its {draws} arrival draws alone"


def missed_terms(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The SLO terms one config's point estimate broke at that rate."""
    return [t for t in config["terms"] if t["value_ms"] is None or t["value_ms"] > t["limit_ms"]]


def unsettled_interval(t: dict[str, Any]) -> str | None:
    """'95% interval 20.3-164.1 ms' when a missed term's interval reaches below its limit, None
    when the whole interval lies above it. One level of ~100 requests pins a p99 loosely, so
    such a miss is a point estimate, not a settled fact."""
    if t["low_ms"] is None or t["low_ms"] > t["limit_ms"]:
        return None
    return f"95% interval {t['low_ms']:.1f}-{t['high_ms']:.1f} ms"


def same_rate_sentence(same: dict[str, Any] | None) -> str | None:
    """'At the recommended 15.6 req/s the vLLM default misses the SLO: tpot_p99 41.2 ms ...'."""
    if not same:
        return None
    rate, d = same["rate_rps"], same["default"]
    draws = d.get("draws", 1)
    measured = "measured once" if draws == 1 else f"{draws} arrival draws pooled"
    stopped = d.get("draws_stopped") or 0
    if stopped:  # its figures describe the requests finished before the stop
        which = "stopped" if draws == 1 else f"{stopped} of them stopped"
        measured += f"; {which} once the SLO was already broken"
    if d["meets_slo"]:
        return f"At {rate:.2f} req/s the vLLM default also meets the SLO ({measured})."
    if not _missed_on_most_draws(d):
        held = draws_held(d)
        return (f"At {rate:.2f} req/s the vLLM default meets the SLO{held} (pooled, one draw's "
                "tail sinks its p99, so that is not counted as a miss).")  # fmt: skip
    parts = [f"{t['metric']} {ms_text(t['value_ms'])} (limit {t['limit_ms']:g} ms; {_certainty(t)})"
             for t in missed_terms(d)]  # fmt: skip
    if not d["kept_up"]:
        parts.append(f"it completed only {d['served_fraction']:.0%} of the offered rate")
    if d["error_rate"] > 0:
        parts.append(f"{d['error_rate']:.1%} of requests failed")
    why = "; ".join(parts) or "it did not hold the SLO"
    return (f"At the recommended {rate:.2f} req/s the vLLM default misses the SLO "
            f"({measured}): {why}.")  # fmt: skip


def ms_text(value_ms: float | None) -> str:
    """A term's value; None is how a run file stores a metric no request lived to give."""
    return "without a successful request" if value_ms is None else f"{value_ms:.1f} ms"


def term_text(t: dict[str, Any]) -> str:
    """`41.2 [38.0, 45.1] ms`; only the point when a bound is missing (one draw, another
    worker's disk) or unbounded."""
    if t["value_ms"] is None or t.get("low_ms") is None or t.get("high_ms") is None:
        return ms_text(t["value_ms"])
    return f"{t['value_ms']:.1f} [{t['low_ms']:.1f}, {t['high_ms']:.1f}] ms"


def _certainty(t: dict[str, Any]) -> str:
    interval = unsettled_interval(t)
    if interval is None:
        return "its whole 95% interval lies above"
    return f"{interval}: one level does not settle it"


def bought_line(rec: dict[str, Any]) -> str | None:
    """What measuring bought over the table's value, when both were measured; a rule of thumb
    the run did not measure is said to be so, never read off the default."""
    thumb, ratio = rec.get("rule_of_thumb"), rec.get("ratio_vs_rule_of_thumb")
    best = rec.get("best")
    if not thumb or not best:
        return None
    if thumb.get("measured") is False:
        head = f"The rule of thumb ({thumb_text(thumb)}) was not measured in this run."
    elif ratio is None:
        return None
    else:
        same = " (the same as vLLM's default here)" if thumb.get("same_as_default") else ""
        head = (f"The rule of thumb ({thumb['table']}) serves {thumb['capacity_rps']:.2f} "
                f"req/s{same}; the measured config serves {ratio:.2f}x that.")  # fmt: skip
    return f"{head} What stops the recommended config going faster: {best['limited_by']}."


def thumb_text(thumb: dict[str, Any]) -> str:
    """An unmeasured rule of thumb: the table's row, its config, its simulated capacity."""
    text = f"{thumb['table']}: {short_config(thumb['config'])}"
    if thumb.get("simulated_rps"):
        text += f"; simulated at {thumb['simulated_rps']:.2f} req/s"
    return text


def print_summary(rec: dict[str, Any]) -> None:
    """The end of a run, for a person: the sentence, the flags, where the files are."""
    from rich.console import Console

    console = Console()
    console.print(f"\n[bold]{rec['summary']}[/bold]")
    if rec.get("flags"):
        console.print(f"  vLLM:   {rec['flags']['vllm']}", soft_wrap=True)
        console.print(f"  SGLang: {rec['flags']['sglang']}  (translated; not tested on SGLang)",
                      soft_wrap=True)  # fmt: skip
        for note in rec["flags"]["notes"]:
            console.print(f"  note: {note}", soft_wrap=True)
    if rec.get("best"):
        console.print(f"  limited by: {rec['best']['limited_by']}", soft_wrap=True)
    thumb = rec.get("rule_of_thumb")
    if thumb and thumb.get("measured") is False:
        console.print(f"  rule of thumb ({thumb_text(thumb)}): not measured", soft_wrap=True)
    elif thumb and rec.get("ratio_vs_rule_of_thumb") and not thumb.get("same_as_default"):
        console.print(f"  rule of thumb ({thumb['table']}): {thumb['capacity_rps']:.2f} req/s; "
                      f"measured config is {rec['ratio_vs_rule_of_thumb']:.2f}x")  # fmt: skip
    console.print(f"  report: {rec['run_dir']}/recommendation.html (also .md, .json)")


_CHUNKED = "enable_chunked_prefill"


def _flag(name: str, value: Any) -> str:
    return f"{KNOBS[name].vllm_flag} {value}"


def vllm_flags(knobs: dict[str, Any]) -> str:
    """`vllm serve` flags (vllm/engine/arg_utils.py names for SchedulerConfig fields)."""
    parts = [_flag(n, knobs[n]) for n in ("max_num_batched_tokens", "max_num_seqs") if n in knobs]
    if _CHUNKED in knobs:
        chunk_flag = str(KNOBS[_CHUNKED].vllm_flag)
        parts.append(chunk_flag if knobs[_CHUNKED] else "--no-" + chunk_flag.removeprefix("--"))
    if not knobs.get(_CHUNKED, True):
        return " ".join(parts)
    if knobs.get("long_prefill_token_threshold"):
        parts.append(_flag("long_prefill_token_threshold", knobs["long_prefill_token_threshold"]))
    if knobs.get("long_prefill_token_threshold_adaptive"):
        parts.append(str(KNOBS["long_prefill_token_threshold_adaptive"].vllm_flag))
    return " ".join(parts)


def sglang_flags(knobs: dict[str, Any]) -> str:
    """`python -m sglang.launch_server` flags (sglang/srt/server_args.py).

    SGLang caps each prefill chunk with --chunked-prefill-size and the prefill batch with
    --max-prefill-tokens; --enable-mixed-chunk lets running decodes ride in the same batch as a
    prefill chunk, which is what decode_first (Sarathi's stall-free batching) means.
    """
    budget, chunked = knobs["max_num_batched_tokens"], knobs.get(_CHUNKED, True)
    chunk = (knobs.get("long_prefill_token_threshold") or budget) if chunked else -1
    parts = [f"--chunked-prefill-size {chunk}", f"--max-prefill-tokens {budget}"]
    if "max_num_seqs" in knobs:
        parts.append(f"--max-running-requests {knobs['max_num_seqs']}")
    if chunked and _policy(knobs) is Policy.DECODE_FIRST:
        parts.append("--enable-mixed-chunk")
    return " ".join(parts)


def flag_notes(knobs: dict[str, Any]) -> list[str]:
    """What the flags cannot say, so nobody pastes them believing they carry everything."""
    notes = []
    if _policy(knobs) is Policy.PREFILL_FIRST:
        notes.append(
            "policy=prefill_first has no vLLM flag: vLLM always schedules running decodes "
            "first; SGLang without --enable-mixed-chunk runs prefill batches first"
        )
    if knobs.get("long_prefill_token_threshold_adaptive"):
        notes.append("SGLang has no equivalent of --long-prefill-token-threshold-adaptive")
    return notes


def _policy(knobs: dict[str, Any]) -> Policy:
    # Without a policy knob the server is vLLM V1's: running requests (decodes) first.
    return Policy(knobs.get("policy", Policy.DECODE_FIRST))
