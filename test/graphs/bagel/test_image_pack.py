"""Several images as one request input and back (mstar_graphs.bagel.image_pack)."""

from __future__ import annotations

import pytest
import torch

from mstar_graphs.bagel.image_pack import pack_images, unpack_images


def test_one_image_travels_as_it_is_several_flat_with_their_sizes():
    one = torch.randn(3, 4, 6)
    image, sizes = pack_images([one])
    assert image is one and sizes is None and unpack_images(image)[0] is one
    images = [torch.randn(3, 4, 6), torch.randn(3, 8, 2), torch.randn(3, 4, 6)]
    flat, sizes = pack_images(images)
    assert flat.dim() == 1 and sizes.tolist() == [[4, 6], [8, 2], [4, 6]]
    back = unpack_images(flat, sizes)
    assert len(back) == 3 and all(torch.equal(a, b) for a, b in zip(back, images))


def test_a_mismatch_is_refused():
    flat, sizes = pack_images([torch.randn(3, 4, 6), torch.randn(3, 2, 2)])
    with pytest.raises(ValueError, match="need 84"):
        unpack_images(flat[:-1], sizes)
    with pytest.raises(ValueError, match=r"\[3, H, W\]"):
        unpack_images(flat)
    with pytest.raises(ValueError, match=r"\[3, H, W\]"):
        pack_images([torch.randn(1, 4, 4)])
