"""A user reward for the asynchronous tests: varied rewards for two calls, then a malformed answer (one value too
few), which the reward manager stops the run on (:class:`mmrl.rewards.manager.RewardError`). Counted per process: in
asynchronous mode only the rollout worker scores."""

_calls = 0


def malformed_on_third_call(prompts, completions, **kwargs) -> list[float]:
    global _calls
    _calls += 1
    values = [float(i % 2) for i in range(len(completions))]
    return values[:-1] if _calls >= 3 else values
