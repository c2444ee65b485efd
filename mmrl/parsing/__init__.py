"""Readers of model-output text (answer tags, boxes): the lowest layer, used by rewards, data converters and tasks."""
