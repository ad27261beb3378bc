"""Rewards on the built-in world: the checker on decoded pictures, exact match on text, a user's function."""

from __future__ import annotations

import hydra
import pytest

from lumina.generation.sequences import Prompt
from lumina.post_training.rewards import Rewards
from lumina.post_training.samples import Completion, RLPrompt
from lumina.world.dataset import cached_world_image_tokenizer, world_text_tokenizer
from lumina.world.rewards import ExactMatch, WorldCheck
from lumina.world.scene import ObjectSpec, render
from lumina.world.tasks import WorldItem

TARGET = ObjectSpec("circle", "red", "large", "top left")


def _image(spec: ObjectSpec) -> Completion:
    tokenizer = cached_world_image_tokenizer()
    codes = tokenizer.encode(render(spec)[None])[0]
    prompt = RLPrompt(Prompt([], key="i", grid=(8, 8)), "t2i", WorldItem("i", "t2i", "draw", target=TARGET))
    return Completion(prompt, 0, codes=codes.reshape(-1, codes.shape[-1]))


def test_world_check_scores_the_decoded_picture():
    right = _image(TARGET)
    two_wrong = _image(ObjectSpec("circle", "blue", "small", "top left"))
    assert WorldCheck()(right.prompt, right) == 1.0
    assert WorldCheck()(two_wrong.prompt, two_wrong) == 0.5
    assert WorldCheck(exact=True)(two_wrong.prompt, two_wrong) == 0.0


def test_exact_match_decodes_the_answer():
    words = world_text_tokenizer()
    item = WorldItem("q", "vqa", "what colour is the shape ?", answer="red")
    prompt = RLPrompt(Prompt([], key="q"), "vqa", item)
    right = Completion(prompt, 0, ids=[], answer_ids=words.encode("red"))
    wrong = Completion(prompt, 0, ids=[], answer_ids=words.encode("red circle"))
    assert ExactMatch()(prompt, right) == 1.0
    assert ExactMatch()(prompt, wrong) == 0.0


def user_reward(prompt, sample):
    return float(len(sample.answer_ids))


def test_rewards_from_hydra_config_with_a_user_function():
    rewards = Rewards(hydra.utils.instantiate({
        "vqa": {"_target_": "lumina.world.rewards.ExactMatch"},
        "text_qa": {"_target_": f"{__name__}.user_reward", "_partial_": True}}))
    prompt = RLPrompt(Prompt([], key="t"), "text_qa", None)
    assert rewards(prompt, Completion(prompt, 0, ids=[], answer_ids=[5, 6, 7])) == 3.0
    with pytest.raises(ValueError, match="reward.t2i: no reward for task 't2i'"):
        rewards(RLPrompt(Prompt([], key="x"), "t2i"), Completion(prompt, 0, ids=[]))
    bad = Rewards({"text_qa": lambda p, s: float("nan")})
    with pytest.raises(ValueError, match="reward.text_qa returned nan"):
        bad(prompt, Completion(prompt, 0, ids=[], answer_ids=[]))
