"""No silent no-ops: every config key changes a named quantity, is rejected by validation, or is a speed / memory
knob that leaves every number identical; the rest are allow-listed with a reason (``liveness_table.py``).

* ``test_every_key_has_a_row``: the schema's keys (``SECTIONS`` and their nested sections) and every env's constructor
  keywords each have exactly one row; a new key without one fails here.
* ``test_reference_is_current``: ``docs/config_reference.md`` is what ``scripts/config_reference.py`` renders.
* ``test_case``: one case of one row (``liveness_runner.check``); the cases whose quantity needs the real trainers
  (``ppo_step``, ``warm``, ``archer_step``) are ``test_slow_case``, marked slow.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import liveness_runner as R
import pytest
import torch
from liveness_table import TABLE

import ragen.env
from ragen.trainer.config.schema import NESTED, SECTIONS

ROOT = Path(__file__).resolve().parents[2]
TABLE_FILE = "tests/liveness/liveness_table.py"


def schema_keys() -> list[str]:
    """Every key of the trainer config: ``<section>.<field>``, and for the nested sections (``rollout.vllm``,
    ``algorithm.rollout_correction``: ``NESTED``) ``<section>.<field>.<key>``."""
    keys = []
    for name, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            nested = NESTED.get(str(f.type))
            if nested is not None:
                keys += [f"{name}.{f.name}.{v.name}" for v in dataclasses.fields(nested)]
            else:
                keys.append(f"{name}.{f.name}")
    return keys


def env_keys() -> list[str]:
    """``<env>:env.config.<keyword>`` for every constructor keyword of the shipped envs (``config/env/<name>.yaml``;
    envs that tests register are not part of the config)."""
    import yaml

    # variant files (frozen_lake_3x3.yaml...) configure a shipped env under another file name
    names = sorted({yaml.safe_load(p.read_text())["name"] for p in (ROOT / "config" / "env").glob("*.yaml")})
    return [f"{name}:env.config.{key}" for name in names for key in ragen.env.config_keys(name)]


def test_every_key_has_a_row():
    ids = TABLE.by_id()
    missing = [k for k in schema_keys() + env_keys() if k not in ids]
    assert not missing, "\n".join(f"add a row for {k} in {TABLE_FILE}" for k in missing)
    stale = sorted(set(ids) - set(schema_keys()) - set(env_keys()))
    assert not stale, f"rows for keys that do not exist (remove them from {TABLE_FILE}): {stale}"
    for row in TABLE.rows:
        assert bool(row.allow) != bool(row.cases), f"{row.id}: a row has either cases or an allow reason"


@pytest.mark.slow
def test_reference_is_current():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import config_reference
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    committed = (ROOT / "docs" / "config_reference.md").read_text() if (ROOT / "docs" / "config_reference.md"
                                                                         ).is_file() else ""
    assert config_reference.render() == committed, "docs/config_reference.md is stale: run " \
                                                    "`python scripts/config_reference.py`"


def _params(slow: bool) -> list:
    out = []
    for row in TABLE.rows:
        for i, case in enumerate(row.cases):
            if bool(case.quantity and case.quantity.slow) != slow:
                continue
            marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
            ctx = ",".join(c for c in case.context if not c.startswith(("algorithm=", "env="))) or "-"
            head = [c.split("=")[1] for c in case.context if c.startswith(("algorithm=", "env="))]
            out.append(pytest.param(row, case, marks=marks,
                                    id=f"{row.id}={case.value!r}|{'/'.join(head) or 'base'}|{ctx}|{i}"))
    return out


def _run(row, case) -> None:
    reason = case.skip() if case.skip else None
    if reason:
        pytest.skip(reason)
    R.check(row, case)


@pytest.mark.parametrize(("row", "case"), _params(slow=False))
def test_case(row, case):
    _run(row, case)


@pytest.mark.slow
@pytest.mark.parametrize(("row", "case"), _params(slow=True))
def test_slow_case(row, case):
    _run(row, case)


@pytest.mark.parametrize("agg", ["seq-mean-token-sum", "seq-mean-token-mean"])
def test_the_loss_probe_sees_the_turn_layouts_episode_grouping(agg, monkeypatch):
    # the walk's loss probe builds its batch as the trainer does (Layout.train_batch: turn rows carry their
    # episode as seq_ids, through credit.to_train_batch); without the grouping a seq-mean loss counts turn rows as
    # sequences, which must show
    import liveness_probes as P

    from ragen.trainer import credit

    cfg = P.Configs().build(("agent.layout=turn", "env=frozen_lake", "env.max_turn=3"), "actor.loss_agg", agg)
    grouped = P.loss(cfg)
    real = credit.to_train_batch
    monkeypatch.setattr(credit, "to_train_batch", lambda batch, seq_ids=None: real(batch))
    ungrouped = P.loss(cfg)
    assert not torch.allclose(grouped["loss"], ungrouped["loss"], rtol=1e-4)
