"""PPO-family trainer: Hydra entry point (``python -m ragen.train``), frozen config schema, validation, driver.

Modules: ``config`` (schema dataclasses mirrored by ``config/base.yaml``), ``compose`` (find / compose the Hydra
configs), ``validate`` (checks before anything starts), ``derived`` (world sizes, roles, batch shapes),
``builders`` (model folder, Ray, worker groups, engine, agent proxies), ``phases`` / ``turn_layout`` (pure
helpers of one step), ``state`` (trainer state, RNG isolation), ``ppo_trainer`` (the loop), ``main`` (run).
Nothing heavy is imported here.
"""
