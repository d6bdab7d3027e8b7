"""The printed summary of ``mstar-ros bench bagel``: the table, the bound, the ratios against their goals."""

from __future__ import annotations

from mstar_ros.bench.machine import header_line


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def summary_lines(report: dict) -> list[str]:
    m, g, met = report["model"], report["goals"], report["goals_met"]
    llm = m["llm"]
    lines = [
        header_line(report),
        f"model: {llm['layers']} layers of {llm['hidden']} ({llm['heads']} heads x {llm['head_dim']}, "
        f"{llm['kv_heads']} KV), {m['image_side']} px images ({m['latent_tokens']} latent tokens, "
        f"{m['vit_rows']} ViT rows), {report['options']['steps']} flow points"
        + (" -- RANDOM weights: timings only, the images and answers are noise" if m["random_weights"] else ""),
        "task  ours      reference  speedup  bound  of bound  goal      latents differ",
    ]
    for task in ("edit", "t2i"):
        r = report[task]
        lines.append(
            f"{task:<5} {r['ours_s']:>6.2f} s {r['reference_s']:>8.2f} s {r['speedup']:>7.2f}x "
            f"{r['bound']:>5.2f} {r['fraction_of_bound']:>8.2f}  >= {g[f'speedup_{task}']:g}: "
            f"{_met(met[f'speedup_{task}']):<7} {r['latent_rel_diff']:.1e}"
        )
    for task in ("edit", "t2i"):
        b = report["bound"][task]
        each = " + ".join(f"{v:.0f}" for v in b["separate_ms"].values())
        lines.append(
            f"bound {task}: one flow forward over {b['branches_together']} branches' rows together "
            f"{b['together_ms']:.0f} ms vs the reference's three separate {each} = {b['three_separate_ms']:.0f} ms "
            f"({b['guided_steps']} guided + {b['unguided_steps']} unguided steps) -> {b['bound']:.2f}x"
        )
    lines.append(
        "CPU GEMM (hidden -> MLP, as the engines run it): "
        + ", ".join(f"{g['rows']} rows {g['ms']:.2f} ms ({g['gflops']:.0f} GFLOP/s)" for g in report["bound"]["gemm"])
    )
    chat = report["chat"]
    lines.append(
        f"image to text, {chat['answer_tokens']} tokens: the reference takes {chat['reference_per_request_s']:.2f} s "
        f"per request (first token at {chat['reference_first_token_s'] * 1000:.0f} ms, then "
        f"{chat['reference_decode_ms_per_token']:.1f} ms per token), one at a time; ours max_batched_tokens "
        f"{report['max_batched_tokens']}"
    )
    lines.append(
        "  C  ours ttft p50  ref ttft (streamed / as served)  ours tok/s  ref tok/s  ratio  decode step  bound"
    )
    for c, lv in sorted(chat["levels"].items(), key=lambda kv: int(kv[0])):
        ref = lv["reference"]
        lines.append(
            f"{c:>3} {lv['ttft_ms']['p50']:>10.0f} ms {ref['ttft_ms_if_streamed']['p50']:>12.0f} / "
            f"{ref['ttft_ms_as_served']['p50']:<8.0f} ms {lv['tokens_per_s']:>13.1f} {ref['tokens_per_s']:>10.1f} "
            f"{lv['throughput_ratio']:>5.2f}x {_ms(lv['decode_step_ms']):>10} {_x(lv.get('throughput_bound')):>6}"
        )
    ttft = next(k for k in report if k.startswith("ttft_ratio_c") and not k.endswith("_as_served"))
    tp = next(k for k in report if k.startswith("throughput_ratio_c"))
    lines += [
        f"time to first token vs the reference's loop: {report[ttft]:.2f} (goal <= {g['ttft_ratio_c1']:g}): "
        f"{_met(met[ttft])}; vs when it returns the answer: {report[ttft + '_as_served']:.2f}",
        f"throughput at the highest concurrency: {report[tp]:.2f}x (goal >= {g['throughput_ratio_c8']:g}): "
        f"{_met(met[tp])}",
        f"of the bound (goal >= {g['fraction_of_bound']:g}): edit {report['fraction_of_bound_edit']:.2f} "
        f"({_met(met['fraction_of_bound_edit'])}), t2i {report['fraction_of_bound_t2i']:.2f} "
        f"({_met(met['fraction_of_bound_t2i'])})",
    ]
    if m["random_weights"]:
        lines.append("(random weights: the figures are timings; the images and answers mean nothing)")
    return lines
