"""The flow Loop over the persisted prefix KV == openpi-style sampling that recomputes the prefix every step."""

from __future__ import annotations

import torch

from mstar_graphs.pi05 import reference

STEPS = 10


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _noise(b: int, model, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, model.action_horizon, model.action_dim, generator=g)


def test_persisted_prefix_equals_recompute_every_step(model, harness, observe):
    # Two robots with different camera counts, prompts and states: different prefix lengths,
    # packed into one prefill step and one batched flow evaluation per Euler step.
    obs = [
        observe(2, "pick up the red cube", [0.1, -0.5, 0.99, -1.0, 0.3], seed=1),
        observe(1, "open the top drawer", [0.7, 0.0], seed=2),
    ]
    assert obs[0].ids.shape[0] != obs[1].ids.shape[0]
    harness.prefill(obs)
    prefix_kv = [
        (harness.cache.k[:, t].clone(), harness.cache.v[:, t].clone()) for t in (harness.tables[0], harness.tables[1])
    ]
    noise = _noise(2, model, seed=3)

    got = harness.sample(noise, STEPS)

    for b, o in enumerate(obs):
        ref = reference.sample_actions(model, o.ids, noise[b], embeds=o.packed_embeds, embed_mask=o.mask, steps=STEPS)
        err = _rel_err(got[b], ref)
        assert err < 1e-4, f"robot {b}: rel err {err:.2e}"
        # the flow moved far from the noise: a real trajectory, not a near-identity
        assert _rel_err(ref, noise[b]) > 0.1
    # the prefix KV was never rewritten by the flow steps (only the suffix slots were)
    for b, o in enumerate(obs):
        n, bs = o.ids.shape[0], harness.cache.block_size
        k_before, v_before = prefix_kv[b]
        k_now, v_now = harness.cache.k[:, harness.tables[b]], harness.cache.v[:, harness.tables[b]]

        def flat(t: torch.Tensor, n: int = n) -> torch.Tensor:  # [layers, tokens, kv, d] -> the first n tokens
            return t.reshape(t.shape[0], -1, *t.shape[3:])[:, :n]

        assert torch.equal(flat(k_now), flat(k_before)) and torch.equal(flat(v_now), flat(v_before))
        assert bs * len(harness.tables[b]) >= n + model.action_horizon


def test_one_velocity_equals_joint_forward(model, harness, observe):
    # A single evaluation at an arbitrary time, against the dense joint forward.
    o = observe(1, "fold the cloth", [0.25, -0.75, 0.5], seed=4)
    harness.prefill([o])
    x = _noise(1, model, seed=5)
    t = torch.tensor([0.37])
    v = harness.velocity(x, t)

    e, c = model.expert, model.config
    prefix = reference.prefix_embeddings(model, o.ids, o.packed_embeds, o.mask)
    temb = reference._time_embedding(0.37, c.expert.width, c.min_period, c.max_period)
    cond = torch.nn.functional.silu(e.time_mlp_out(torch.nn.functional.silu(e.time_mlp_in(temb))))
    with torch.no_grad():
        _, out = reference.joint_forward(model, prefix, e.action_in_proj(x[0]), cond)
        ref = e.action_out_proj(out)
    assert _rel_err(v[0], ref) < 1e-5


def test_flow_depends_on_the_prefix_and_on_time(model, harness, observe):
    # The expert must read the prefix KV (another prompt -> other velocities) and the adaRMS
    # time conditioning must matter (another t -> other velocities), or the parity above is weak.
    obs = [observe(1, "push the button", [0.5], seed=6), observe(1, "wipe the table", [-0.5], seed=6)]
    harness.prefill(obs)
    x = _noise(1, model, seed=7).expand(2, -1, -1).contiguous()
    v = harness.velocity(x, torch.tensor([0.5, 0.5]))
    assert _rel_err(v[0], v[1]) > 1e-2
    v_late = harness.velocity(x, torch.tensor([0.9, 0.5]))
    assert _rel_err(v_late[0], v[0]) > 1e-2
    torch.testing.assert_close(v_late[1], v[1], rtol=1e-5, atol=1e-6)  # rewriting the slots is idempotent
