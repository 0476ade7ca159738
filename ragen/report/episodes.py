"""One step page: every validation episode and the training sample of one step, as conversations whose model
tokens are coloured by their advantage.

Colour scale (:func:`advantage_color`): diverging, white at 0, blue for positive and red for negative advantages,
saturated at +-``scale`` = the largest |advantage| over the model tokens of that section (validation and training
have their own scale: training advantages are whitened over the train batch, validation ones over the validation
batch). Prompt and env tokens are greyed; hovering a model token shows its position, turn, advantage, value,
return and log-prob (``title`` attribute). All text from the model or the env is HTML-escaped.
"""

from __future__ import annotations

import html
from typing import Any

NEUTRAL = "#e6e6e6"  # model tokens without an advantage (none computed)
POSITIVE = (33, 102, 172)
NEGATIVE = (178, 24, 43)

FILTER_JS = """
function ragenFilter(w) {
  document.querySelectorAll('.ep').forEach(function (e) {
    var ok = w === 'all' || e.dataset.success === (w === 'success' ? '1' : '0');
    e.style.display = ok ? '' : 'none';
  });
  document.querySelectorAll('.fb').forEach(function (b) { b.classList.toggle('on', b.dataset.w === w); });
}
"""


def advantage_color(a: float, scale: float) -> str:
    """``#rrggbb`` of advantage ``a`` on the diverging scale saturated at +-``scale`` (white at 0)."""
    t = max(-1.0, min(1.0, a / scale)) if scale > 0 else 0.0
    end = POSITIVE if t >= 0 else NEGATIVE
    rgb = [round(255 + abs(t) * (c - 255)) for c in end]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def section_scale(records: list[dict[str, Any]]) -> float:
    """The largest |advantage| over the model tokens of ``records`` (1.0 when there is none or all are 0)."""
    best = 0.0
    for rec in records:
        for row in rec.get("rows", []):
            adv = row.get("advantages")
            if adv is None:
                continue
            best = max([best, *(abs(a) for a, m in zip(adv, row["response_mask"], strict=True) if m)])
    return best or 1.0


def _num(values: list[float] | None, t: int, fmt: str) -> str:
    return "n/a" if values is None else format(values[t], fmt)


def _token_span(row: dict[str, Any], t: int, scale: float) -> str:
    adv = row.get("advantages")
    a = None if adv is None else adv[t]
    title = (f"token {t} (id {row['token_ids'][t]}) · turn {row['turn_ids'][t]}\n"
             f"advantage {_num(adv, t, '+.4f')}\nvalue {_num(row.get('values'), t, '.4f')}\n"
             f"return {_num(row.get('returns'), t, '.4f')}\nlog-prob {_num(row.get('log_probs'), t, '.4f')}")
    color = NEUTRAL if a is None else advantage_color(a, scale)
    dark = a is not None and abs(a) > 0.6 * scale
    style = f"background:{color}" + (";color:#fff" if dark else "")
    return (f'<span class="m" style="{style}" title="{html.escape(title, quote=True)}">'
            f"{html.escape(row['pieces'][t])}</span>")


def _leading_prompt(pieces: list[str], observation: str) -> str:
    """The prompt before a row's first model token: folded (``<details>``) up to where the turn's observation
    starts, the observation and the rest (template tail, forced prefix) shown greyed."""
    text = "".join(pieces)
    cut = text.rfind(observation) if observation else -1
    head, tail = (text, "") if cut < 0 else (text[:cut], text[cut:])
    folded = (f'<details class="prompt"><summary>prompt · {len(pieces)} tokens</summary><span class="e">'
              f"{html.escape(head)}</span></details>") if head else ""
    return folded + (f'<span class="e">{html.escape(tail)}</span>' if tail else "")


def render_row(row: dict[str, Any], turn_rewards: list[float], scale: float, observations: list[str]) -> str:
    """One token sequence: the leading prompt folded up to the current turn's observation (``observations[k]``:
    the text turn k was shown), env tokens greyed, one coloured span per model token, and a reward badge after the
    last model token of each turn."""
    mask, tids, pieces = row["response_mask"], row["turn_ids"], row["pieces"]
    n = len(mask)
    first = next((t for t in range(n) if mask[t]), n)
    out = []
    if first:
        k = tids[first] if first < n else 0
        out.append(_leading_prompt(pieces[:first], observations[k] if 0 <= k < len(observations) else ""))
    t = first
    while t < n:
        if not mask[t]:
            end = t
            while end < n and not mask[end]:
                end += 1
            out.append(f'<span class="e">{html.escape("".join(pieces[t:end]))}</span>')
            t = end
            continue
        out.append(_token_span(row, t, scale))
        k = tids[t]
        nxt = t + 1
        if (nxt >= n or tids[nxt] != k) and 0 <= k < len(turn_rewards):
            out.append(f'<span class="rw" title="reward of turn {k}">turn {k} · r={turn_rewards[k]:+.3f}</span>')
        t = nxt
    return '<div class="seq">' + "".join(out) + "</div>"


def _text_only(rec: dict[str, Any]) -> str:
    """Episodes saved without token rows (validation episodes beyond ``trainer.report_val_samples``, runs before the
    report existed): prompts greyed, responses plain."""
    out = []
    for k, turn in enumerate(rec.get("turns", [])):
        out.append(f'<span class="e">{html.escape(turn.get("prompt", ""))}\n</span>'
                   f'<span class="plain">{html.escape(turn.get("response", ""))}</span>'
                   f'<span class="rw">turn {k} · r={float(turn.get("reward", 0.0)):+.3f}</span>\n')
    return '<div class="seq">' + "".join(out) + "</div>"


def _turn_table(rec: dict[str, Any]) -> str:
    rows = []
    for k, turn in enumerate(rec.get("turns", [])):
        actions = html.escape(", ".join(turn.get("actions", [])) or "—")
        fmt = "ok" if turn.get("format_ok") else "unparsed"
        rows.append(f"<tr><td>{k}</td><td>{actions}</td><td>{float(turn.get('reward', 0.0)):+.3f}</td>"
                    f"<td>{fmt}</td></tr>")
    if not rows:
        return ""
    return ('<table class="turns"><tr><th>turn</th><th>actions</th><th>reward</th><th>format</th></tr>'
            + "".join(rows) + "</table>")


def render_episode(rec: dict[str, Any], anchor: str, scale: float) -> str:
    """One episode: header (env, seed, group, outcome, reward), turn table, token sequence(s)."""
    success = bool(rec.get("success"))
    rewards = [float(r) for r in rec.get("turn_rewards", [t.get("reward", 0.0) for t in rec.get("turns", [])])]
    flags = "".join(f' <span class="flag">{name}</span>' for name in ("truncated", "failed") if rec.get(name))
    error = f'<div class="err">{html.escape(str(rec["error"]))}</div>' if rec.get("error") else ""
    head = (f'<div class="eh"><a href="#{anchor}">#{anchor}</a> · {html.escape(str(rec.get("env", "")))} · '
            f'seed {html.escape(str(rec.get("seed", "")))} · group {html.escape(str(rec.get("group_id", "")))} · '
            f'<span class="{"ok" if success else "bad"}">{"success" if success else "failure"}</span> · '
            f"reward {sum(rewards):+.3f} · {len(rewards)} turn(s){flags}</div>")
    rows = rec.get("rows")
    observations = [str(turn.get("prompt", "")) for turn in rec.get("turns", [])]
    body = "".join(render_row(r, rewards, scale, observations) for r in rows) if rows else _text_only(rec)
    return (f'<div class="ep" id="{anchor}" data-success="{int(success)}">{head}{error}{_turn_table(rec)}'
            f"{body}</div>")


def legend(scale: float) -> str:
    stops = ", ".join(advantage_color(v * scale, scale) for v in (-1, -0.5, 0, 0.5, 1))
    return (f'<div class="legend"><span>{-scale:+.3g}</span><span class="bar" style="background:linear-gradient('
            f'to right, {stops})"></span><span>{scale:+.3g}</span> advantage (red: below baseline, blue: above); '
            '<span class="e">grey: prompt / env tokens</span>; hover a token for its numbers</div>')


def render_section(title: str, prefix: str, records: list[dict[str, Any]], note: str) -> str:
    """A titled list of episodes with its own colour scale; anchors ``{prefix}{i}``."""
    if not records:
        return f"<h2>{html.escape(title)}</h2><p class='note'>none saved for this step</p>"
    scale = section_scale(records)
    wins = sum(bool(r.get("success")) for r in records)
    eps = "".join(render_episode(r, f"{prefix}{i}", scale) for i, r in enumerate(records))
    return (f"<h2>{html.escape(title)} · {len(records)} episode(s), {wins} success(es)</h2>"
            f"<p class='note'>{note}</p>{legend(scale)}{eps}")


def step_page_body(step: int, val: list[dict[str, Any]], train: list[dict[str, Any]]) -> str:
    """The body of ``step_N.html`` (filters, validation section, training section)."""
    buttons = "".join(f'<button class="fb{" on" if w == "all" else ""}" data-w="{w}" onclick="ragenFilter(\'{w}\')">'
                      f"{w}</button>" for w in ("all", "success", "failure"))
    val_note = ("Validation rollouts (greedy by default). Advantages are what the estimator assigns over this "
                "validation batch with the critic of this step (for <code>trainer.report_val_samples</code> episodes; "
                "the others as text); nothing here is trained on. Group-relative "
                "estimators give 0 unless <code>rollout.val_group_size</code> >= 2.")
    train_note = ("A sample of the episodes this step trained on (<code>trainer.report_train_samples</code>), "
                  "with the advantages, values and old log-probs of the update.")
    return (f'<p><a href="index.html">&larr; run report</a></p><h1>Step {step}</h1>'
            f'<div class="filters">show: {buttons}</div>'
            + render_section("Validation", "val-", val, val_note)
            + render_section("Training sample", "train-", train, train_note))
