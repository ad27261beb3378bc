"""Post-training past SFT: rollouts with lumina's own samplers, rewards, likelihood estimators for a sampled
answer (`estimators/`, by name) and the RL / preference loss terms (`losses/`, by name). The LightningModule
runs it as a training mode (`objective=grpo|wd1|vrpo|self_distill` with the `rollout` and `reward` groups)."""
