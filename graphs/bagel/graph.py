"""The BAGEL Walk Graph: ViT and VAE encoders, one MoT LLM seen as three views, a flow Loop, the VAE decoder.

    input.vit_image[, vit_sizes] -> vit_encoder --embeds--> context <--embeds-- vae_encoder <- input.vae_image[, vae_sizes]
    input.<views' ids, positions, spans, row kinds> -> context
                                                  |
                                 +-- embeds ------+------ embeds --+
                                 v                                 v
    context.<view's prefill inputs> -> llm (full context)   llm_cfg_text (no last text)   llm_cfg_img (no image)
                                 :  llm.token -> llm.input_ids (decode Loop) -> output.text_ids
                                 :  (KV read by the flow node; guidance views read too)
    input.noise -> image_cfg.x ---(flow Loop over llm + llm_cfg_text + llm_cfg_img)---> vae_decoder -> output.image
                   image_cfg.x_step / .step (each step, when asked) -> output.latent_step / output.flow_step
                   image_cfg.x_pred ~~(streamed, preview steps)~~> preview_decoder -> output.preview

The three LLM nodes are views of the one ``bagel`` module: each keeps its own KV (the reference's
three contexts), and one engine step evaluates every view's rows of every request together. Walks:

- ``prefill_text``: the full context of a text-only request (a text-to-image prompt, a text question);
- ``prefill_vit``: an image question: the ViT rows (every image of the conversation), then the context
  with its image spans;
- ``prefill_vae_shared``: an edit: VAE and ViT rows of its images, then the no-text and no-image
  contexts, then the full context as a copy-on-write fork of the no-text one (its prefix: the
  reference deep-copies the context before the instruction) plus the instruction: request meta
  ``"llm.kv_from": "llm_cfg_text"`` forks it, and the full view's inputs are the instruction's rows only;
- ``prefill_vae``: the same contexts each prefilled whole and at once, for a placement that puts the
  views on different Workers (cfg-parallel), where no view can fork another's KV;
- ``decode``: the answer, token by token, until ``<|im_end|>``;
- ``image_gen``: the flow Loop without guidance (scales 1), then the VAE decoder;
- ``image_gen_cfg``: the flow Loop with text / image guidance, then the VAE decoder;
- ``image_gen_cfg_parallel``: the same guided flow with the Walk driving its steps - per step one
  velocity call per view (each where that view's KV is: the views may sit on different Workers),
  then ``cfg_step`` combines and steps (mstar_graphs.bagel.cfg_parallel) - then the VAE decoder;
- ``prefill_views``: a text-only request's three contexts (think mode: the system prompt makes the
  no-text and no-image contexts differ from the full one);
- ``think`` / ``think_decode``: the reasoning decoded greedily by the ``think`` view, a copy-on-write
  fork of the full context (``kv_from="llm"``): the full context itself is left as it was.

``next_walk`` follows ``request.meta["task"]``: ``understand`` / ``chat`` / ``t2i`` / ``edit`` /
``think``; a guided image with ``meta["cfg_parallel"]`` takes ``image_gen_cfg_parallel``. Think mode
runs as two requests of one session: ``think`` (the contexts, then the thought, output
``thought_ids``), then the generation with ``meta["continued"]``: its input is only the thought
re-tokenized as a text turn, appended to the full context (``prefill_text``) before the flow.

Progress (asked by ``gen_params``' report_every / previews): while the flow runs, the engine reports the
latent after each step (``output.latent_step``, ``output.flow_step``: steps done) and, on preview steps,
the predicted clean latent, which streams to ``preview_decoder`` (the VAE decoder again, in a partition
of its own so the stream has a chunk policy: one latent a call) and out as ``output.preview``.
"""

from __future__ import annotations

from mstar.graph import (
    Call,
    DynamicLoop,
    FixedChunkPolicy,
    GraphEdge,
    GraphNode,
    Loop,
    LoopMode,
    ModelGraph,
    Parallel,
    PartitionConnection,
    PartitionTopology,
    Sequential,
    StopOnValues,
    StreamingGraphEdge,
)
from mstar_graphs.bagel.cfg_parallel import STEP_NODE, evaluations, no_image_needed, no_text_needed

MODULE = "bagel"
VIEWS = ("llm", "llm_cfg_text", "llm_cfg_img")  # full context, without the last text, without the images
VIEW_INPUT_PREFIX = {"llm": "", "llm_cfg_text": "cfg_text_", "llm_cfg_img": "cfg_img_"}
VIEW_PORTS = ("input_ids", "embed_mask", "rope_positions", "spans", "row_kinds")
TASKS = ("understand", "chat", "t2i", "edit")
MODEL, PREVIEW = "model", "preview"  # partitions: everything, and the preview decoder its stream feeds
# the CFG-parallel Walk's velocity node over each view, and the cfg_step port its velocity feeds
VELOCITY_NODES = {"llm": "velocity", "llm_cfg_text": "velocity_cfg_text", "llm_cfg_img": "velocity_cfg_img"}
VELOCITY_PORTS = {"velocity": "v_cond", "velocity_cfg_text": "v_no_text", "velocity_cfg_img": "v_no_image"}
TASKS = ("understand", "chat", "t2i", "edit", "think")
THINK_INPUT = "think_ids"  # the think view's first query: ``<|im_start|>`` (through the context node)
# request meta: the full context continues the no-text one's KV (mstar.conductor's "<node>.kv_from")
SHARED_PREFIX_KEY, SHARED_PREFIX_VIEW = "llm.kv_from", "llm_cfg_text"


def view_input_name(view: str, port: str) -> str:
    """The request input feeding ``view.port`` (``ids`` for ``llm.input_ids``, ``cfg_img_spans`` ...)."""
    return VIEW_INPUT_PREFIX[view] + ("ids" if port == "input_ids" else port)


def make_next_walk(im_end: int | None):
    def next_walk(state) -> str | None:
        meta, last = state.request.meta, state.last_walk
        task = meta.get("task")
        if last is None:
            if task == "understand":
                return "prefill_vit"
            if (task == "edit" and not meta.get("continued")) or (task == "think" and meta.get("source") == "edit"):
                return "prefill_vae_shared" if meta.get(SHARED_PREFIX_KEY) else "prefill_vae"
            if task == "think" and meta.get("guided"):
                return "prefill_views"
            return "prefill_text"
        if task == "think":
            if last in ("think", "think_decode") and (last == "think_decode" or _stops(state, "think.token", im_end)):
                return None
            return "think" if last.startswith("prefill") else "think_decode"
        if task in ("understand", "chat"):
            if last == "decode":
                return None
            if _stops(state, "llm.token", im_end):
                return None
            return "decode"
        if last in ("prefill_text", "prefill_vae", "prefill_vae_shared"):
            if not meta.get("guided", True):
                return "image_gen"
            return "image_gen_cfg_parallel" if meta.get("cfg_parallel") else "image_gen_cfg"
        return None

    return next_walk


def _stops(state, port: str, im_end: int | None) -> bool:
    """After a decode's first token: whether it ends there (``<|im_end|>``, or a one-token budget)."""
    first = state.value(port)
    ended = im_end is not None and first is not None and int(first) == im_end
    return first is None or ended or state.request.meta.get("max_tokens", 512) <= 1


def _llm_view(name: str, token: bool, images: bool = True) -> GraphNode:
    """A view of the ``bagel`` module; ``images=False``: a context that never holds an image."""
    image_ports = ["embeds", "embed_mask", "spans", "row_kinds"] if images else []
    return GraphNode(
        name,
        inputs=["input_ids", "rope_positions", *image_ports],
        outputs=["token"] if token else [],
        engine="ar",
        module=MODULE,
        optional_inputs=["rope_positions", *image_ports],  # a decode call continues the positions
    )


def _flow_node(name: str, guidance: tuple[str, ...]) -> GraphNode:
    return GraphNode(
        name,
        inputs=["x", "gen_params"],
        outputs=["x", "x_step", "step", "x_pred"],  # the last three: progress reports (mstar.engine.flow_reports)
        engine="ar",
        module=MODULE,
        kv_from="llm",
        guidance=guidance,
        loop_mode=LoopMode.FLOW,
    )


def _velocity_node(name: str, view: str) -> GraphNode:
    return GraphNode(
        name,
        inputs=["x", "step", "gen_params"],
        outputs=["v"],
        engine="ar",
        module=MODULE,
        kv_from=view,
        loop_mode=LoopMode.VELOCITY,
        optional_inputs=["step"],  # the first step's call has none: step 0
    )


def _cfg_parallel_edges() -> list[GraphEdge]:
    stepped = [*VELOCITY_PORTS, STEP_NODE]  # what reads the state and the step
    return [
        *(GraphEdge("input.noise", f"{node}.x") for node in stepped),
        *(GraphEdge("input.gen_params", f"{node}.gen_params") for node in stepped),
        *(GraphEdge(f"{STEP_NODE}.{port}", f"{node}.{port}") for node in stepped for port in ("x", "step")),
        *(GraphEdge(f"{node}.v", f"{STEP_NODE}.{port}") for node, port in VELOCITY_PORTS.items()),
        GraphEdge(f"{STEP_NODE}.latent", "vae_decoder.x"),
        GraphEdge(f"{STEP_NODE}.latent", "output.latent"),
        GraphEdge(f"{STEP_NODE}.step", "output.flow_step"),  # steps done: the progress a caller sees
    ]


def _cfg_parallel_walk() -> Sequential:
    """Per step: the three views' velocities at once (a branch the step does not need is skipped), then
    the guided Euler step; then the VAE decoder."""
    branches = Parallel(
        Call("velocity"),
        DynamicLoop(Call("velocity_cfg_text"), trip_count=no_text_needed),
        DynamicLoop(Call("velocity_cfg_img"), trip_count=no_image_needed),
    )
    return Sequential(DynamicLoop(Sequential(branches, Call(STEP_NODE)), trip_count=evaluations), Call("vae_decoder"))


def bagel_graph(im_end: int | None) -> ModelGraph:
    """The graph; ``im_end``: the token that ends an answer or a thought (None: none does, answers run to
    their ``max_tokens``: a benchmark's random weights would otherwise stop at a random length)."""
    view_ports = [
        view_input_name(view, port)
        for view in VIEWS
        for port in (VIEW_PORTS if view != "llm_cfg_img" else VIEW_PORTS[:1] + VIEW_PORTS[2:3])
    ]
    context_ports = ["vae_embeds", "vit_embeds", *view_ports, THINK_INPUT]
    embeds_of = {"llm": "embeds", "llm_cfg_text": "cfg_text_embeds"}  # each view's image rows, when it has any
    view_edges = [
        edge
        for view in VIEWS
        for port in VIEW_PORTS
        if view != "llm_cfg_img" or port in ("input_ids", "rope_positions")
        for edge in (
            GraphEdge(f"input.{view_input_name(view, port)}", f"context.{view_input_name(view, port)}"),
            GraphEdge(f"context.{view_input_name(view, port)}", f"{view}.{port}"),
        )
    ]
    flow_edges = [
        edge
        for flow in ("image", "image_cfg")
        for edge in (
            GraphEdge("input.noise", f"{flow}.x"),
            GraphEdge("input.gen_params", f"{flow}.gen_params"),
            GraphEdge(f"{flow}.x", f"{flow}.x"),
            GraphEdge(f"{flow}.x", "vae_decoder.x"),
            GraphEdge(f"{flow}.x", "output.latent"),  # the final latent tokens [N, p*p*C]
            GraphEdge(f"{flow}.x_step", "output.latent_step"),  # the latent after each reported step
            GraphEdge(f"{flow}.step", "output.flow_step"),  # steps done (1..steps - 1)
            StreamingGraphEdge(f"{flow}.x_pred", "preview_decoder.x", target_partition=PREVIEW),
        )
    ]
    nodes = [
        # one image [3, H, W], or several packed with their sizes (mstar_graphs.bagel.image_pack)
        GraphNode("vit_encoder", inputs=["image", "sizes"], outputs=["embeds"], optional_inputs=["sizes"]),
        GraphNode("vae_encoder", inputs=["image", "sizes"], outputs=["embeds"], optional_inputs=["sizes"]),
        GraphNode(
            "context",
            inputs=context_ports,
            outputs=[*embeds_of.values(), *view_ports, THINK_INPUT],
            optional_inputs=context_ports,
        ),
        _llm_view("llm", token=True),
        _llm_view("llm_cfg_text", token=False),
        _llm_view("llm_cfg_img", token=False, images=False),
        GraphNode(
            "think",
            inputs=["input_ids"],
            outputs=["token"],
            engine="ar",
            module=MODULE,
            kv_from="llm",  # a copy-on-write fork: the thought never enters the full context's KV
        ),
        _flow_node("image", ()),
        _flow_node("image_cfg", ("llm_cfg_text", "llm_cfg_img")),
        *(_velocity_node(node, view) for view, node in VELOCITY_NODES.items()),
        GraphNode(
            STEP_NODE,
            inputs=["x", "step", "gen_params", *VELOCITY_PORTS.values()],
            outputs=["x", "step", "latent"],
            optional_inputs=["step", "v_no_text", "v_no_image"],
        ),
        GraphNode("vae_decoder", inputs=["x", "gen_params"], outputs=["image"]),
        GraphNode("preview_decoder", inputs=["x", "gen_params"], outputs=["image"]),
    ]
    return ModelGraph(
        name="bagel",
        nodes=nodes,
        edges=[
            GraphEdge("input.vit_image", "vit_encoder.image"),
            GraphEdge("input.vae_image", "vae_encoder.image"),
            GraphEdge("input.vit_sizes", "vit_encoder.sizes"),
            GraphEdge("input.vae_sizes", "vae_encoder.sizes"),
            GraphEdge("vit_encoder.embeds", "context.vit_embeds"),
            GraphEdge("vae_encoder.embeds", "context.vae_embeds"),
            *(GraphEdge(f"context.{port}", f"{view}.embeds") for view, port in embeds_of.items()),
            *view_edges,
            GraphEdge("llm.token", "llm.input_ids"),
            GraphEdge("llm.token", "output.text_ids"),
            GraphEdge(f"input.{THINK_INPUT}", f"context.{THINK_INPUT}"),
            GraphEdge(f"context.{THINK_INPUT}", "think.input_ids"),
            GraphEdge("think.token", "think.input_ids"),
            GraphEdge("think.token", "output.thought_ids"),
            *flow_edges,
            *_cfg_parallel_edges(),
            GraphEdge("input.gen_params", "vae_decoder.gen_params"),
            GraphEdge("vae_decoder.image", "output.image"),
            GraphEdge("input.gen_params", "preview_decoder.gen_params"),
            GraphEdge("preview_decoder.image", "output.preview"),
        ],
        walks={
            "prefill_text": Sequential(Call("context"), Call("llm")),
            "prefill_vit": Sequential(Call("vit_encoder"), Call("context"), Call("llm")),
            "prefill_vae": Sequential(
                Parallel(Call("vae_encoder"), Call("vit_encoder")),
                Call("context"),
                Parallel(*(Call(v) for v in VIEWS)),
            ),
            "prefill_vae_shared": Sequential(
                Parallel(Call("vae_encoder"), Call("vit_encoder")),
                Call("context"),
                Parallel(Sequential(Call("llm_cfg_text"), Call("llm")), Call("llm_cfg_img")),
            ),
            "decode": DynamicLoop(
                Call("llm"),
                trip_count=lambda s: max(0, s.request.meta.get("max_tokens", 512) - 1),
                stop=None if im_end is None else StopOnValues("llm.token", (im_end,)),
            ),
            "prefill_views": Sequential(Call("context"), Parallel(*(Call(v) for v in VIEWS))),
            "think": Sequential(Call("think")),
            "think_decode": DynamicLoop(
                Call("think"),
                trip_count=lambda s: max(0, s.request.meta.get("max_tokens", 512) - 1),
                stop=None if im_end is None else StopOnValues("think.token", (im_end,)),
            ),
            "image_gen": Sequential(Loop(Call("image"), max_iters=1), Call("vae_decoder")),
            "image_gen_cfg": Sequential(Loop(Call("image_cfg"), max_iters=1), Call("vae_decoder")),
            "image_gen_cfg_parallel": _cfg_parallel_walk(),
        },
        next_walk=make_next_walk(im_end),
        topology=PartitionTopology(
            partitions={MODEL: [n.name for n in nodes if n.name != "preview_decoder"], PREVIEW: ["preview_decoder"]},
            connections=[PartitionConnection(MODEL, PREVIEW, FixedChunkPolicy(1))],  # each prediction: one decode
        ),
        required_inputs=("ids", "rope_positions"),  # the full context; each task brings what its walks read
    )
