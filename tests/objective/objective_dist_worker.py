"""Shared pieces of the 2-process objective tests: the packs each rank trains on, their union, and the
worker that runs every distributed check in one spawn (results saved to `out_dir/rank{r}.pt`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from lumina.contract.batch import PackedBatch
from lumina.model import LuminaConfig, LuminaModel
from lumina.objective import BalanceConfig, LuminaObjective, ObjectiveConfig

M = -100


def tiny_config() -> LuminaConfig:
    return LuminaConfig.tiny()


def build_model(seed: int = 0) -> LuminaModel:
    torch.manual_seed(seed)
    return LuminaModel(tiny_config())


@dataclass
class Segment:
    """One sequence: `prompt` clean type-1 tokens (turn 0), then a noisy turn 1 of `text` type-3 answer
    tokens (the first `text_sup` supervised) and `image` type-4 answer cells (the first `image_sup`
    supervised)."""

    prompt: int
    text: int
    text_sup: int
    image: int = 0
    image_sup: int = 0


def make_pack(segments: list[Segment], seed: int, pad: int = 0) -> PackedBatch:
    """A pack of the segments plus `pad` invalid tail tokens."""
    cfg = tiny_config()
    gen = torch.Generator().manual_seed(seed)
    cols = cfg.num_codebooks
    rows: dict[str, list] = {k: [] for k in ("ids", "labels", "type", "turn", "clean", "pos", "t", "answer")}
    cu = [0]
    for seg in segments:
        t = float(torch.rand((), generator=gen) * 0.9 + 0.1)
        kinds = [1] * seg.prompt + [3] * seg.text + [4] * seg.image
        for i, kind in enumerate(kinds):
            if kind == 4:
                ids = torch.randint(0, cfg.codebook_size, (cols,), generator=gen)
                sup = i - seg.prompt - seg.text < seg.image_sup
                label = torch.randint(0, cfg.codebook_size, (cols,), generator=gen) if sup else torch.full((cols,), M)
            else:
                ids = torch.randint(1, cfg.vocab_size, (1,), generator=gen).expand(cols)
                sup = kind == 3 and i - seg.prompt < seg.text_sup
                label = torch.full((cols,), M)
                if sup:
                    label[0] = int(torch.randint(0, cfg.vocab_size, (1,), generator=gen))
            rows["ids"].append(ids)
            rows["labels"].append(label)
            rows["type"].append(kind)
            rows["turn"].append(0 if kind == 1 else 1)
            rows["clean"].append(kind == 1)
            rows["pos"].append(i)
            rows["t"].append(t if kind == 3 else 0.0)
            rows["answer"].append(kind == 3)
        cu.append(cu[-1] + len(kinds))
    for _ in range(pad):
        rows["ids"].append(torch.zeros(cols, dtype=torch.long))
        rows["labels"].append(torch.full((cols,), M))
        for key, value in (("type", 0), ("turn", 0), ("clean", False), ("pos", 0), ("t", 0.0), ("answer", False)):
            rows[key].append(value)
    seq_len = len(rows["type"])
    return PackedBatch(
        input_ids=torch.stack(rows["ids"]).unsqueeze(0), labels=torch.stack(rows["labels"]).unsqueeze(0),
        type_ids=torch.tensor([rows["type"]]), turn_ids=torch.tensor([rows["turn"]]),
        block_ids=torch.zeros(1, seq_len, dtype=torch.long), position_ids=torch.tensor([rows["pos"]]),
        is_clean=torch.tensor([rows["clean"]]), token_valid=torch.tensor([[True] * cu[-1] + [False] * pad]),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32), noise_t=torch.tensor([rows["t"]]),
        answer_mask=torch.tensor([rows["answer"]]))


def union(first: PackedBatch, second: PackedBatch) -> PackedBatch:
    """One pack holding both packs' segments (the first must have no tail padding)."""
    if int(first.cu_seqlens[-1]) != first.seq_len:
        raise ValueError("the first pack of a union must not have tail padding")
    cat = {name: torch.cat([getattr(first, name), getattr(second, name)], dim=1)
           for name in ("input_ids", "labels", "type_ids", "turn_ids", "block_ids", "position_ids", "is_clean",
                        "token_valid", "noise_t", "answer_mask")}
    cu = torch.cat([first.cu_seqlens, second.cu_seqlens[1:] + first.seq_len])
    return PackedBatch(cu_seqlens=cu, **cat)


@dataclass
class Scenario:
    packs: tuple[PackedBatch, PackedBatch]  # rank 0, rank 1
    config: ObjectiveConfig
    fsdp: bool


def scenarios() -> dict[str, Scenario]:
    no_balance = BalanceConfig(aux_coef=0.0, bias_update=True, bias_rate=0.01)
    few = make_pack([Segment(prompt=4, text=6, text_sup=3)], seed=1)  # 3 supervised text tokens
    many = make_pack([Segment(prompt=3, text=24, text_sup=20, image=12, image_sup=10),
                      Segment(prompt=2, text=22, text_sup=20, image=12, image_sup=10)], seed=2, pad=5)  # 60
    with_image = make_pack([Segment(prompt=3, text=6, text_sup=4, image=6, image_sup=5)], seed=3)
    text_only = make_pack([Segment(prompt=5, text=9, text_sup=7), Segment(prompt=2, text=4, text_sup=4)], seed=4,
                          pad=3)
    image_only = make_pack([Segment(prompt=4, text=0, text_sup=0, image=9, image_sup=9)], seed=5, pad=2)
    return {
        "dp_none": Scenario((few, many), ObjectiveConfig(text_weight=0.8, image_weight=1.2, balance=no_balance), False),
        "dp_inverse_t": Scenario((few, many), ObjectiveConfig(text_weighting="inverse_t", balance=no_balance), False),
        "fsdp_image_on_rank0": Scenario((with_image, text_only), ObjectiveConfig(balance=no_balance), True),
        "fsdp_text_on_rank0": Scenario((with_image, image_only), ObjectiveConfig(balance=no_balance), True),
    }


def shard_conditional_modules(model: LuminaModel) -> None:
    """fully_shard each conditional module (a ModuleList as one group of its children), then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for module in model.conditional_modules().values():
        fully_shard(list(module) if isinstance(module, nn.ModuleList) else module, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_grad(param: nn.Parameter) -> torch.Tensor | None:
    grad = param.grad
    if grad is None:
        return None
    return grad.full_tensor() if hasattr(grad, "full_tensor") else grad


def run_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = {}
        for name, scenario in scenarios().items():
            model = build_model()
            if scenario.fsdp:
                shard_conditional_modules(model)
            objective = LuminaObjective(scenario.config)
            pack = scenario.packs[rank]
            result = objective(model(pack), pack)
            result.loss.backward()
            conditional_without_grad = [f"{mod_name}.{p_name}" for mod_name, module
                                        in model.conditional_modules().items()
                                        for p_name, p in module.named_parameters() if p.grad is None]
            grads = {}
            for p_name, param in model.named_parameters():
                if scenario.fsdp:
                    grads[p_name] = full_grad(param)  # FSDP2 reduce-scatter already averaged over ranks
                else:
                    grad = param.grad if param.grad is not None else torch.zeros_like(param)
                    dist.all_reduce(grad)
                    grads[p_name] = grad / world
            bias_update = objective.on_optimizer_step(model)
            results[name] = {
                "grads": grads, "conditional_without_grad": conditional_without_grad,
                "loss": result.loss.detach(), "num_text": (result.num_text_local, result.num_text_global),
                "num_image": (result.num_image_local, result.num_image_global),
                "bias_update": bias_update,
                "biases": [moe.gate.expert_bias.clone() for moe in model.moe_layers()],
            }
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
