"""A generation's three contexts from interleaved inputs, as ``InterleaveInferencer.interleave_inference``
builds them (the reference's order, restated):

- the full context takes every input in order: a text as one turn, an image as its VAE span then its
  ViT span;
- the no-text context is the full one as it was just before the last text input, or just after the
  last image (whichever came later): a text input copies the full context to it first, an image
  input copies it after;
- the no-image context takes the texts only;
- a system prompt (think mode) opens the full and the no-image contexts.

With inputs that end in a text (an edit's prompt), the no-text context is the full one's prefix and the
rest is that last text alone: what lets the full view fork the no-text view's KV.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mstar_graphs.bagel.context_layout import ImagePart, Part, TextPart

Input = TextPart | tuple[ImagePart, ...]  # a text turn, or one image's spans (VAE, then ViT)


@dataclass(frozen=True)
class GenerationContexts:
    full: list[Part]
    no_text: list[Part]
    no_image: list[Part]

    def after_no_text(self) -> list[Part]:
        """The full context past its no-text prefix (ValueError if the no-text context is not a prefix)."""
        n = len(self.no_text)
        if self.full[:n] != self.no_text:
            raise ValueError("the no-text context is not a prefix of the full one")
        return self.full[n:]


def generation_contexts(inputs: Sequence[Input], system: TextPart | None = None) -> GenerationContexts:
    """The full, no-text and no-image contexts after ``inputs`` (in order), ``system`` first if given."""
    full: list[Part] = [system] if system is not None else []
    no_image: list[Part] = list(full)
    no_text: list[Part] = []
    for item in inputs:
        if isinstance(item, TextPart):
            no_text = list(full)
            full.append(item)
            no_image.append(item)
        else:
            if not item or not all(isinstance(p, ImagePart) for p in item):
                raise ValueError(f"an input is a text turn or an image's spans, got {item!r}")
            full.extend(item)
            no_text = list(full)
    return GenerationContexts(full, no_text, no_image)
