"""System prompts of the prompt template, in named prompt sets keyed by a task's `system_prompt` key.

The official inference scripts open every prompt with `<system>{prompt}</system>`, one prompt per request
kind (infer_mmu_sft.py, infer_video_sft.py, infer_3d_sft.py, infer_t2i_sft.py): the set "official". A
plug-in registers its own set with `PROMPT_SETS.add` (the built-in world's short ones fit its vocabulary).
"""

from __future__ import annotations

from lumina.contract.tasks import EDIT, T2I, TEXT, UNDERSTAND, UNDERSTAND_MESH3D, UNDERSTAND_VIDEO
from lumina.plugins import PluginRegistry

OFFICIAL_SYSTEM_PROMPTS = {
    TEXT.system_prompt: "You are a helpful assistant.",
    UNDERSTAND.system_prompt: "You are a multimodal assistant. Answer directly using the provided image(s), text, "
                              "and conversation context; if there is no question, describe the image(s) clearly "
                              "and accurately.",
    UNDERSTAND_VIDEO.system_prompt: "You are a multimodal model that can process text and video. Answer the "
                                    "following question based on the provided video frames or clips. Analyze "
                                    "temporal dynamics, motion, interactions, and scene changes across frames. "
                                    "Track relevant objects and events over time, and integrate information to "
                                    "produce a consistent and accurate answer.",
    UNDERSTAND_MESH3D.system_prompt: "You are a multimodal model that can process text and 3D content. Answer the "
                                     "following question based on the provided 3D representations. Carefully "
                                     "analyze the object's geometry, spatial structure, viewpoint consistency, and "
                                     "fine-grained details across views. Combine relevant information to produce a "
                                     "coherent and accurate answer.",
    T2I.system_prompt: "Generate an image according to the text prompt.",
    EDIT.system_prompt: "Generate an image applying the following editing instruction based on the original "
                        "image.",
}
PROMPT_SETS: PluginRegistry[dict[str, str]] = PluginRegistry("system prompt set")
PROMPT_SETS.add("official", OFFICIAL_SYSTEM_PROMPTS)
