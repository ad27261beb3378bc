"""Rollouts never guide (`lumina.post_training.rollout`): the policy the loss trains is the conditional model,
so it is the one that samples. Checked on a checkpoint trained with CFG dropout, whose `<uncondition>` branch a
guided sampler would mix in."""

from __future__ import annotations

import dataclasses

import torch
from rl_helpers import compose_train, quiet

from lumina.generation.image import generate_images
from lumina.post_training.rollout import RolloutConfig, rollout
from lumina.training.run import run
from lumina.world.rl_prompts import WorldPrompts


def test_rollouts_sample_the_conditional_policy_of_a_cfg_trained_checkpoint(tmp_path):
    outputs = run(compose_train(["experiment=debug", "trainer.max_steps=3", *quiet(tmp_path), "logger=none",
                                 "+data.noise.uncond_text_prob=0.5", "+data.noise.uncond_image_prob=0.5",
                                 "data.sources.0.options.num_samples=40", "data.sources.0.options.val_samples=8",
                                 "callbacks.expert_usage=null", "callbacks.conditioning=null",
                                 "callbacks.checkpoint=null"]))
    model = outputs.module.model.eval()
    prompts, tokens = WorldPrompts(2, num_items=40, mix={"t2i": 1.0}).load_prompts()
    config = RolloutConfig(group_size=2, image_steps=4)
    completions = rollout(model, prompts[:2], config, tokens, step=0)
    requests = [dataclasses.replace(c.prompt.prompt, key=c.key) for c in completions]
    sampling = config.image_sampling(len(requests))
    unguided = generate_images(model, requests, tokens, sampling)
    guided = generate_images(model, requests, tokens, dataclasses.replace(sampling, cfg_scale=3.0))
    assert all(torch.equal(u.codes, c.codes) for u, c in zip(unguided, completions, strict=True))
    assert not all(torch.equal(g.codes, c.codes) for g, c in zip(guided, completions, strict=True))
