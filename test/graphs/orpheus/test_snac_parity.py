"""Our SNAC decoder vs the reference ``snac`` package, loaded from the same random checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

snac = pytest.importorskip("snac")
from safetensors.torch import load_file  # noqa: E402

from mstar.weights import WeightsError, save_safetensors  # noqa: E402
from mstar_graphs.orpheus.snac_config import SnacConfig  # noqa: E402
from mstar_graphs.orpheus.snac_decoder import SnacDecoder, checkpoint_name_map  # noqa: E402
from mstar_graphs.orpheus.snac_layers import WNConv  # noqa: E402
from mstar_graphs.orpheus.tiny_snac import write_tiny_snac  # noqa: E402

ATOL = 1e-4


def _reference(directory: Path) -> torch.nn.Module:
    config = SnacConfig.from_dir(directory)
    model = snac.SNAC(**config.snac_kwargs())
    model.load_state_dict(load_file(str(directory / "model.safetensors")))
    return model.eval()


def _random_codes(batch: int, frames: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 4096, (batch, frames * m), generator=gen) for m in (1, 2, 4)]


def _assert_close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    assert ours.shape == ref.shape
    assert ref.abs().max() > 0.05, "reference audio is ~silent; the test would prove nothing"
    err = (ours - ref).abs().max().item()
    assert err <= ATOL * max(1.0, ref.abs().max().item()), f"max abs error {err}"


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_snac(tmp_path_factory.mktemp("snac_tiny"), "tiny")


@pytest.fixture(scope="module")
def reference(tiny_dir: Path) -> torch.nn.Module:
    return _reference(tiny_dir)


@pytest.fixture(scope="module")
def ours(tiny_dir: Path) -> SnacDecoder:
    return SnacDecoder.from_pretrained_dir(tiny_dir, progress=False)


def test_tiny_checkpoint_is_real_layout(tiny_dir: Path, reference: torch.nn.Module) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["mstar_random_weights"] is True
    assert config["attn_window_size"] is None and config["vq_strides"] == [4, 2, 1]
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    assert set(tensors) == set(reference.state_dict())
    assert any(k.startswith("encoder.") for k in tensors)
    # Deterministic: a second write gives identical tensors.
    again = load_file(str(write_tiny_snac(tiny_dir.parent / "again", "tiny") / "model.safetensors"))
    assert all(torch.equal(tensors[k], again[k]) for k in tensors)


def test_batch1_same_seed_matches_reference(reference: torch.nn.Module, ours: SnacDecoder) -> None:
    codes = _random_codes(1, 4, seed=0)
    torch.manual_seed(1234)
    with torch.no_grad():
        ref = reference.decode(codes)
    out = ours.decode(codes, ours.make_noise(torch.Generator().manual_seed(1234), 1, codes[-1].shape[-1]))
    assert out.shape == (1, 1, 4 * 2048)
    _assert_close(out, ref)


def test_batch3_explicit_noise_matches_reference(
    reference: torch.nn.Module, ours: SnacDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    codes = _random_codes(3, 3, seed=1)
    gen = torch.Generator().manual_seed(99)
    # Arbitrary (not randn-stream) noise fed to both sides: checks noise goes to the right blocks.
    noise = [2.0 * torch.rand(s, generator=gen) - 1.0 for s in ours.noise_shapes(3, codes[-1].shape[-1])]
    pending = list(noise)
    seen_shapes = []

    def noise_forward(self, x):  # replaces the reference's internal torch.randn
        n = pending.pop(0)
        seen_shapes.append(tuple(n.shape))
        assert n.shape == (x.shape[0], 1, x.shape[-1])
        return x + n * self.linear(x)

    monkeypatch.setattr(snac.layers.NoiseBlock, "forward", noise_forward)
    with torch.no_grad():
        ref = reference.decode(codes)
    assert not pending and seen_shapes == [tuple(n.shape) for n in noise]
    _assert_close(ours.decode(codes, noise), ref)


def test_attention_config_matches_reference(tmp_path: Path) -> None:
    # The 24 kHz model has no attention; the 32/44 kHz configs do. Small dims, two heads.
    directory = write_tiny_snac(tmp_path, "tiny", overrides={"attn_window_size": 4, "decoder_dim": 128})
    reference, ours = _reference(directory), SnacDecoder.from_pretrained_dir(directory, progress=False)
    codes = _random_codes(2, 2, seed=3)
    torch.manual_seed(7)
    with torch.no_grad():
        ref = reference.decode(codes)
    _assert_close(ours.decode(codes, ours.make_noise(torch.Generator().manual_seed(7), 2, 8)), ref)


def test_fold_weight_norm_leaves_plain_weights(tiny_dir: Path, ours: SnacDecoder) -> None:
    names = list(ours.state_dict())
    assert not any("parametrizations" in n for n in names)
    assert all(m.folded for m in ours.modules() if isinstance(m, WNConv))
    # Unfolded (norm computed on the fly) gives the same audio.
    unfolded = SnacDecoder(SnacConfig.from_dir(tiny_dir))
    from mstar.weights import load_weights

    load_weights(unfolded, tiny_dir, name_map=checkpoint_name_map, progress=False)
    codes = _random_codes(1, 2, seed=4)
    noise = ours.make_noise(torch.Generator().manual_seed(0), 1, 8)
    with torch.no_grad():
        torch.testing.assert_close(unfolded.decode(codes, noise), ours.decode(codes, noise), atol=1e-5, rtol=0)


def test_legacy_weight_g_v_bin_loads(tmp_path: Path, tiny_dir: Path, ours: SnacDecoder) -> None:
    legacy = {}
    for name, t in load_file(str(tiny_dir / "model.safetensors")).items():
        name = name.replace(".parametrizations.weight.original0", ".weight_g")
        name = name.replace(".parametrizations.weight.original1", ".weight_v")
        legacy[name] = t
    assert any(n.endswith(".weight_g") for n in legacy) and not any("parametrizations" in n for n in legacy)
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    torch.save(legacy, tmp_path / "pytorch_model.bin")  # the hub repo ships pytorch_model.bin
    loaded = SnacDecoder.from_pretrained_dir(tmp_path, progress=False)
    for (n1, a), (n2, b) in zip(ours.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(a, b), n1


def test_missing_tensor_raises_weights_error(tmp_path: Path, tiny_dir: Path) -> None:
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    del tensors["decoder.model.3.block.0.alpha"]
    save_safetensors(tensors, tmp_path)
    shutil.copy(tiny_dir / "config.json", tmp_path / "config.json")
    with pytest.raises(WeightsError, match=r"decoder\.model\.3\.block\.0\.alpha"):
        SnacDecoder.from_pretrained_dir(tmp_path, progress=False)


def test_decode_checks_noise_and_levels(ours: SnacDecoder) -> None:
    codes = _random_codes(1, 1, seed=5)
    with pytest.raises(ValueError, match="noise"):
        ours.decode(codes, None)
    with pytest.raises(ValueError, match="code levels"):
        ours.decode(codes[:2], ours.make_noise(None, 1, 4))
    with pytest.raises(ValueError, match="level 1"):
        ours.decode([codes[0], codes[1][:, :1], codes[2]], ours.make_noise(None, 1, 4))


def test_config_from_dir_and_errors(tmp_path: Path, tiny_dir: Path) -> None:
    config = SnacConfig.from_dir(tiny_dir)
    assert config.hop_length == 2 * 4 * 8 * 8 == 512
    assert config.latent_dim is None and config.resolved_latent_dim == 8 * 16
    assert config.mstar_random_weights is True
    data = json.loads((tiny_dir / "config.json").read_text())
    for field, value in [("encoder_dim", "48"), ("vq_strides", [4, "2", 1]), ("noise", 1), ("attn_window_size", 1.5)]:
        (tmp_path / "config.json").write_text(json.dumps({**data, field: value}))
        with pytest.raises(ValueError, match=field):
            SnacConfig.from_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in data.items() if k != "decoder_rates"}))
    with pytest.raises(ValueError, match="decoder_rates"):
        SnacConfig.from_dir(tmp_path)
