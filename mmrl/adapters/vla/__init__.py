"""Vision-language-action adapter: action tokenizer, VLA policy, episodes and initial states, demos,
success tables."""
