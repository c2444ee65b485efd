"""Former home of the step bookkeeping, now :mod:`mmrl.simulators.common.episode`; re-exported for old imports."""

from .common.episode import EpisodeCounter, EpisodeOverError, instability_counts, sanitize_action, sim_blew_up

__all__ = ["EpisodeCounter", "EpisodeOverError", "instability_counts", "sanitize_action", "sim_blew_up"]
