"""mmrl: reinforcement-learning post-training for multimodal models."""

__version__ = "0.1.0"
