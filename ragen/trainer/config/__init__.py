"""The run's configuration, in one package: the typed schema (the only place defaults live), composing it from
Hydra, and every check run before anything starts.

* ``schema`` (``TrainConfig`` and its sections; ``archer_schema`` the ArCHer sections), ``value_types`` (a value of
  the wrong type, by key), ``compose`` (find and compose ``config/``), ``env_mix`` (the envs of a run);
* ``run_shape``: what the frozen config resolves to, never stored back (roles, devices, world sizes, batch shapes);
* ``preflight``: the registry of checks and the one call that runs them; the checks: ``shared_checks`` (both
  algorithm families), ``ppo_checks`` (the PPO family), ``unread_keys`` (values that would change nothing),
  ``resource_checks`` (what the config points at: the model, the output folder, the envs), ``memory_checks`` (the
  GPU memory plan, ``memory_plan``);
* ``dry_run``: ``ragen train --check``, every check and the plan, nothing started.

Nothing is imported here: ``import ragen.trainer.config.schema`` and friends.
"""
