"""A user reward for the tone task, given on the command line instead of in the task (docs/rewards.md):

    python examples/minimal_adapter/train.py 'reward.fns=[examples/minimal_adapter/user_reward.py:names_a_low_tone]'

mmrl calls it as TRL calls reward functions, by keyword: ``completions`` are the samples' ``text`` strings (``"2."``),
and the task's reward columns (``ToneTask.reward_columns``: ``label``, ``id``) come as keyword lists.
"""


def names_a_low_tone(prompts, completions, label, **kwargs) -> list[float | None]:
    """1.0 when the answer is class 0 or 1, 0.0 for another digit; None (no opinion) when there is no digit."""
    return [None if not text[:1].isdigit() else float(int(text[0]) <= 1) for text in completions]
