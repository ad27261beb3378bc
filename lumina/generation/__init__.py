"""Generation: block-diffusion text decoding, text-to-image / editing with guidance, and their shared pieces."""

from lumina.generation.guidance import guide_dual, guide_single
from lumina.generation.image import ImageAnswer, StepTrace, generate_images
from lumina.generation.sampling_config import ImageSamplingConfig, TextSamplingConfig
from lumina.generation.sequences import Prompt, image_sequence, text_sequence
from lumina.generation.text import TextAnswer, generate_text

__all__ = [
    "ImageAnswer", "ImageSamplingConfig", "Prompt", "StepTrace", "TextAnswer", "TextSamplingConfig",
    "generate_images", "generate_text", "guide_dual", "guide_single", "image_sequence", "text_sequence",
]
