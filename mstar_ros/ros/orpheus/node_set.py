"""Orpheus TTS as ROS 2 nodes: the whole graph in one node, or each partition in a process of its own.

    mstar_orpheus_node --partition all                 # /tts/text in; /tts/audio, /tts/tokens out
    mstar_orpheus_node --partition talker              # /tts/text in; /tts/llm_token, /tts/tokens out
    mstar_orpheus_node --partition vocoder             # /tts/llm_token in; /tts/audio out

(``mstar-ros launch orpheus [--no-split]`` starts them.) The Orpheus graph streams the LLM's
audio tokens into the SNAC decoder over a streaming edge between its two partitions,
``talker`` and ``vocoder``. Split, that edge is the topic ``llm_token``: the talker
publishes each token as it is sampled, the vocoder cuts them into 28-token windows
every 7 (the edge's SlidingWindowChunkPolicy) and publishes 24 kHz PCM on ``audio``
(std_msgs/Float32MultiArray, one message per decoded chunk; mstar_ros.ros.partition.stream_msgs
describes the header). Watch any of them with ``ros2 topic echo /tts/llm_token``.
Requests: std_msgs/String on ``text`` -- the text, or JSON ``{"text": ..., "id": ...,
"seed": ..., "max_tokens": ..., "temperature": ...}``. Problems go to /diagnostics.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

import torch

from mstar.sampling_params import SamplingParams
from mstar_ros.dtype_option import add_dtype_argument
from mstar_ros.ros.common.ros_process import split_ros_args
from mstar_ros.ros.orpheus.talker_requests import SpeechDefaults, bind_parameters, request_factory

log = logging.getLogger("mstar_ros.orpheus_node")

PARTITIONS = ("all", "talker", "vocoder")
#: the tensor dtype on each topic the Orpheus graph (or a partition of it) reads or writes
DTYPES = {"llm_token": torch.int64, "tokens": torch.int64, "audio": torch.float32}


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    argv, ros_args = split_ros_args(argv)
    parser = argparse.ArgumentParser(
        prog="mstar_orpheus_node", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--partition",
        choices=PARTITIONS,
        default="all",
        help="the whole graph (all), or one partition of it (default all)",
    )
    parser.add_argument("--namespace", default="/tts", help="ROS namespace of the node and its topics (default /tts)")
    parser.add_argument("--weights", help="Orpheus checkpoint dir (default: generated tiny, RANDOM weights)")
    parser.add_argument("--snac-weights", help="SNAC 24 kHz checkpoint dir (default: WEIGHTS/snac)")
    parser.add_argument("--preset", default="tiny", help="generated checkpoint preset when --weights is not given")
    add_dtype_argument(parser)
    # the talker's defaults; also its ROS parameters (-p NAME:=VALUE after --ros-args wins, ros2 param set)
    parser.add_argument("--voice", default="tara", help="voice put before each text ('' for none; parameter voice)")
    parser.add_argument(
        "--temperature", type=float, default=0.6, help="default sampling temperature, 0: greedy (parameter temperature)"
    )
    parser.add_argument("--top-p", type=float, default=0.8, help="default nucleus sampling mass (parameter top_p)")
    parser.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.3,
        help="default repetition penalty (parameter repetition_penalty)",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=1200, help="default most audio tokens per request (parameter max_tokens)"
    )
    parser.add_argument(
        "--stream-timeout",
        type=float,
        default=30.0,
        help="a stream with no new item for this many seconds fails (its producer is gone; default 30)",
    )
    parser.add_argument("--duration", type=float, default=0.0, help="exit after this many seconds (0: until stopped)")
    parser.add_argument("--summary-json", help="write what was served as JSON to this file at exit")
    return parser.parse_args(argv), ros_args


def load_partition(args: argparse.Namespace):
    """(graph, modules, request factory or None, its defaults or None, random weights?) for the partition
    this process runs."""
    from mstar.engine.device_loop import run_on_device
    from mstar.graph.split import split_partition
    from mstar_graphs.orpheus.checkpoints import resolve_paths
    from mstar_graphs.orpheus.components import orpheus_components
    from mstar_graphs.orpheus.prompt import load_tokenizer

    partition_nodes = {"all": {"llm", "snac"}, "talker": {"llm"}, "vocoder": {"snac"}}[args.partition]
    graph, modules = run_on_device(
        orpheus_components, partition_nodes, args.weights, args.snac_weights, args.preset, progress=True
    )
    if args.partition != "all":
        graph = split_partition(graph, args.partition)
    paths = resolve_paths(args.weights, args.snac_weights, args.preset)
    factory = defaults = None
    if "llm" in modules:
        defaults = SpeechDefaults(
            args.voice or None,
            SamplingParams(
                temperature=args.temperature,
                top_p=args.top_p,
                repetition_penalty=args.repetition_penalty,
                max_tokens=args.max_tokens,
            ),
        )
        factory = request_factory(load_tokenizer(paths.llm), modules["llm"].max_positions, defaults)
    return graph, modules, factory, defaults, paths.random_weights


async def serve(args: argparse.Namespace, ros_args: list[str]) -> dict:
    from mstar.conductor import Conductor
    from mstar.engine.config import EngineConfig
    from mstar_ros.ros.common.conductor_node import ConductorNode
    from mstar_ros.ros.common.ros_process import RosProcess
    from mstar_ros.ros.partition.partition_node import PartitionNode

    graph, modules, factory, defaults, random_weights = load_partition(args)
    conductor = Conductor(graph, modules, config=EngineConfig(dtype=args.dtype))
    name = "orpheus" if args.partition == "all" else f"orpheus_{args.partition}"
    async with RosProcess("mstar_orpheus_node", ros_args) as ros, conductor:
        node = PartitionNode(
            conductor,
            graph,
            asyncio.get_running_loop(),
            node_name=name,
            namespace=args.namespace,
            dtypes=DTYPES,
            request_factory=factory,
            stream_timeout_s=args.stream_timeout,
            wait_for_readers=["llm_token"] if args.partition == "talker" else [],
        )
        if defaults is not None:
            bind_parameters(node, defaults)
        ros.add(node, ConductorNode(conductor, name=f"{name}_conductor"))
        ros.spin()
        ins = [node.resolve_topic_name(n) for n in graph.stream_input_names] + (
            [node.resolve_topic_name("text")] if factory else []
        )
        outs = [node.resolve_topic_name(n) for n in graph.output_names]
        print(
            f"serving {graph.name} ({'RANDOM tiny weights' if random_weights else 'weights'}) as "
            f"{node.get_fully_qualified_name()}: in {', '.join(ins)}; out {', '.join(outs)}",
            flush=True,
        )
        print(f"  dtype {conductor.dtype_summary()}", flush=True)
        started = time.monotonic()
        await ros.stopped(args.duration)
        node.closing = True
        stats = node.stats
        return {
            "node": node.get_fully_qualified_name(),
            "graph": graph.name,
            "seconds": round(time.monotonic() - started, 2),
            "requests": stats.requests,
            "finished": stats.finished,
            "failed": stats.failed,
            "published": stats.published,
            "errors": stats.errors,
        }


def main(argv: list[str] | None = None) -> int:
    from mstar_ros.bag.ros_env import apply_localhost_defaults

    apply_localhost_defaults()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    args, ros_args = parse_args(sys.argv[1:] if argv is None else argv)
    from mstar_ros.ros.common.ros_process import run_serving

    status, summary = run_serving("mstar_orpheus_node", serve(args, ros_args), args.summary_json)
    if summary is not None:
        print(
            f"{summary['node']}: {summary['finished']} requests served, {summary['failed']} failed; published "
            + ", ".join(f"{n} {c} items" for n, c in summary["published"].items()),
            flush=True,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
