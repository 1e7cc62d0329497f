"""The alignment sensor's check and deferrable trigger on the real broker: a stage waits,
without a worker slot, until its input channels have the upstream's barrier markers.

The internal topic is written by hand (``Channels``) so one channel can lag its marker.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from microcheckpoint.adapters.kafka_offsets import KafkaOffsets
from microcheckpoint.adapters.stage_offsets import StageOffsets
from microcheckpoint.config import CheckpointConfig
from microcheckpoint.engine import Pipeline, StageSource, running_sum
from microcheckpoint_airflow.checks import AlignmentProbe, CheckState, run_check
from microcheckpoint_airflow.triggers import CheckpointConditionTrigger
from tests.integration.test_stages import Channels


def hand_stage(name: str, topic: str) -> Pipeline:
    """A stage reading ``topic`` as written by stage ``up``'s sink ``to-down``."""
    source = StageSource(
        "from-up", [topic], "json", {"key": "string"}, upstream="up", upstream_uid="to-down"
    )
    return Pipeline(name, source).then(running_sum("counts", key="key"))


def _setup(tmp_path, bootstrap: str, **settings):
    channels = Channels(bootstrap)
    name = f"down{uuid.uuid4().hex[:6]}"
    config = {"pipeline": name, "storage": f"file://{tmp_path}/chk", "timeout": "30s"}
    config.update(settings)

    def stage(since: float) -> dict:
        return {
            "pipeline": "tests.integration.test_stage_sensor:hand_stage",
            "pipeline_kwargs": {"name": name, "topic": channels.topic},
            "bootstrap": bootstrap,
            "since": since,
        }

    return channels, config, stage


def check(config: dict, stage: dict):
    probe = AlignmentProbe(stage, {})
    try:
        return run_check("aligned", config, {}, None, probe)
    finally:
        probe.close()


def test_the_check_waits_for_every_marker_by_mode_and_fails_past_the_timeout(
    tmp_path, kafka_bootstrap
) -> None:
    channels, config, stage = _setup(tmp_path, kafka_bootstrap)
    p0, p1 = channels.tps
    try:
        # Nothing yet: it waits for any marker.
        first = check(config, stage(time.time()))
        assert first.state is CheckState.WAIT
        assert first.message == (
            f"no channel of {channels.topic} has the next barrier marker of stage 'up' yet"
        )
        # Epoch 7 reached partition 0 only.
        channels.rows_to(0, 7, ["a", "b"])
        channels.marker(0, 7)
        channels.rows_to(1, 7, ["c"])
        waiting = check(config, stage(time.time()))
        assert waiting.state is CheckState.WAIT
        assert waiting.message == (
            f"epoch 7 of stage 'up': waiting for its barrier marker in channel(s) {p1}"
        )
        # Unaligned does not wait past the first marker; aligned_timeout, once passed, neither.
        assert check({**config, "unaligned": True}, stage(time.time())).state is CheckState.READY
        switching = {**config, "aligned_timeout": "2s"}
        assert check(switching, stage(time.time())).state is CheckState.WAIT
        assert check(switching, stage(time.time() - 3)).state is CheckState.READY
        # Past the checkpoint timeout the sensor fails, naming the channel and the upstream.
        late = check(config, stage(time.time() - 31))
        assert late.state is CheckState.FAIL
        assert f"channels {p1} have no barrier marker of stage 'up'" in late.message
        # The trigger counts the sensor's wait: with 3 s waited of a 2 s aligned_timeout it
        # switches at once instead of waiting 2 s more.
        with KafkaOffsets(kafka_bootstrap) as kafka:
            ends = kafka.end_offsets(channels.tps)
            started = time.monotonic()
            cut, stats = StageOffsets(kafka, "up", "to-down").align(
                ends, {}, CheckpointConfig.from_mapping(switching), waited_s=3
            )
            assert time.monotonic() - started < 1.5
            assert cut == {p0: 3, p1: 1} and stats.switched == "aligned_timeout 2 s"
            assert stats.waited_ms >= 3000
        # Partition 1's marker arrives: ready.
        channels.marker(1, 7)
        ready = check(config, stage(time.time()))
        assert ready.state is CheckState.READY
        assert ready.message.startswith("stage inputs ready to cut after")
    finally:
        channels.close()


def test_the_deferred_trigger_wakes_when_the_last_marker_arrives(tmp_path, kafka_bootstrap) -> None:
    channels, config, stage = _setup(tmp_path, kafka_bootstrap)
    try:
        for partition in (0, 1):
            channels.rows_to(partition, 3, ["k"])
        channels.marker(0, 3)
        # The kwargs survive Airflow's serialization (JSON) and rebuild the trigger.
        path, kwargs = CheckpointConditionTrigger(
            "aligned", config, {}, None, 0.2, stage(time.time())
        ).serialize()
        assert path == "microcheckpoint_airflow.triggers.CheckpointConditionTrigger"
        assert kwargs["stage"]["pipeline_kwargs"] == {
            "name": config["pipeline"],
            "topic": channels.topic,
        }

        async def wait() -> tuple[dict, float]:
            task = asyncio.ensure_future(_first(CheckpointConditionTrigger(**kwargs)))
            await asyncio.sleep(1.5)
            assert not task.done()  # still waiting for partition 1's marker
            await asyncio.to_thread(channels.marker, 1, 3)
            sent = time.monotonic()
            payload = await asyncio.wait_for(task, 30)
            return payload, time.monotonic() - sent

        payload, after = asyncio.run(wait())
        assert payload["state"] == "READY"
        assert after < 30
    finally:
        channels.close()


async def _first(trigger: CheckpointConditionTrigger) -> dict:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("the trigger ended without an event")
