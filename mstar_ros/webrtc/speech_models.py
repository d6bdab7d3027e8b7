"""Speech models the gateway can serve, by name: entry points of group ``mstar.speech_models``.

A speech model (graph side) has ``load(weights, ...)``, ``graph()``, ``modules()``,
``request(text, voice=..., sampling=..., request_id=..., outputs=...)`` and says which graph
output carries its audio (``audio_output``) at which ``sample_rate``: the gateway needs nothing else,
so it has no per-model code. ``worker_spec()`` (optional) names what Worker processes build to serve
it under a placement (``--placement``); a model loaded with ``requests_only=True`` then reads no weights
in the gateway's process (it builds requests; the Workers hold the weights).
A model that does not speak is served too when it answers in text (``conversational``) or makes
images: mstar_ros.webrtc.image_models says what it then offers instead of ``audio_output``.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from mstar_ros.webrtc.image_models import check_image_model, check_text_model, makes_images


def speech_model_names() -> list[str]:
    return sorted(ep.name for ep in entry_points(group="mstar.speech_models"))


def load_speech_model(name: str, weights: str | None = None, **kwargs):
    found = [ep for ep in entry_points(group="mstar.speech_models") if ep.name == name]
    if not found:
        raise ValueError(f"no speech model {name!r} (installed: {', '.join(speech_model_names()) or 'none'})")
    cls = found[0].load()
    model = cls.load(weights, **kwargs)
    check_served_model(model, name)
    return model


def check_served_model(model, name: str) -> None:
    """A TypeError naming what ``model`` lacks to be served: a speech model's attributes, or, for a model
    that does not speak, those of what it does (answers in text: ``conversational``; makes images)."""
    if not hasattr(model, "audio_output") and (getattr(model, "conversational", False) or makes_images(model)):
        if getattr(model, "conversational", False):
            check_text_model(model, name)
        if makes_images(model):
            check_image_model(model, name)
        return
    for attr in ("audio_output", "sample_rate", "graph", "modules", "request"):
        if not hasattr(model, attr):
            raise TypeError(f"speech model {name!r} lacks {attr!r}")


def speech_conductor(model, config, placement=None):
    """The Conductor serving ``model``: in this process, or in Worker processes per ``placement`` (a YAML
    path), which keeps the model's compute off the interpreter that runs the peers' media."""
    from mstar.conductor import Conductor

    if placement is None:
        return Conductor(model.graph(), model.modules(), config=config)
    if not hasattr(model, "worker_spec"):
        raise ValueError(f"speech model {type(model).__name__} cannot run in Worker processes (no worker_spec)")
    use_placement = getattr(model, "use_placement", None)  # a model whose requests follow where its nodes sit
    if use_placement is not None:
        use_placement(placement)
    return Conductor.distributed(model.worker_spec(), placement, config=config)


def model_voices(model) -> tuple[str, ...]:
    """The voices a speech model has (its ``voices``); empty when it does not say."""
    return tuple(getattr(model, "voices", None) or ())


def checked_voice(model, voice: str, field: str = "voice") -> str:
    """``voice`` as the model spells it (names match in any case), or a ValueError naming ``field`` and the
    voices it has: a voice the model lacks would fail every later response, so it is refused where it is set."""
    if not isinstance(voice, str) or not voice.strip():
        raise ValueError(f"{field} must be a voice name")
    voices = model_voices(model)
    found = next((name for name in voices if name.lower() == voice.lower()), None)
    if found is None:
        raise ValueError(
            f"{field} {voice!r}: this model has no such voice (it has: {', '.join(voices) or 'none it names'})"
        )
    return found
