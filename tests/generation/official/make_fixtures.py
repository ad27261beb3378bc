"""Write `sequences.json`: the sequences the official inference scripts build for the conversations of
`cases.py`, as facts for lumina's tests (tests/generation/test_official_sequences.py); and `parity.json`: the
official generators' outputs on interface.write_tiny_checkpoint (tests/generation/test_official_parity.py).

    python tests/generation/official/make_fixtures.py --official /path/to/InternLumina-U2 [--out FILE]
        [--parity-out FILE]

--official is a checkout of InternLM/InternLumina-U2 (or a copy of its infer_*_sft.py, generators/ and utils/);
its modules are imported unchanged, and `transformers` wraps the fixture tokenizer as their scripts' tokenizer.
The scripts' main() need CUDA, so this calls the functions main() calls, with the arguments main() passes
(generate_single_image_sft's own lines up to its generate_image_ar call, and infer_video_sft.main's
metadata and generate_text_bd call, are repeated here)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cases  # noqa: E402


def rows(t: torch.Tensor) -> list:
    return t.tolist()


def text_prefix(mmu, prefix_tokens, prefix_type_ids) -> dict:
    """infer_mmu_sft.main's metadata for a fresh prompt + infer_single_turn_text's BOA (the video and 3-D
    scripts build the same by hand)."""
    p = int(prefix_tokens.shape[0])
    full = mmu._append_boa_with_meta(prefix_tokens, prefix_type_ids, torch.zeros(p, dtype=torch.long),
                                     torch.full((p,), -1, dtype=torch.long), torch.ones(p, dtype=torch.long),
                                     torch.arange(p), boa_turn_id=1, boa_position_id=p, device="cpu")
    names = ("input_ids", "type_ids", "turn_ids", "block_ids", "is_clean", "position_ids")
    return {**{n: rows(t) for n, t in zip(names, full, strict=True)}, "generated_position_start": p + 1}


def image_request(t2i, tok, system, user, media, grid) -> dict:
    """generate_single_image_sft up to generate_image_ar: every branch's input_ids / type_ids and boundaries."""
    prefix_tokens, prefix_type_ids = t2i.build_sft_user_prefix(tok, system, user, media, "cpu")
    h, w = grid
    mask = t2i.add_break_line_multi_codebook(torch.full((h * w, 8), t2i.IMAGE_MASK_ID, dtype=torch.long), h, w,
                                             new_number=t2i.NEW_LINE)
    special = [t2i.make_special_2d(i, "cpu") for i in (t2i.BOA, t2i.BOI, t2i.EOI, t2i.EOA)]
    input_ids = torch.cat([prefix_tokens, special[0], special[1], mask, special[2], special[3]])
    one = torch.full((1,), t2i.TYPE_TEXT_OR_SPECIAL, dtype=torch.long)
    type_ids = torch.cat([prefix_type_ids, one, one, torch.full((mask.shape[0],), t2i.TYPE_MEDIA_ANSWER), one, one])
    p = prefix_tokens.shape[0]
    answer_ids, answer_types = input_ids[p:], type_ids[p:]
    un_tokens, un_types = t2i.build_sft_uncondition_prefix(tok, system, "cpu")
    un_ids, un_type_ids, un_prefix, un_media = t2i._build_uncondition_branch(un_tokens, un_types, answer_ids,
                                                                              answer_types, 1)
    out = {"cond": {"input_ids": rows(input_ids), "type_ids": rows(type_ids), "user_prefix_len": int(p),
                    "media_region_start": int(p) + 1},
           "uncond": {"input_ids": rows(un_ids), "type_ids": rows(un_type_ids), "user_prefix_len": un_prefix,
                      "media_region_start": un_media}}
    if media:
        (text_tokens, text_types), (image_tokens, image_types) = t2i.build_sft_edit_dual_cfg_prefixes(
            tok, system, user, media, "cpu")
        for name, tokens, types in (("uncond_text", text_tokens, text_types),
                                    ("uncond_image", image_tokens, image_types)):
            out[name] = {"input_ids": rows(torch.cat([tokens, answer_ids])),
                         "type_ids": rows(torch.cat([types, answer_types])), "user_prefix_len": int(tokens.shape[0])}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--official", required=True, help="InternLumina-U2 checkout (infer_*_sft.py, generators/, utils/)")
    parser.add_argument("--out", default=str(HERE / "sequences.json"))
    parser.add_argument("--parity-out", default=str(HERE / "parity.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.official).resolve()))
    import infer_3d_sft as d3
    import infer_mmu_sft as mmu
    import infer_t2i_sft as t2i
    import infer_video_sft as video
    from transformers import PreTrainedTokenizerFast
    from utils.media_token_io import load_image_tokens_from_rclone, load_video_tokens_from_rclone

    system = official_system_prompts(mmu, video, d3, t2i)
    tok = PreTrainedTokenizerFast(tokenizer_object=cases.fixture_tokenizer(system))
    # the image as a .pkl of NumPy arrays written by torch.save, 4 coords columns (row, col the last two)
    h, w = cases.IMAGE_GRID
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "image.pkl"
        coords = np.array([[0, 0, r, c] for r in range(h) for c in range(w)], dtype=np.int64)
        torch.save({"indices": cases.codes(h * w, 1).numpy(), "coords": coords}, path)
        tokens, th, tw = load_image_tokens_from_rclone(str(path))
    image = mmu.add_break_line_multi_codebook(tokens, th, tw, new_number=mmu.NEW_LINE)
    second = mmu.add_break_line_multi_codebook(cases.codes(h * w, 4), h, w, new_number=mmu.NEW_LINE)
    t, vh, vw = cases.VIDEO_GRID
    video_coords = torch.tensor([[0, f, x, y, 0] for f in range(t) for y in range(vh) for x in range(vw)])
    video_rows = video.add_break_line_multi_codebook_video(cases.codes(t * vh * vw, 2), video_coords, t, vh, vw,
                                                            new_number=video.LINE_VIDEO,
                                                            frame_end_number=video.FRAME_VIDEO)
    z, y_, x_ = cases.MESH_GRID
    mesh_coords = torch.tensor([[0, 0, x, y, k] for k in range(z) for y in range(y_) for x in range(x_)])
    mesh_rows = d3.add_break_line_multi_codebook_3d(cases.codes(z * y_ * x_, 3), mesh_coords, y_, x_, z,
                                                    new_number=d3.LINE_3D, layer_end_number=d3.LAYER_3D)
    S, U = system, cases.USER
    out: dict = {"system_prompts": system}
    for name, media in (("understand_image", [(mmu.IMG_CONTEXT, image)]),
                        ("understand_two_images", [(mmu.IMG_CONTEXT, image), (mmu.IMG_CONTEXT, second)]),
                        ("understand_mid_text", [(mmu.IMG_CONTEXT, image)])):
        out[name] = text_prefix(mmu, *mmu.build_sft_user_prefix(tok, S["understand"], U[name], media, True, "cpu"))
    later, later_types = mmu.build_sft_user_prefix(tok, S["understand"], U["understand_later_turn"],
                                                   [(mmu.IMG_CONTEXT, second)], False, "cpu")
    out["understand_later_turn"] = {"input_ids": rows(later), "type_ids": rows(later_types)}
    out["text_qa"] = text_prefix(mmu, *mmu.build_sft_user_prefix(tok, S["text"], U["text_qa"], None, True, "cpu"))
    out["understand_video"] = text_prefix(mmu, *video.build_sft_video_prefix(
        tok, S["understand_video"], U["understand_video"], video_rows, "cpu"))
    out["understand_mesh3d"] = text_prefix(mmu, *d3.build_sft_3d_prefix(
        tok, S["understand_mesh3d"], U["understand_mesh3d"], mesh_rows, "cpu"))
    out["t2i"] = image_request(t2i, tok, S["t2i"], U["t2i"], [], cases.T2I_GRID)
    out["edit"] = image_request(t2i, tok, S["edit"], U["edit"], [(t2i.IMG_CONTEXT, image)], cases.IMAGE_GRID)
    Path(args.out).write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {len(out) - 1} cases to {args.out}")
    parity = parity_outputs(tok, system, mmu, t2i, video, load_image_tokens_from_rclone,
                            load_video_tokens_from_rclone)
    Path(args.parity_out).write_text(json.dumps(parity, indent=1) + "\n")
    print(f"wrote {len(parity)} parity outputs to {args.parity_out}")


def official_system_prompts(mmu, video, d3, t2i) -> dict[str, str]:
    """The scripts' default system prompts, keyed like lumina.contract.system_prompts."""
    return {"text": mmu.DEFAULT_SYSTEM_PROMPTS["text"], "understand": mmu.DEFAULT_SYSTEM_PROMPTS["under"],
            "understand_video": video.DEFAULT_SYSTEM_PROMPT, "understand_mesh3d": d3.DEFAULT_SYSTEM_PROMPT,
            "t2i": t2i.DEFAULT_SYSTEM_PROMPTS["t2i"], "edit": t2i.DEFAULT_SYSTEM_PROMPTS["single_edit"]}


def parity_outputs(tok, system, mmu, t2i, video, load_image_tokens, load_video_tokens) -> dict:
    """The official generators at temperature 0 on interface.write_tiny_checkpoint, through
    interface.OfficialInterface: generated answer ids (cut before EOA) and image codes. Understanding as
    infer_mmu_sft.main (infer_single_turn_text) and infer_video_sft.main (generate_text_bd on its hand-built
    metadata); images as generate_single_image_sft (generate_image_ar; guidance 0, single or dual)."""
    from interface import OfficialInterface, write_tiny_checkpoint

    from lumina.generation.assets import load_model
    from lumina.tokenizers.text import HFTokenizer, special_tokens_of

    S, U = system, cases.USER
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = write_tiny_checkpoint(Path(tmp) / "ckpt")
        cases.fixture_tokenizer(system).save(str(Path(tmp) / "tokenizer.json"))
        tokens = special_tokens_of(HFTokenizer(Path(tmp) / "tokenizer.json"), 4096, 8)
        model = load_model(checkpoint, device="cpu", dtype="float32")

        def answer(prefix, types, settings) -> list[int]:
            iface = OfficialInterface(model, tokens, settings["block_length"])
            p = int(prefix.shape[0])
            ids = mmu.infer_single_turn_text(
                iface, None, prefix, types, settings["gen_length"], settings["block_length"], settings["steps"],
                0.0, "cpu", prefix_turn_ids=torch.zeros(p, dtype=torch.long),
                prefix_block_ids=torch.full((p,), -1, dtype=torch.long), prefix_is_clean=torch.ones(p, dtype=torch.long),
                prefix_position_ids=torch.arange(p), generated_turn_id=1, generated_position_start=p + 1)
            assert iface.mask_checks > 0
            return ids.tolist()

        def image(request, steps, cfg_scale=0.0, cfg_text=None, cfg_img=None) -> list:
            cond, uncond = request["cond"], request["uncond"]
            generator = torch.Generator(device="cpu")
            generator.manual_seed(cases.PARITY_SEED)
            dual = {}
            if cfg_text is not None:
                dual = {"cfg_text": cfg_text, "cfg_img": cfg_img}
                for name in ("text", "image"):
                    branch = request[f"uncond_{name}"]
                    dual[f"uncon_{name}_input_ids"] = torch.tensor([branch["input_ids"]])
                    dual[f"uncon_{name}_type_position_ids"] = torch.tensor([branch["type_ids"]])
                    dual[f"uncon_{name}_user_prefix_len"] = branch["user_prefix_len"]
            iface = OfficialInterface(model, tokens)
            vq = t2i.generate_image_ar(
                iface, input_ids=torch.tensor([cond["input_ids"]]), uncon_input_ids=torch.tensor([uncond["input_ids"]]),
                type_position_ids=torch.tensor([cond["type_ids"]]),
                uncon_type_position_ids=torch.tensor([uncond["type_ids"]]), timesteps=steps,
                mask_token_id=t2i.IMAGE_MASK_ID, newline_id=t2i.NEW_LINE, temperature=0.0, cfg_scale=cfg_scale,
                code_start=cond["media_region_start"], user_prefix_len=cond["user_prefix_len"],
                media_region_start=cond["media_region_start"], uncon_user_prefix_len=uncond["user_prefix_len"],
                uncon_media_region_start=uncond["media_region_start"], generator=generator, **dual)
            assert iface.mask_checks > 0
            return vq[0].tolist()

        def understand_image(path) -> list[int]:
            found, h, w = load_image_tokens(str(path))
            rows_ = mmu.add_break_line_multi_codebook(found, h, w, new_number=mmu.NEW_LINE)
            prefix = mmu.build_sft_user_prefix(tok, S["understand"], U["understand_image"],
                                               [(mmu.IMG_CONTEXT, rows_)], True, "cpu")
            return answer(*prefix, cases.PARITY_UNDERSTAND)

        token_files = cases.write_token_files(tmp)
        for name, path in token_files.items():
            out[f"understand_{name}"] = {"ids": understand_image(path)}
        out["understand_second_image"] = {"ids": understand_image(cases.write_second_image(tmp))}
        prefix = mmu.build_sft_user_prefix(tok, S["text"], U["text_qa"], None, True, "cpu")
        out["text_qa_partial_block"] = {"ids": answer(*prefix, cases.PARITY_TEXT)}
        out["understand_video_file"] = {"ids": video_answer(model, tokens, tok, S, video, load_video_tokens, tmp)}
        for name, steps in cases.PARITY_T2I.items():
            request = image_request(t2i, tok, S["t2i"], U["t2i"], [], cases.PARITY_T2I_GRID)
            out[name] = {"codes": image(request, steps)}
        source, h, w = load_image_tokens(str(token_files["coords4.pt"]))
        source = t2i.add_break_line_multi_codebook(source, h, w, new_number=t2i.NEW_LINE)
        for name, guidance in cases.PARITY_GUIDED.items():
            if name.startswith("t2i"):
                request = image_request(t2i, tok, S["t2i"], U["t2i"], [], cases.PARITY_T2I_GRID)
            else:  # resolve_output_image_size: an edit's answer has its source's grid
                request = image_request(t2i, tok, S["edit"], U["edit"], [(t2i.IMG_CONTEXT, source)], (h, w))
            out[name] = {"codes": image(request, cases.PARITY_GUIDED_STEPS, **guidance)}
    return out


def video_answer(model, tokens, tok, system, video, load_video_tokens, tmp) -> list[int]:
    """infer_video_sft.main on cases.write_video_file: its prefix + BOA with the metadata main builds by hand
    (prefix turn 0 clean, BOA turn 1 noisy at position plen), then its generate_text_bd call."""
    from interface import OfficialInterface

    settings = cases.PARITY_UNDERSTAND
    found, coords, t, h, w = load_video_tokens(str(cases.write_video_file(tmp)))
    rows_ = video.add_break_line_multi_codebook_video(found, coords, t, h, w, new_number=video.LINE_VIDEO,
                                                      frame_end_number=video.FRAME_VIDEO)
    prefix, types = video.build_sft_video_prefix(tok, system["understand_video"], cases.USER["understand_video"],
                                                 rows_, "cpu")
    plen = int(prefix.shape[0])
    one = torch.ones(1, dtype=torch.long)
    iface = OfficialInterface(model, tokens, settings["block_length"])
    ids = video.generate_text_bd(
        iface, prefix_tokens=torch.cat([prefix, video.make_special_2d(video.BOA, "cpu")]),
        prefix_type_ids=torch.cat([types, one * video.TYPE_TEXT_OR_SPECIAL]), gen_length=settings["gen_length"],
        block_length=settings["block_length"], steps_per_block=settings["steps"], temperature=0.0, cfg_scale=0.0,
        remasking="low_confidence", mask_id=video.MASK, answer_type_id=video.TYPE_TEXT_ANSWER,
        early_stop_tokens=[video.EOA], prefix_turn_ids=torch.cat([torch.zeros(plen, dtype=torch.long), one]),
        prefix_block_ids=torch.cat([torch.full((plen,), -1, dtype=torch.long), 0 * one]),
        prefix_is_clean=torch.cat([torch.ones(plen, dtype=torch.long), 0 * one]),
        prefix_position_ids=torch.arange(plen + 1), generated_turn_id=1, generated_position_start=plen + 1,
        require_meta_mask=True)
    assert iface.mask_checks > 0
    return ids.tolist()

if __name__ == "__main__":
    main()
