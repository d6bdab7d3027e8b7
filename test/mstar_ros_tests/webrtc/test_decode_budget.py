"""The pixels being decoded at once are bounded across every request of the gateway (chat completions here)."""

from __future__ import annotations

import asyncio
import base64
import io

from aiohttp import ClientSession

from mstar.conductor import Conductor
from mstar_ros.webrtc.budget import SharedBudget
from mstar_ros.webrtc.server import VoiceGateway
from support.webrtc_gateway import serve_gateway


def image_body(side: int) -> dict:
    import PIL.Image

    buf = io.BytesIO()
    PIL.Image.new("RGB", (side, side), (90, 120, 30)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {
        "max_tokens": 2,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "what is it"}],
            }
        ],
    }


def test_images_wait_for_the_shared_decoding_budget_and_one_over_it_is_refused(qwen3_omni):
    async def main():
        async with Conductor(qwen3_omni.graph(), qwen3_omni.modules()) as c:
            gateway = VoiceGateway(qwen3_omni, c, model_name="qwen3-omni")
            gateway.decode_budget = SharedBudget(100 * 100, "pixels of images being decoded", wait_s=0.3)
            runner, url = await serve_gateway(gateway)
            out = {}
            try:
                async with ClientSession() as http:

                    async def post(side: int) -> tuple[int, str]:
                        async with http.post(f"{url}/v1/chat/completions", json=image_body(side)) as r:
                            return r.status, (await r.json()).get("error", {}).get("message", "")

                    out["fits"] = await post(64)
                    out["too_big"] = await post(128)
                    async with gateway.decode_budget.reserve(100 * 100):  # another request decoding now
                        out["busy"] = await post(64)
                    out["after"] = await post(64)
                    out["held_after"] = gateway.decode_budget.held
            finally:
                await runner.cleanup()
            return out

    out = asyncio.run(main())
    assert out["fits"][0] == 200 and out["after"][0] == 200, out
    assert out["too_big"] == (400, "16384 pixels of images being decoded is over the 10000 the server holds at once")
    assert out["busy"][0] == 503 and "busy with other requests' pixels" in out["busy"][1], out
    assert out["held_after"] == 0
