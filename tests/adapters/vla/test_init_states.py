"""Initial-state fingerprints: the hash, the record (strict / counted), and a VLA checkpoint that refuses
to evaluate on changed layouts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mmrl.adapters.vla.init_states import INIT_STATES_FILE, InitStateDriftError, InitStateRecord, simulator_versions
from mmrl.simulators.common import state_fingerprint


def test_state_fingerprint_rounds_to_micrometres():
    q = np.array([0.1, -0.25, 0.830037, 0.0])
    assert state_fingerprint(q) == state_fingerprint(q + 4e-8)  # far below the 1e-6 rounding
    assert state_fingerprint(q) == state_fingerprint(q * np.array([1, 1, 1, -1]))  # -0.0 == 0.0
    moved = q.copy()
    moved[2] += 0.0013  # Lift's cube 1.3 mm higher
    assert state_fingerprint(moved) != state_fingerprint(q)
    assert state_fingerprint(q.astype(np.float32)) == state_fingerprint(q.astype(np.float32).astype(np.float64))
    assert len(state_fingerprint(q)) == 16 and state_fingerprint([]) == state_fingerprint(np.zeros(0))


def test_record_keeps_the_first_fingerprint_and_raises_on_a_change(tmp_path):
    rec = InitStateRecord()
    assert rec.observe("reach_red/0", "aaaa") is False and rec.observe("reach_red/0", "aaaa") is False
    assert rec.observe("reach_red/1", None) is False and "reach_red/1" not in rec.hashes  # env without hashes
    rec.save(tmp_path / INIT_STATES_FILE)
    saved = json.loads((tmp_path / INIT_STATES_FILE).read_text())
    assert saved == {"hashes": {"reach_red/0": "aaaa"}, "versions": simulator_versions()}

    loaded = InitStateRecord()
    saved["versions"] = {"mujoco": "3.3.0"}
    (tmp_path / INIT_STATES_FILE).write_text(json.dumps(saved))
    loaded.load(tmp_path / INIT_STATES_FILE)
    with pytest.raises(InitStateDriftError, match=r"reach_red/0 .*aaaa -> bbbb.*3\.3\.0.*check_init_states=false"):
        loaded.observe("reach_red/0", "bbbb")

    lenient = InitStateRecord(strict=False)
    lenient.load(tmp_path / INIT_STATES_FILE)
    assert lenient.observe("reach_red/0", "bbbb") is True and lenient.drift == 1
    assert lenient.observe("reach_red/0", "bbbb") is False and lenient.drift == 1  # counted once per state
    assert lenient.observe("reach_red/2", "cccc") is False  # a state the checkpoint never saw: recorded

    (tmp_path / INIT_STATES_FILE).write_text("[1, 2")  # truncated file: a clear error naming it
    with pytest.raises(InitStateDriftError, match="not a readable initial-state record"):
        InitStateRecord().load(tmp_path / INIT_STATES_FILE)
    (tmp_path / INIT_STATES_FILE).write_text("[1, 2]")  # valid JSON, wrong shape
    with pytest.raises(InitStateDriftError, match=INIT_STATES_FILE):
        InitStateRecord().load(tmp_path / INIT_STATES_FILE)


def test_vla_checkpoint_refuses_changed_layouts(tmp_path):
    pytest.importorskip("mujoco")
    torch = pytest.importorskip("torch")
    from mmrl.collector import prepare_batch
    from mmrl.config import load_config
    from mmrl.trainer import Trainer
    from tests.adapters.vla.test_vla_tasks import reach_overrides

    tr = Trainer(load_config(reach_overrides(tmp_path, "trainer.max_steps=1")))
    try:
        tr.fit()
    finally:
        tr.policy.close()
    ckpt = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1] / "pretrained_model"
    record = json.loads((ckpt / INIT_STATES_FILE).read_text())
    assert {"reach_red/0", "reach_red/1", "reach_blue/0", "reach_blue/1"} <= set(record["hashes"])
    # a simulator upgrade that moved the blocks of reach_red/0 (simulated by editing the recorded fingerprint)
    record["hashes"]["reach_red/0"] = "0123456789abcdef"
    (ckpt / INIT_STATES_FILE).write_text(json.dumps(record))
    for strict in (True, False):
        overrides = reach_overrides(
            tmp_path / f"eval{strict}", f"checkpoint={ckpt.parent}", f"task.check_init_states={str(strict).lower()}"
        )
        ev = Trainer(load_config(overrides))
        try:
            assert ev.policy.init_states.hashes["reach_red/0"] == "0123456789abcdef"
            if strict:
                with pytest.raises(InitStateDriftError, match="reach_red/0"):
                    ev.evaluate()
            else:
                out = ev.policy.rollout(prepare_batch(ev.task, [0], [0], ev.task.eval_items())[0], 2)
                assert out.metrics["env/init_state_drift"] == 1.0 and torch.is_tensor(out.mask)
        finally:
            ev.policy.close()
    from mmrl.cli import main  # the CLI reports the drift in one line, exit code 1

    assert main(["eval", *reach_overrides(tmp_path / "cli", f"checkpoint={ckpt.parent}")]) == 1
