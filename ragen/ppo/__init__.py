"""The PPO family's trainer (token-, turn- and bi-level GAE, the group-relative and turn-credit estimators) on the
run layer (``ragen.trainer``): ``trainer`` (the loop of named, timed phases), ``truncation`` (values of episodes cut
by the length budget), ``restarts`` (rebuilding dead workers) and ``report`` (what the run report saves per step).
Its config checks are the ``ppo`` family of ``ragen.trainer.config.preflight`` (``ragen.trainer.config.ppo_checks``).
"""
