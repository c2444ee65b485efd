"""A run folder written by an older mmrl resumes under a newer one: config fields the newer mmrl added are missing
from the saved config.yaml, and set to their defaults they are no change of the experiment (upgrading mmrl must not
block ``trainer.checkpointing.resume=auto``). Set to anything else, they still are."""

from __future__ import annotations

import pytest
import yaml

from mmrl.config import AgentConfig, load_config
from mmrl.errors import ConfigError
from mmrl.run_dir import config_changes
from tests.helpers import toy_trainer


def _drop_added_fields(run_dir) -> None:
    """config.yaml as an mmrl without the agent section, plugins and trainer.rollout would have written it."""
    path = run_dir / "config.yaml"
    saved = yaml.safe_load(path.read_text())
    for key in ("agent", "plugins"):
        saved.pop(key)
    saved["trainer"].pop("rollout")
    path.write_text(yaml.safe_dump(saved, sort_keys=False))


def test_a_run_from_an_older_mmrl_resumes_when_the_new_fields_are_at_their_defaults(tmp_path):
    first = toy_trainer(tmp_path, "trainer.checkpointing.save_every=1", steps=2)
    first.fit()
    _drop_added_fields(first.run_dir)
    resumed = toy_trainer(tmp_path, "trainer.checkpointing.resume=auto", steps=3)
    resumed.fit()
    assert resumed.resumed and resumed.step == 3


def test_a_new_field_away_from_its_default_is_still_a_change(tmp_path):
    first = toy_trainer(tmp_path, "trainer.checkpointing.save_every=1", steps=2)
    first.fit()
    _drop_added_fields(first.run_dir)
    with pytest.raises(ConfigError, match=r"agent\.max_turns"):
        toy_trainer(
            tmp_path, "trainer.checkpointing.resume=auto", f"agent.max_turns={AgentConfig().max_turns + 1}", steps=3
        ).fit()


def test_config_changes_by_hand():
    saved = {"trainer": {"optim": {"lr": 0.1}}}
    new = {"trainer": {"optim": {"lr": 0.1}, "rollout": "sync"}, "plugins": []}
    defaults = {"trainer": {"optim": {"lr": 0.001}, "rollout": "sync"}, "plugins": []}
    assert config_changes(saved, new, defaults) == ({}, {})
    # without defaults (the old rule) the added keys are changes
    assert set(config_changes(saved, new)[0]) == {"trainer.rollout", "plugins"}
    # a saved key that differs from the new value is a change even when the new value is the default
    assert config_changes(saved, {"trainer": {"optim": {"lr": 0.001}}}, defaults)[0] == {
        "trainer.optim.lr": (0.1, 0.001)
    }
    # an added key away from its default is a change
    async_new = {"trainer": {"optim": {"lr": 0.1}, "rollout": "async"}, "plugins": []}
    assert config_changes(saved, async_new, defaults)[0] == {"trainer.rollout": ("<unset>", "async")}
    assert load_config(["task=toy_arithmetic"]).trainer.rollout == "sync"  # the default the test above assumes
