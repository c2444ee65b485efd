"""Initial-state fingerprints: catch a simulator or layout change behind the same init-state index.

VLA training names episodes by ``(task, init_state)``: the GRPO groups, the per-state success
statistics, the demos and the evaluation layouts all rely on an index meaning the same scene every
time. A simulator upgrade can silently break that (robosuite / LIBERO users met it with mujoco >= 3.4).
Every env reports ``info["init_state_hash"]`` after a reset (:func:`mmrl.simulators.common.state_fingerprint`).
:class:`InitStateRecord` keeps the first fingerprint seen per key, is saved with every VLA checkpoint
(``init_states.json`` next to the weights, with the simulator versions) and compares later resets
against it: after a resume or in ``mmrl eval`` a different fingerprint raises
:class:`InitStateDriftError` naming the state and both versions, or, with
``task.check_init_states=false``, is counted (``env/init_state_drift``) and logged once per state.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from mmrl.errors import RunStopped
from mmrl.versions import package_versions

log = logging.getLogger(__name__)

INIT_STATES_FILE = "init_states.json"
SIMULATOR_PACKAGES = ("mujoco", "robosuite", "metaworld")


def init_state_key(item: dict) -> str:
    """``"task/init_state"``: the name of an item's initial state in groups, statistics and fingerprints."""
    return f"{item.get('task', item.get('env_task'))}/{int(item['init_state'])}"


class InitStateDriftError(RunStopped):
    """A ``(task, init_state)`` resets to another simulator state than the one recorded for it."""


def simulator_versions() -> dict[str, str]:
    """Installed versions of the simulator packages (without importing them); absent ones are left out."""
    return package_versions(SIMULATOR_PACKAGES)


@dataclass
class InitStateRecord:
    """First fingerprint per ``"task/init_state"`` key, and what later resets are compared against."""

    hashes: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=simulator_versions)
    """Simulator versions when the fingerprints were first recorded."""
    strict: bool = True
    """Raise on a mismatch (else count it and log it once per key)."""
    drift: int = 0
    """Keys whose fingerprint changed (non-strict mode)."""

    def observe(self, key: str, fingerprint: str | None) -> bool:
        """Record a reset's fingerprint; True when it differs from the one recorded for ``key``."""
        if fingerprint is None:  # an env without fingerprints: nothing to compare
            return False
        old = self.hashes.setdefault(key, fingerprint)
        if old == fingerprint:
            return False
        msg = (
            f"initial state {key} resets to another simulator state than when it was recorded (fingerprint "
            f"{old} -> {fingerprint}; simulator versions then {self.versions or 'unknown'}, now "
            f"{simulator_versions()}). Groups, per-state statistics, demos and eval layouts would no longer "
            "match: install the recorded versions, or pass task.check_init_states=false to go on (counted "
            "in env/init_state_drift)."
        )
        if self.strict:
            raise InitStateDriftError(msg)
        log.warning(msg)
        self.hashes[key] = fingerprint  # count each changed state once
        self.drift += 1
        return True

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"versions": self.versions, "hashes": self.hashes}, indent=1, sort_keys=True))

    def load(self, path: str | Path) -> None:
        """Take the recorded fingerprints and versions of a checkpoint (they replace this run's)."""
        try:
            data = json.loads(Path(path).read_text())
            hashes, versions = dict(data.get("hashes", {})), dict(data.get("versions", {}))
        except (ValueError, AttributeError, TypeError) as e:
            raise InitStateDriftError(
                f"{path}: not a readable initial-state record ({e}); delete it to record afresh"
            ) from None
        self.hashes, self.versions = hashes, versions
