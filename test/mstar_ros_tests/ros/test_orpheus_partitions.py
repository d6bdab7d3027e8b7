"""Orpheus split at its streaming edge: the talker and the vocoder partitions as two ROS node processes
joined by the /tts/llm_token topic, against the same graph served in one process."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
import torch

from mstar_ros.launch_spec import orpheus_processes
from mstar_ros.ros.partition.stream_msgs import (
    StreamHeader,
    StreamMessageError,
    end_message,
    item_message,
    read_message,
)

TEXT = "Hello there."
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0, "max_tokens": 64}


def start_partitions(procs, tmp_path):
    """The processes `mstar-ros launch orpheus` / orpheus.launch.py start (mstar_ros.launch_spec)."""
    started = []
    for spec in orpheus_processes(
        split="true", namespace="/tts", extra_arguments=["--duration", "150", "--stream-timeout", "3"]
    ):
        summary = tmp_path / f"{spec.name}.json"
        started.append((procs(*spec.command(python=sys.executable), "--summary-json", str(summary)), summary))
    return started


def one_process_audio(seed: int) -> tuple[list[int], torch.Tensor]:
    from mstar.conductor import Conductor
    from mstar.sampling_params import SamplingParams
    from mstar_graphs.orpheus.frontend import OrpheusTTS

    tts = OrpheusTTS.load(progress=False)

    async def go():
        async with Conductor(tts.graph(), tts.modules()) as c:
            return await c.submit(tts.request(TEXT, sampling=SamplingParams(**SAMPLING, seed=seed))).collect()

    out = asyncio.run(go())
    return [int(t) for t in out["tokens"]], torch.cat(out["audio"])


def stream(client, topic: str, dtype, stream_id: str):
    """(items, ended, failed) of one stream as received on ``topic``."""
    items, ended, failed = [], False, False
    for got in client.got(topic):
        try:
            header, item = read_message(got.msg, dtype)
        except StreamMessageError:
            continue  # the malformed messages this test sends itself
        if header.stream_id != stream_id:
            continue
        assert header.seq == len(items), f"{topic}: item {header.seq} out of order"
        if header.end:
            ended, failed = True, header.failed
        else:
            items.append(item)
    return items, ended, failed


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_talker_and_vocoder_nodes_speak_what_one_process_speaks(procs, ros_client, tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray
    from std_msgs.msg import Float32MultiArray, Int64MultiArray, String

    for topic, kind in [
        ("/tts/audio", Float32MultiArray),
        ("/tts/llm_token", Int64MultiArray),
        ("/tts/tokens", Int64MultiArray),
        ("/diagnostics", DiagnosticArray),
    ]:
        ros_client.subscribe(kind, topic, depth=1000)
    (talker, talker_summary), (vocoder, vocoder_summary) = start_partitions(procs, tmp_path)
    node = ros_client.node
    text_pub = ros_client.publisher(String, "/tts/text")
    token_pub = ros_client.publisher(Int64MultiArray, "/tts/llm_token")

    # the talker reads text and sees two readers of its tokens (the vocoder and this test)
    def talker_token_readers() -> int:
        values = [
            {kv.key: kv.value for kv in s.values}
            for g in ros_client.got("/diagnostics")
            for s in g.msg.status
            if s.name == "mstar: /tts/orpheus_talker"
        ]
        return int(values[-1].get("llm_token.subscribers", 0)) if values else 0

    ros_client.wait_for(
        lambda: (
            text_pub.get_subscription_count() >= 1
            and token_pub.get_subscription_count() >= 1
            and talker_token_readers() >= 2
        ),
        90,
        "both partition nodes",
        [talker, vocoder],
    )

    # the cut edge is an ordinary topic, visible to ROS tools
    types = dict(node.get_topic_names_and_types())
    assert types["/tts/llm_token"] == ["std_msgs/msg/Int64MultiArray"]
    assert types["/tts/audio"] == ["std_msgs/msg/Float32MultiArray"]

    text_pub.publish(String(data=json.dumps({"text": TEXT, "id": "hello", "seed": 7, **SAMPLING})))
    ros_client.wait_for(
        lambda: stream(ros_client, "/tts/audio", torch.float32, "hello")[1],
        120,
        "the end of stream 'hello' on /tts/audio",
        [talker, vocoder],
    )

    tokens_ref, audio_ref = one_process_audio(seed=7)
    tokens, ended, failed = stream(ros_client, "/tts/llm_token", torch.int64, "hello")
    assert ended and not failed
    assert [int(t) for t in tokens] == tokens_ref
    chunks, ended, failed = stream(ros_client, "/tts/audio", torch.float32, "hello")
    assert ended and not failed and len(chunks) >= 2
    audio = torch.cat(chunks)
    assert audio.shape == audio_ref.shape
    assert torch.allclose(audio, audio_ref, atol=1e-5, rtol=0), float((audio - audio_ref).abs().max())

    # bad input: each reported on /diagnostics, nothing else stops
    def diagnostics() -> str:
        return "\n".join(s.message for g in ros_client.got("/diagnostics") for s in g.msg.status)

    text_pub.publish(String(data="   "))
    text_pub.publish(String(data=json.dumps({"text": "hi", "colour": "blue"})))
    text_pub.publish(String(data="{not json"))
    token_pub.publish(Int64MultiArray(data=[1, 2, 3]))  # no stream header
    token_pub.publish(item_message(torch.tensor([5]), StreamHeader("late", 5, 1)))  # joins mid-stream
    gap = [item_message(torch.tensor([128266 + i]), StreamHeader("gappy", i, 1)) for i in (0, 1, 3)]
    stalled = [item_message(torch.tensor([128266 + i]), StreamHeader("stalled", i, 1)) for i in (0, 1)]
    for msg in gap + stalled + [end_message(torch.int64, "doomed", 0, failed=True)]:
        token_pub.publish(msg)
    text_pub.publish(String(data=json.dumps({"text": "x", "id": "a/b"})))
    expected = [
        "text request dropped: text is empty",
        "unknown request field(s) ['colour']",
        "is not JSON",
        "message dropped: no layout.dim",
        "stream late joined at item 5",
        "request gappy: input stream failed: llm_token item 2 never arrived (got item 3)",
        "stream doomed ended before its first item: its producer failed",
        "stream id 'a/b' must be",
        "request stalled: input stream failed: no llm_token item for 3 s after item 1",
    ]
    ros_client.wait_for(
        lambda: all(e in diagnostics() for e in expected), 30, f"each of {expected} on /diagnostics", [talker, vocoder]
    )
    # every stream the vocoder took on ends, as failed (on its own topic: it may arrive after the diagnostics)
    for sid in ("gappy", "late", "doomed", "stalled"):
        ros_client.wait_for(
            lambda sid=sid: stream(ros_client, "/tts/audio", torch.float32, sid)[1],
            10,
            f"the end of stream {sid!r} on /tts/audio",
            [talker, vocoder],
        )
        assert stream(ros_client, "/tts/audio", torch.float32, sid)[1:] == (True, True), sid

    # and both still serve
    text_pub.publish(String(data=json.dumps({"text": "Again.", "id": "again", "seed": 1, **SAMPLING})))
    ros_client.wait_for(
        lambda: stream(ros_client, "/tts/audio", torch.float32, "again")[1],
        120,
        "stream 'again' on /tts/audio",
        [talker, vocoder],
    )
    assert stream(ros_client, "/tts/audio", torch.float32, "again")[1:] == (True, False)

    assert talker.interrupt() == 0, talker.output
    assert vocoder.interrupt() == 0, vocoder.output
    t, v = json.loads(talker_summary.read_text()), json.loads(vocoder_summary.read_text())
    assert (t["finished"], t["published"]["llm_token"]) == (
        2,
        len(tokens) + len(stream(ros_client, "/tts/llm_token", torch.int64, "again")[0]),
    )
    assert (v["finished"], v["failed"]) == (2, 4)  # 'late', 'doomed' never started; 'gappy', 'stalled' failed


@pytest.mark.timeout(180)
def test_the_whole_graph_as_one_node_streams_its_audio_output_on_a_topic(procs, ros_client, tmp_path):
    """split:=false: one node; the graph's own streamed output `audio` is the topic. Its sampling
    defaults are ROS parameters: -p at start, checked set_parameters while it runs."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters
    from std_msgs.msg import Float32MultiArray, String

    audio_sub = ros_client.subscribe(Float32MultiArray, "/speech/audio", depth=1000)
    ros_client.subscribe(DiagnosticArray, "/diagnostics", depth=1000)
    params = [a for k, v in SAMPLING.items() for a in ("-p", f"{k}:={v!r}")]
    (spec,) = orpheus_processes(
        split="false", namespace="/speech", extra_arguments=["--duration", "120"], ros_arguments=params
    )
    node = procs(*spec.command(python=sys.executable))
    text_pub = ros_client.publisher(String, "/speech/text")

    def audio_readers() -> int:  # as the node's publisher sees them (its diagnostics)
        values = [
            {kv.key: kv.value for kv in s.values}
            for g in ros_client.got("/diagnostics")
            for s in g.msg.status
            if s.name == "mstar: /speech/orpheus"
        ]
        return int(values[-1].get("audio.subscribers", 0)) if values else 0

    # matched at both ends: a volatile reader that has not yet matched the writer misses what it writes
    ros_client.wait_for(
        lambda: (
            text_pub.get_subscription_count() >= 1 and audio_sub.get_publisher_count() >= 1 and audio_readers() >= 1
        ),
        90,
        "the orpheus node",
        [node],
    )
    types = dict(ros_client.node.get_topic_names_and_types())
    assert "/speech/llm_token" not in types  # the edge stays inside the graph
    text_pub.publish(String(data=json.dumps({"text": TEXT, "id": "whole", "seed": 7})))  # sampling from -p
    ros_client.wait_for(
        lambda: stream(ros_client, "/speech/audio", torch.float32, "whole")[1],
        120,
        "the end of stream 'whole' on /speech/audio",
        [node],
    )
    chunks, ended, failed = stream(ros_client, "/speech/audio", torch.float32, "whole")
    _, audio_ref = one_process_audio(seed=7)
    assert ended and not failed
    assert torch.allclose(torch.cat(chunks), audio_ref, atol=1e-5, rtol=0)

    setter = ros_client.node.create_client(SetParameters, "/speech/orpheus/set_parameters")
    assert setter.wait_for_service(timeout_sec=30)

    def set_param(name, value):
        kind = ParameterType.PARAMETER_DOUBLE
        future = setter.call_async(
            SetParameters.Request(
                parameters=[Parameter(name=name, value=ParameterValue(type=kind, double_value=value))]
            )
        )
        ros_client.wait_for(future.done, 30, f"set {name}", [node])
        return future.result().results[0]

    refused = set_param("temperature", -1.0)
    assert not refused.successful and "sampling.temperature = -1.0 must be >= 0" in refused.reason
    assert set_param("temperature", 0.7).successful
    assert node.interrupt() == 0, node.output
