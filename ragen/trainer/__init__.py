"""The run layer both algorithm families build on, and the PPO family's trainer.

Shared by the PPO trainer and the ArCHer family (``ragen.archer``): ``config`` (schema dataclasses mirrored by
``config/base.yaml``; ``config_archer`` holds the ArCHer section, ``config_types`` the type checks), ``compose``
(find / compose the Hydra configs), ``checks`` (config checks every family runs), ``derived`` (world sizes,
roles, batch shapes), ``env_mix`` (the envs of a run), ``prestart`` (the model loads, the output folder is free)
and ``plan`` (the dry run), ``builders`` (model folder, Ray, worker groups, engine, agent proxies), ``placement``
(GPU placement groups, the vLLM engine's GPUs), ``driver`` (the run's set-up, checkpoint policy and logging:
the base class of both trainers), ``warm_start`` (behaviour cloning on the envs' experts; the warm-start-only
job), ``numerics`` (non-finite inputs never reach the weights), ``state`` (trainer state, RNG isolation),
``layout`` (training on the row layout ``agent.layout`` names) and ``turn_layout`` / ``phases`` (pure helpers of a
step).

The PPO family: ``validate`` (its checks), ``inert`` (values that would change nothing), ``ppo_trainer`` (the
loop and its run), ``bootstrap`` (values of episodes cut by the length budget), ``restarts`` (rebuilding dead
workers) and ``report_phase`` (what the run report saves per step). ``ragen.launch`` picks a family by
``algorithm.name``. Nothing heavy is imported here.
"""
