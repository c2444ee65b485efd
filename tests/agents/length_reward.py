"""A reward that varies with the final turn's text (user rewards get it as text, TRL's convention), so a few GRPO
steps of a random tiny model have non-zero advantages: tests/agents/test_visual_search.py checks that
`task=visual_search` trains with it."""


def text_length(completions, **_):
    return [len(c) / 40.0 for c in completions]
