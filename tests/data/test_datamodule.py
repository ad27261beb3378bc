"""LuminaDataModule loaders, LayoutSource over real samples + layout, validation loader, config checks."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from sample_helpers import NEWLINE, mix_items
from synthetic_source import SyntheticSource

from lumina.contract.schema import Media, Sample, Text, Turn
from lumina.contract.special_tokens import SpecialTokens
from lumina.data.datamodule import DataConfig, LuminaDataModule
from lumina.data.epoch_plan import PackSchedule
from lumina.data.mixture import MixturePlan
from lumina.data.noise import NoiseConfig
from lumina.data.sequence_layout import layout_eval, layout_sample
from lumina.data.sources import LayoutSource, MixtureSource
from lumina.data.storage import InMemorySampleDataset

BASE = [5, 9, 3, 7, 12, 4, 6, 8, 2, 10, 11, 3, 5, 7, 9, 1, 6, 8]


def batches_of(loader) -> list[tuple]:
    return [(b.cu_seqlens.tolist(), b.input_ids.sum().item(), b.labels.sum().item(), b.token_valid.sum().item())
            for b in loader]


def make_dm(workers: int = 0, base: list[int] = BASE, **cfg) -> LuminaDataModule:
    src = SyntheticSource(base, num_codebooks=2, drop_prob=0.5, drop=3)
    return LuminaDataModule(DataConfig(seq_len=16, num_workers=workers, num_codebooks=2, **cfg), src,
                            val_source=SyntheticSource(base[:7], num_codebooks=2))


def test_train_loader_workers_match_and_cover_epoch() -> None:
    plain, pooled = make_dm(0), make_dm(2)
    for epoch in range(2):
        plain.sampler.set_epoch(epoch)
        pooled.sampler.set_epoch(epoch)
        a, b = list(plain.train_dataloader()), batches_of(pooled.train_dataloader())
        assert batches_of(a) == b
        samples = sorted(int(x.input_ids[0, s, 0]) for x in a for s in x.seg_bounds[:-1] if x.token_valid[0, s])
        assert samples == list(range(len(BASE)))
        assert all(int(x.input_ids[0, 0, 1]) == epoch for x in a)  # the sequences of that epoch


def test_rank_short_of_packs_gets_all_padding_pack(caplog: pytest.LogCaptureFixture) -> None:
    num_packs = make_dm(0).schedule.plan(0).num_packs
    world = num_packs + 1  # one step each; the last rank has no pack left
    dms = [make_dm(0) for _ in range(world)]
    with caplog.at_level(logging.INFO, logger="lumina.data.epoch_plan"):
        loaded = []
        for r, dm in enumerate(dms):
            dm.schedule.set_rank(r, world)
            loaded.append(list(dm.train_dataloader()))
    assert [len(batches) for batches in loaded] == [1] * world
    pad = loaded[-1][0]
    assert pad.cu_seqlens.tolist() == [0, 16] and not pad.token_valid.any()
    assert (pad.labels == -100).all() and (pad.input_ids == 156892).all()
    assert all(b[0].token_valid.any() for b in loaded[:-1])
    assert "-> 1 all-padding packs" in caplog.text


def test_overlong_skip_in_datamodule(caplog: pytest.LogCaptureFixture) -> None:
    dm = make_dm(0, base=[5, 30, 7, 40, 3], overlong="skip")
    with caplog.at_level(logging.WARNING, logger="lumina.data.epoch_plan"):
        batches = list(dm.train_dataloader())
    assert sorted(int(x.input_ids[0, s, 0]) for x in batches for s in x.seg_bounds[:-1] if x.token_valid[0, s]) == [0, 2, 4]
    assert "skipped 2 samples longer than seq_len=16" in caplog.text
    with pytest.raises(ValueError, match=r"sample syn-1 \(index 1\) has laid-out length (27|30) > seq_len=16"):
        list(make_dm(0, base=[5, 30, 7]).train_dataloader())


def test_val_loader_fixed_and_dealt() -> None:
    dms = [make_dm(0) for _ in range(2)]
    for r, dm in enumerate(dms):
        dm.schedule.set_rank(r, 2)
    first = [batches_of(dm.val_dataloader()) for dm in dms]
    assert first == [batches_of(dm.val_dataloader()) for dm in dms]  # the same every time
    assert len(first[0]) == len(first[1])
    seen = [int(x.input_ids[0, s, 0]) for dm in dms for x in dm.val_dataloader() for s in x.seg_bounds[:-1] if x.token_valid[0, s]]
    assert sorted(seen) == list(range(7))


def test_trainer_requires_no_distributed_sampler() -> None:
    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            return self.w.sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match="use_distributed_sampler=False"):
        trainer.fit(Tiny(), datamodule=make_dm(0))


@pytest.mark.parametrize(("field", "value"), [("seq_len", 0), ("overlong", "truncate"), ("num_workers", -1),
                                              ("val_noise_t", 1.5), ("num_codebooks", 0), ("seq_len", "abc"),
                                              ("seq_len", 1.5), ("persistent_workers", "maybe"), ("noise", [1])])
def test_config_rejects(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"DataConfig.{field}="):
        DataConfig(**{field: value})


def test_config_sources_from_dicts() -> None:
    cfg = DataConfig(sources=[{"name": "world", "weight": 2.0}])
    assert cfg.sources[0].name == "world" and cfg.sources[0].weight == 2.0
    schema = OmegaConf.structured(DataConfig)  # usable as a Hydra structured config
    merged = OmegaConf.to_object(OmegaConf.merge(schema, {"seq_len": 64, "overlong": "skip",
                                                          "sources": [{"name": "w", "weight": 0.5}]}))
    assert (merged.seq_len, merged.overlong, merged.sources[0].weight) == (64, "skip", 0.5)
    with pytest.raises(ValueError, match=r"sources\['x'\].weight=0"):
        DataConfig(sources=[{"name": "x", "weight": 0}])


# ---------------------------------------------------------------- LayoutSource over real samples


def real_samples(tokens: SpecialTokens) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for k in range(6):
        grid = (2, 3 + k % 2)
        codes = torch.randint(0, tokens.codebook_size, (grid[0] * grid[1], tokens.num_codebooks), generator=gen)
        prompt = [Text(list(range(10, 14 + k)))]
        if k % 2:  # image answers; odd ones also carry a source image in the prompt
            prompt = [Media("image", codes.clone(), grid), *prompt]
        answer = [Media("image", codes, grid)] if k < 4 else [Text(list(range(20, 25 + 3 * k)))]
        out.append(Sample(f"s{k}", [Turn("user", prompt), Turn("assistant", answer)]))
    return out


def test_layout_source_lengths_match_layout() -> None:
    tokens = SpecialTokens.official(newline=NEWLINE)
    dataset = InMemorySampleDataset(real_samples(tokens), tokens)
    noise = NoiseConfig(uncond_text_prob=0.5, uncond_image_prob=0.5)
    src = LayoutSource(dataset, noise, seed=3)
    per_epoch = []
    for epoch in range(4):
        lengths = src.lengths(epoch).tolist()
        assert lengths == [len(layout_sample(dataset[i], tokens, noise, 3, epoch)) for i in range(len(src))]
        per_epoch.append(lengths)
        for i in range(len(src)):
            seq = src.sequence(i, epoch)
            assert len(seq) == lengths[i] and seq.sample_id == f"s{i}"
    assert len({tuple(x) for x in per_epoch}) > 1  # CFG dropout changes some lengths between epochs
    dm = LuminaDataModule(DataConfig(seq_len=256), src)
    batches = list(dm.train_dataloader())
    assert sum(int(b.token_valid.sum()) for b in batches) == sum(per_epoch[0])
    assert sum(len(b.seg_bounds) - 1 for b in batches) == len(src)


def test_layout_source_eval_fixed_noise() -> None:
    tokens = SpecialTokens.official(newline=NEWLINE)
    dataset = InMemorySampleDataset(real_samples(tokens), tokens)
    noise = NoiseConfig(uncond_text_prob=0.5, uncond_image_prob=0.5)
    src = LayoutSource(dataset, noise, seed=3, eval_t=0.5)
    assert src.lengths(0).tolist() == src.lengths(7).tolist() == dataset.laid_out_lengths()[:, 0].tolist()
    for i in range(len(src)):
        a, b = src.sequence(i, 0), src.sequence(i, 9)
        want = layout_eval(dataset[i], tokens, noise, 3, 0.5)
        assert torch.equal(a.input_ids, want.input_ids) and torch.equal(b.input_ids, want.input_ids)
    with pytest.raises(ValueError, match="eval_t=2"):
        LayoutSource(dataset, noise, seed=3, eval_t=2)


def test_mixture_source_lengths_match_layout() -> None:
    tokens = SpecialTokens.official(newline=NEWLINE)
    samples = real_samples(tokens)
    a, b = InMemorySampleDataset(samples[:3], tokens), InMemorySampleDataset(samples[3:], tokens)
    noise = NoiseConfig(uncond_text_prob=0.5, uncond_image_prob=0.5)
    mixture = MixturePlan({"a": a, "b": b}, {"a": 1.0, "b": 3.0}, seed=1, samples_per_epoch=10)
    src = MixtureSource(mixture, noise, seed=3)
    assert len(src) == 10
    for epoch in range(3):
        items = mix_items(mixture.epoch(epoch))
        want = [len(layout_sample(mixture.sample(item), tokens, noise, 3, epoch)) for item in items]
        assert src.lengths(epoch).tolist() == want
        assert [src.sample_id(j) for j in range(10)] == [mixture.sample(item).id for item in items]
        dm = LuminaDataModule(DataConfig(seq_len=256), src)
        dm.sampler.set_epoch(epoch)
        batches = list(dm.train_dataloader())
        assert sum(int(x.token_valid.sum()) for x in batches) == sum(want)
        assert sum(len(x.seg_bounds) - 1 for x in batches) == 10


def test_a_mixture_resumes_mid_epoch_on_the_same_packs() -> None:
    """Saved after 3 steps of epoch 1, restored into freshly built sources and plan: the remaining packs (and
    their samples) are the uninterrupted run's."""
    tokens = SpecialTokens.official(newline=NEWLINE)
    samples = real_samples(tokens)
    noise = NoiseConfig(uncond_text_prob=0.5, uncond_image_prob=0.5)

    def schedule() -> tuple[PackSchedule, MixtureSource]:
        sources = {"a": InMemorySampleDataset(samples[:3], tokens), "b": InMemorySampleDataset(samples[3:], tokens)}
        src = MixtureSource(MixturePlan(sources, {"a": 1.0, "b": 3.0}, seed=1, samples_per_epoch=40), noise, 3)
        return PackSchedule(src.lengths, 256, 5, sample_id=src.sample_id), src

    straight, straight_src = schedule()
    full = straight.begin(1)
    members = [list(straight.plan().pack(p)) for p in full]
    saved, _ = schedule()
    saved.begin(1)
    saved.consumed(3)
    state = saved.state_dict()
    resumed, src = schedule()
    resumed.load_state_dict(state)  # checks the plan fingerprint
    rest = resumed.begin(1)
    assert len(full) > 4 and rest == full[3:]
    assert [list(resumed.plan().pack(p)) for p in rest] == members[3:]
    assert [src.sample_id(i) for m in members[3:] for i in m] == \
        [straight_src.sample_id(i) for m in members[3:] for i in m]


def test_pin_memory_follows_the_trainers_device() -> None:
    """null: pinned only under a CUDA trainer (this CPU trainer: not); an explicit value wins."""
    dm = make_dm(0)
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        use_distributed_sampler=False)
    dm.trainer = trainer
    assert dm.train_dataloader().pin_memory is False
    assert make_dm(0, pin_memory=True).train_dataloader().pin_memory is True


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pinned_batches_copy_to_the_gpu_unchanged() -> None:
    plain, pinned = list(make_dm(0).train_dataloader()), list(make_dm(2, pin_memory=True).train_dataloader())
    assert len(plain) == len(pinned)
    for a, b in zip(plain, pinned, strict=True):
        assert b.input_ids.is_pinned() and b.token_valid.is_pinned() and b.cu_seqlens.is_pinned()
        moved = b.to("cuda")
        torch.cuda.synchronize()
        assert moved.input_ids.is_cuda and torch.equal(moved.input_ids.cpu(), a.input_ids)
        assert torch.equal(moved.labels.cpu(), a.labels) and moved.seg_bounds == a.seg_bounds
