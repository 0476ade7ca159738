"""The run layer both algorithm families (``ragen.ppo``, ``ragen.archer``) build on.

* ``config``: the run's configuration in one package: the schema, composing it, every check before start;
* ``run`` (what a run holds: workers, engine, proxies, tracker, state, checkpoints; ``Run``), ``builders`` (model
  folder, Ray, worker groups, engine, agent proxies), ``placement`` (GPU placement groups, engine GPUs, weight sync),
  ``hosted`` (engines hosted in the actor's ranks), ``step_memory`` (between-phase offload, memory peaks);
* ``layout`` (training on the row layout ``agent.layout`` names), ``credit`` (group filter, advantages, worker batch,
  rollout correction), ``metrics`` (the step's metrics), ``numerics`` (non-finite inputs never reach the weights),
  ``state`` (trainer state, RNG isolation), ``warm_start`` (behaviour cloning on the envs' experts) and ``dry_run``
  (``ragen train --check``).

``ragen.launch`` picks a family by ``algorithm.name``. Nothing heavy is imported here.
"""
