"""Render the liveness table (``tests/liveness/liveness_table.py``) as ``docs/config_reference.md``: every config key
with its default, what it is (the comment of ``config/base.yaml`` / ``config/env/<name>.yaml``) and what changing it
does (the quantity it changes, when validation rejects it, or why it is outside the walk).

    python scripts/config_reference.py          # write docs/config_reference.md
    python scripts/config_reference.py --check  # exit 1 when the committed file is stale

``tests/liveness/test_liveness.py`` checks the committed file is current and that every key behaves as it says.
The estimator walk's verdicts (which estimators read an ``algorithm`` key) come from validation, so rendering
composes the walk's configs (a few seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config_reference.md"
_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def _liveness():
    folder = str(ROOT / "tests" / "liveness")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    import liveness_env_rows
    import liveness_model
    import liveness_runner
    import liveness_table

    return liveness_table.TABLE, liveness_model, liveness_runner, liveness_env_rows


def yaml_comments(path: Path) -> dict[str, str]:
    """``{dotted key: comment}`` of a YAML file: the ``#`` comment on a key's line plus comment-only lines indented
    below it (continuations)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last = None
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if last is not None and len(line) - len(line.lstrip()) > last[1]:
                out[last[0]] = (out.get(last[0], "") + " " + stripped.lstrip("# ").strip()).strip()
            continue
        m = _KEY.match(line)
        if not m or stripped.startswith("-"):
            last = None
            continue
        indent = len(m["indent"])
        stack = [(i, k) for i, k in stack if i < indent]
        key = ".".join([k for _, k in stack] + [m["key"]])
        stack.append((indent, m["key"]))
        comment = _comment(m["rest"])
        if comment:
            out[key] = comment
        last = (key, indent)
    return out


def _comment(rest: str) -> str:
    """The ``# ...`` part of a YAML value outside quotes."""
    quote = None
    for i, ch in enumerate(rest):
        if ch in "\"'" and quote in (None, ch):
            quote = None if quote else ch
        elif ch == "#" and quote is None and (i == 0 or rest[i - 1].isspace()):
            return rest[i + 1:].strip()
    return ""


def _defaults() -> dict[str, object]:
    from ragen.trainer.config.schema import NESTED, SECTIONS, default_section_values

    out = {}
    for name, cls in SECTIONS.items():
        types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        for key, value in default_section_values(name).items():
            nested = NESTED.get(types[key])
            if nested is not None:  # rollout.vllm, algorithm.rollout_correction: one row per key
                out.update({f"{name}.{key}.{f.name}": getattr(nested(), f.name) for f in dataclasses.fields(nested)})
            else:
                out[f"{name}.{key}"] = value
    return out


def _env_default(env: str, key: str) -> object:
    import ragen.env

    return inspect.signature(ragen.env.base._lookup(env)).parameters[key.rsplit(".", 1)[-1]].default


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _values(values: list) -> str:
    from ragen.trainer.config.unread_keys import show

    return ", ".join("the other value" if repr(v) == "flip" else show(v) for v in values)


def _shown(context: tuple[str, ...], hidden: tuple[str, ...], named: dict[str, tuple[str, ...]] | None = None) -> str:
    """`` with `a=1`, `b=2``` for the overrides of ``context`` not in ``hidden``; a named context (``NAMED_CONTEXTS``)
    it starts with is written by name."""
    words = []
    for name, prefix in (named or {}).items():
        if context[:len(prefix)] == prefix:
            words.append(f"the {name} context")
            context = context[len(prefix):]
            break
    words += [f"`{c}`" for c in context if c not in hidden]
    return f" with {', '.join(words)}" if words else ""


def _phrases(row, model, runner, default, hidden: tuple[str, ...], named: dict) -> list[str]:
    """The effect column of a row: one phrase per group of alike cases (the value walked from when the context's
    differs from the default)."""
    from ragen.trainer.config.unread_keys import show

    groups: dict[tuple, list] = defaultdict(list)
    live = [c for c in row.cases if c.expect == "live"]
    for c in row.cases:
        if c.expect != "live":
            label = c.quantity.label if c.quantity else ""
            groups[(c.expect, label, c.context, c.xfail, c.tol, c.outliers, c.only)].append(c.value)
    out = []
    for (expect, label, context, xfail, tol, outliers, only), values in groups.items():
        own = runner.P.lookup(runner.CONFIGS.build(context), row.key)
        start = f" (from {show(own)})" if runner.normalized(own) != runner.normalized(default) else ""
        where = _shown(context, hidden, named) + start + (f", {only}" if only else "")
        if xfail:
            kind = "no change shown" if xfail.startswith("not demonstrated") else "known silent no-op"
            out.append(f"**{kind}** (strict xfail): {_values(values)}{where} ({xfail})")
        elif expect == "changes":
            out.append(f"changes {label}: {_values(values)}{where}")
        elif expect == "rejected":
            out.append(f"rejected: {_values(values)}{where}")
        elif expect == "invariant":
            bound = "bitwise" if tol == 0 else f"within {tol:g}"
            bound += f", all but {outliers:g} of the entries" if outliers else ""
            out.append(f"invariant ({bound}; {label}): {_values(values)}{where}")
        else:
            out.append(f"same numbers (what the context's value resolves to): {_values(values)}{where}")
    if live:
        out += _live_phrases(row, live, model, runner)
    return out + ([row.note] if row.note else [])


def _live_phrases(row, cases, model, runner) -> list[str]:
    """The estimator walk: per extra context, the values with the same verdicts grouped, and per verdict the
    estimators (with the layout where the two layouts differ), or "every estimator and layout"."""
    label = cases[0].quantity.label
    per_value: dict[tuple, dict[tuple[str, str], str]] = defaultdict(dict)
    for c in cases:
        est = next(x.split("=", 1)[1] for x in c.context if x.startswith("algorithm="))
        layout = next(x.split("=", 1)[1] for x in c.context if x.startswith("agent.layout="))
        when = c.context[len(model.estimator_context(est, layout)):]  # sweep: the estimator's context, then `when`
        per_value[(when, _values([c.value]))][(est, layout)] = "no-op" if c.xfail else runner.verdict(row, c)[0]
    grouped: dict[tuple, list[str]] = defaultdict(list)
    for (when, value), verdicts in per_value.items():
        grouped[(when, tuple(sorted(verdicts.items())))].append(value)
    text = {"accepted": f"changes {label}", "inert": "rejected as having no effect", "rejected": "rejected",
            "no-op": "**known silent no-op** (strict xfail)"}
    out = []
    for (when, verdicts), values in grouped.items():
        by_verdict: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for (est, layout), verdict in verdicts:
            by_verdict[verdict].append((est, layout))
        parts = []
        every = len(verdicts) == len(model.ESTIMATORS) * len(model.LAYOUTS)
        for verdict, pairs in by_verdict.items():
            if len(by_verdict) == 1 and every:
                parts.append(f"{text[verdict]} (every estimator, both layouts)")
                continue
            layouts = defaultdict(list)
            for est, layout in pairs:
                layouts[est].append(layout)
            ests = [e if len(ls) == 2 else f"{e} ({ls[0]} layout)" for e, ls in layouts.items()]
            parts.append(f"{text[verdict]}: {', '.join(ests)}")
        out.append(f"{', '.join(values)}{_shown(when, ())}: {'; '.join(parts)}")
    return out


def _category(row) -> str:
    if row.allow:
        return "not numeric"
    kinds = {c.expect for c in row.cases}
    if "invariant" in kinds:
        return "invariant"
    return "changes" if kinds & {"changes", "live"} else "rejected"


def render() -> str:
    """The reference as markdown (deterministic: the same table and configs give the same text)."""
    from ragen.trainer.config.unread_keys import show

    table, model, runner, env_rows = _liveness()
    import liveness_table

    named = liveness_table.NAMED_CONTEXTS
    comments = yaml_comments(ROOT / "config" / "base.yaml")
    defaults = _defaults()
    counts = defaultdict(int)
    known = sum(1 for r in table.rows for c in r.cases if c.xfail)
    sections: dict[str, list[str]] = defaultdict(list)
    for row in table.rows:
        counts[_category(row)] += 1
        if row.env:
            section = f"env.config of {row.env}"
            what = yaml_comments(ROOT / "config" / "env" / f"{row.env}.yaml").get(row.key, "")
            default, hidden = _env_default(row.env, row.key), env_rows.env_context(row.env)
        else:
            section = row.key.split(".")[0]
            what, default, hidden = comments.get(row.key, ""), defaults[row.key], ()
        effect = f"not numeric: {row.allow}" if row.allow else "; ".join(_phrases(row, model, runner, default, hidden,
                                                                                    named))
        sections[section].append(f"| `{row.key}` | `{_cell(show(default))}` | {_cell(what) or '—'} | {_cell(effect)} |")
    head = [
        "# Config reference",
        "",
        "Generated by `python scripts/config_reference.py` from `tests/liveness/liveness_table.py`; "
        "`tests/liveness/test_liveness.py` fails when this file is stale and checks every stated effect.",
        "",
        "Every key either changes a named quantity on a fixed tiny rollout and batch, is rejected by validation for "
        "the configuration named, or (speed and memory knobs) leaves every number identical; the rest are outside "
        "the walk for the reason given. Unless a context is named, a key is walked from the probe configuration "
        "(`liveness_probes.PROBE_BASE`: the base config with the tiny model, 2 x 4 episodes, fp32). "
        "`algorithm` and actor-loss keys are walked for every estimator and both layouts.",
        "",
        f"{len(table.rows)} keys: {counts['changes']} change a quantity, {counts['rejected']} are rejected or "
        f"resolve to the same setting, {counts['invariant']} are invariant (speed / memory), "
        f"{counts['not numeric']} are not numeric; {known} walked cases are strict xfails (known silent no-ops, "
        "or an effect the probe does not show).",
        "",
        "Named contexts: " + "; ".join(f"the {name} context = {', '.join(f'`{c}`' for c in ctx)}"
                                       for name, ctx in named.items()) + ".",
        "",
    ]
    body = []
    for section, lines in sections.items():
        note = ""
        if section.startswith("env.config of "):
            env = section.removeprefix("env.config of ")
            note = f"Walked with {', '.join(f'`{c}`' for c in env_rows.env_context(env))}.\n\n"
        body += [f"## {section}", "", note + "| key | default | what it is | effect of another value |",
                 "|---|---|---|---|", *lines, ""]
    return "\n".join(head + body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/config_reference.md is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = OUT.read_text() if OUT.is_file() else ""
        if current != text:
            print("docs/config_reference.md is stale: run `python scripts/config_reference.py`", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
