"""Per-task system prompts of the prompt template.

The official inference scripts open every prompt with `<system>{prompt}</system>`, one prompt per task
(infer_mmu_sft.py, infer_video_sft.py, infer_3d_sft.py, infer_t2i_sft.py). The built-in world uses short
ones of its own (`lumina.world.tasks.WORLD_SYSTEM_PROMPTS`) that fit its closed vocabulary.
"""

from __future__ import annotations

OFFICIAL_SYSTEM_PROMPTS = {
    "text": "You are a helpful assistant.",
    "understand": "You are a multimodal assistant. Answer directly using the provided image(s), text, and "
                  "conversation context; if there is no question, describe the image(s) clearly and accurately.",
    "understand_video": "You are a multimodal model that can process text and video. Answer the following "
                        "question based on the provided video frames or clips. Analyze temporal dynamics, motion, "
                        "interactions, and scene changes across frames. Track relevant objects and events over "
                        "time, and integrate information to produce a consistent and accurate answer.",
    "understand_mesh3d": "You are a multimodal model that can process text and 3D content. Answer the following "
                         "question based on the provided 3D representations. Carefully analyze the object's "
                         "geometry, spatial structure, viewpoint consistency, and fine-grained details across "
                         "views. Combine relevant information to produce a coherent and accurate answer.",
    "t2i": "Generate an image according to the text prompt.",
    "edit": "Generate an image applying the following editing instruction based on the original image.",
}


def system_prompt_task(answer_is_image: bool, media_kinds: list[str]) -> str:
    """The system-prompt key of a request: an image answer is "edit" with a source image, else "t2i"; a text
    answer is "text" without media, else the understanding prompt of its first media kind."""
    if answer_is_image:
        return "edit" if media_kinds else "t2i"
    if not media_kinds:
        return "text"
    return {"image": "understand", "video": "understand_video", "mesh3d": "understand_mesh3d"}[media_kinds[0]]
