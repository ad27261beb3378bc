"""lumina: the training half of InternLumina-U2-style unified multimodal block-diffusion MoE models."""

__version__ = "0.1.0"
