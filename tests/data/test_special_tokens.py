import dataclasses

import pytest

from lumina.contract.special_tokens import SpecialTokens


def test_official_ids_match_the_contract():
    tok = SpecialTokens.official()
    # contract section 7 / the issue text, written out by hand
    expected = dict(
        pad=156892, text_mask=156895, boa=157165, eoa=157166, boi=157167, eoi=157168, bo3d=157169,
        eo3d=157170, bov=157171, eov=157172, system_open=157153, system_close=157154, user_open=157155,
        uncondition=157156, user_close=157157, image_mask=5000, image_row_end=5001, mesh3d_row_end=5002,
        mesh3d_layer_end=5003, video_row_end=5004, video_group_end=5005, text_vocab_size=157184,
        image_vocab_size=5010, codebook_size=4096, num_codebooks=8,
    )
    assert {k: getattr(tok, k) for k in expected} == expected


def test_override_for_a_small_tokenizer():
    tok = SpecialTokens(text_vocab_size=512, pad=0, text_mask=1, boa=2, eoa=3, boi=4, eoi=5, bov=6, eov=7,
                        bo3d=8, eo3d=9, system_open=10, system_close=11, user_open=12, user_close=13,
                        uncondition=14, codebook_size=64, num_codebooks=4)
    assert (tok.boa, tok.image_mask, tok.num_codebooks) == (2, 5000, 4)
    assert tok.structural_text_ids == frozenset(range(10))


def test_duplicate_text_id_is_rejected():
    with pytest.raises(ValueError, match=r"eoa=157165.*boa"):
        SpecialTokens(eoa=157165)


def test_text_id_outside_vocab_is_rejected():
    with pytest.raises(ValueError, match=r"bov=157171: outside the text vocabulary \[0, 157170\)"):
        SpecialTokens(text_vocab_size=157170)


def test_image_marker_must_not_collide_with_codes():
    with pytest.raises(ValueError, match=r"image_row_end=100"):
        SpecialTokens(image_row_end=100)
    with pytest.raises(ValueError, match=r"image_mask=5000"):
        SpecialTokens(codebook_size=5005, image_row_end=5006, mesh3d_row_end=5007, mesh3d_layer_end=5008,
                      video_row_end=5009, video_group_end=5005)


def test_template_tokens():
    """The official placeholders (utils/tokenizer_contract.py); "\\n" is the tokenizer's, unset by default."""
    tok = SpecialTokens.official()
    assert (tok.img_context, tok.video_context, tok.mesh3d_context, tok.newline) == (157160, 157161, 157158, -1)
    assert SpecialTokens.official(newline=198).newline == 198
    with pytest.raises(ValueError, match=r"newline=157160: same id as img_context"):
        SpecialTokens.official(newline=157160)


def test_a_record_without_the_template_is_refused():
    fields = dataclasses.asdict(SpecialTokens.official(newline=198))
    assert SpecialTokens.from_record(fields, "x.parquet") == SpecialTokens.official(newline=198)
    old = {k: v for k, v in fields.items() if k not in ("img_context", "video_context", "mesh3d_context", "newline")}
    with pytest.raises(ValueError, match=r"x.parquet: special tokens recorded without \['img_context'.*predates the "
                                         r"prompt template"):
        SpecialTokens.from_record(old, "x.parquet")
