"""The gateway front-end of an edge process: one aiohttp server for the voice model and the image model.

The voice model is served as ``mstar-ros serve voice`` serves it (WebRTC peers, WHIP, the OpenAI speech
routes); the image model's ``/v1/images/generations`` and ``/v1/images/edits`` are added to the same
server, with its own Conductor. Both Conductors live in this process, so their engines step on its one
device thread, the most urgent request class first.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from mstar_ros.edge.classes import classed_conductor
from mstar_ros.edge.config import EdgeFile, GatewayFront, ServedModel
from mstar_ros.edge.engine_settings import front_engine_config


@dataclass
class ServingGateway:
    url: str  # http://HOST:PORT
    routes: list[str]  # what it serves, for the banner
    conductors: dict[str, object] = field(default_factory=dict)  # "voice" / "images" -> Conductor


async def _serve_model(
    stack: contextlib.AsyncExitStack, served: ServedModel, role: str, edge: EdgeFile, dtype: str | None
):
    from mstar_ros.webrtc.speech_models import load_speech_model

    model = load_speech_model(served.model, edge.path(served.weights) or None)
    config = front_engine_config(edge.path(served.engine_config), dtype)
    conductor = await stack.enter_async_context(
        classed_conductor(model.graph(), model.modules(), config, served.priority, served.class_limits)
    )
    return model, conductor


async def start_gateway(
    stack: contextlib.AsyncExitStack, front: GatewayFront, edge: EdgeFile, dtype: str | None
) -> ServingGateway:
    """Loads the gateway's models, starts their Conductors and the server (all closed by ``stack``)."""
    from aiohttp import web

    from mstar_ros.webrtc.gateway_token import gateway_token
    from mstar_ros.webrtc.image_models import speaks
    from mstar_ros.webrtc.openai_images import OpenAIImages
    from mstar_ros.webrtc.server import GatewayLimits, VoiceGateway
    from mstar_ros.webrtc.urls import base_url

    conductors: dict[str, object] = {}
    first = front.voice or front.images  # the model the gateway is built around (config: one at least)
    role = "voice" if front.voice else "images"
    model, conductors[role] = await _serve_model(stack, first, role, edge, dtype)
    gateway = VoiceGateway(
        model,
        conductors[role],
        host=front.host,
        token=gateway_token(None, edge.path(front.token_file) or None),
        limits=GatewayLimits(max_peers=front.max_peers),
        model_name=first.model,
    )
    app = gateway.app()
    routes = ["/offer", "/whip", "/v1/audio/speech"] if speaks(model) else []
    routes += [r.resource.canonical for r in app.router.routes() if r.resource.canonical.startswith("/v1/images")]
    if front.voice and front.images:
        image_model, conductors["images"] = await _serve_model(stack, front.images, "images", edge, dtype)
        OpenAIImages(
            image_model, conductors["images"], front.images.model, gateway.decode_budget, gateway.generate_budget
        ).add_routes(app)
        routes += ["/v1/images/generations"] * bool(image_model.image_generation)
        routes += ["/v1/images/edits"] * bool(getattr(image_model, "image_edit", False))
    runner = web.AppRunner(app)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await gateway.site(runner, front.host, front.port).start()
    port = runner.addresses[0][1]  # port 0: the one the system gave
    return ServingGateway(base_url(front.host, port), sorted(set(routes)), conductors)
