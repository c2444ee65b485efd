"""Asynchronous, staleness-bounded rollouts (``trainer.rollout=async``; docs/async.md).

- :mod:`~mmrl.asynchronous.staleness`: AReaL's capacity rule (may another group start?), a pure class.
- :mod:`~mmrl.asynchronous.ledger`: the rounds handed out and the order in which the learner consumes their slots; the
  sampler position a checkpoint resumes from.
- :mod:`~mmrl.asynchronous.weights`: versioned weights in shared memory (the learner publishes, workers load).
- :mod:`~mmrl.asynchronous.worker`: the rollout worker process.
- :mod:`~mmrl.asynchronous.runtime`: the learner's side: workers, dispatch, consumption, metrics, restarts.
"""
