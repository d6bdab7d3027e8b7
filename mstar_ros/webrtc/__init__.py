"""The WebRTC front-end: a graph's audio stream to a browser's track, chunk by chunk (aiortc, av, aiohttp).
Generic over graphs: a speech model says which graph output carries its audio and at what rate."""
