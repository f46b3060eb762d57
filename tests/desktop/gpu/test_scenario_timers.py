"""A scenario's `[timers]` table (docs/architecture.md §6): a simulated broker process keeps
its rules on a shorter time scale, so that the process tests stop waiting on production
defaults. The table is checked like the rest of the file; a real broker never reads it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rbroker.base.children import HARD_KILL
from rbroker.gpu.scenario import TIMERS, ScenarioError, parse_scenario, scenario_timers
from tests.conftest import SINGLE_24G, short_tmp, start_broker, wait_until

pytestmark = pytest.mark.contract  # it starts processes or servers of its own


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("[timers]\nsample_interval = 1\n", "[timers]: unknown keys ['sample_interval']"),
        ("[timers]\ntick_s = 0\n", "[timers]: tick_s must be a positive number, got 0"),
        ("[timers]\ntick_s = -1.5\n", "[timers]: tick_s must be a positive number, got -1.5"),
        ("[timers]\ntick_s = nan\n", "[timers]: tick_s must be a positive number, got nan"),
        ("[timers]\ntick_s = true\n", "[timers]: tick_s must be a positive number, got True"),
        ("[timers]\ntick_s = '1'\n", "[timers]: tick_s must be a positive number, got '1'"),
        (
            "[timers]\nabsence_confirm_samples = 1.5\n",
            "[timers]: absence_confirm_samples must be an integer >= 1, got 1.5",
        ),
        (
            "[timers]\nabsence_confirm_samples = 0\n",
            "[timers]: absence_confirm_samples must be an integer >= 1, got 0",
        ),
        ("timers = 3\n", "[timers] must be a table"),
    ],
)
def test_a_bad_timers_table_is_refused_with_the_key_named(table: str, says: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(table + SINGLE_24G)
    assert str(err.value) == says


def test_the_timers_are_broker_settings_of_the_same_names(tmp_path: Path) -> None:
    from rbroker.broker.config import BrokerConfig

    assert set(TIMERS) <= set(BrokerConfig.__dataclass_fields__)
    scenario = tmp_path / "s.toml"
    scenario.write_text("[timers]\nsample_interval_s = 0.2\nabsence_confirm_samples = 2\n")
    scenario.write_text(scenario.read_text() + SINGLE_24G)
    assert scenario_timers(scenario) == {"sample_interval_s": 0.2, "absence_confirm_samples": 2}
    assert scenario_timers(None) == {}


def test_a_broker_process_runs_on_the_scenarios_timers() -> None:
    """A lease whose holder is alive but never re-attaches after a broker restart ends after
    `lease_reattach_grace_s`: 1 s from the scenario, where the default is 10 s."""
    root = short_tmp()
    text = "[timers]\nlease_reattach_grace_s = 1\n" + SINGLE_24G
    broker = start_broker(text, root=root)
    try:
        with broker.client() as holder:  # this test process: alive, never re-attaching
            lease = holder.call(
                "lease.acquire", mib=2048, project="p", session="s", purpose="timers"
            )
            lease_id = lease["lease"]["lease_id"]
            broker.stop(HARD_KILL)
        broker = start_broker(text, root=root)
        with broker.client() as c:

            def ended() -> list[dict[str, object]]:
                view = c.leases(include_ended=True)
                return [x for x in view.get("ended", []) if x["lease_id"] == lease_id]

            (gone,) = wait_until(ended, timeout_s=8)  # type: ignore[misc]
        assert gone["ended_reason"] == (
            "its holder did not re-attach within 1 s after the broker restarted"
        )
        assert "simulated broker on the scenario's timers" in broker.log()
    finally:
        broker.stop(HARD_KILL)
        shutil.rmtree(root, ignore_errors=True)
