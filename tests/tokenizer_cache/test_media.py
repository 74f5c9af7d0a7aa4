"""The media rules of the counter, one at a time, on the tiny Qwen2-VL tokenizer directory.

Exact counts against a real vLLM are in test_media_corpus.py; here each test
names one rule: what vLLM hands the template, which media brimful refuses to
guess (MediaNotCountable, never a 400) and which requests vLLM itself refuses
(CountError).
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import MODELS
from tests.realvllm.tiny_vl_model import (
    OPENAI_TEMPLATE,
    STRING_TEMPLATE,
    write_tokenizer_dir,
)
from tests.support.media_cases import data_url, image, text, user
from tokenizer_cache import (
    CountError,
    MediaNotCountable,
    ModelTokenizer,
    load_model_tokenizer,
)
from tokenizer_cache._media import QwenVL, load_media_model

QWEN25 = MODELS / "Qwen--Qwen2.5-7B-Instruct"
PNG = data_url((640, 480))  # 391 image tokens at the tiny model's pixel bounds


def tiff_url() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "TIFF")
    return "data:image/tiff;base64," + base64.b64encode(buffer.getvalue()).decode()


def tokenizer_dir(tmp_path: Path, template: str = OPENAI_TEMPLATE, **files: dict) -> ModelTokenizer:
    write_tokenizer_dir(tmp_path, QWEN25, template)
    for name, content in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(content), encoding="utf-8")
    return load_model_tokenizer(tmp_path)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    return tokenizer_dir(tmp_path_factory.mktemp("tiny-qwen2-vl"))


@pytest.fixture(scope="module")
def qwen_string(tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    """The same vocabulary under a template that takes string content (placeholders put in front)."""
    return tokenizer_dir(tmp_path_factory.mktemp("tiny-qwen2-vl-string"), STRING_TEMPLATE)


def chat(*messages: dict, **extra) -> dict:
    return {"messages": list(messages), **extra}


def test_each_image_adds_its_grid_minus_the_placeholder(qwen: ModelTokenizer):
    without = qwen.count_chat(chat(user(text("x"))))
    with_one = qwen.count_chat(chat(user(text("x"), image(PNG))))
    # <|vision_start|><|image_pad|><|vision_end|> is 3 tokens, the pad becomes 34*46/4 = 391
    assert with_one - without == 3 - 1 + 391


def test_openai_template_sees_image_parts_with_unknown_fields(tmp_path: Path):
    tok = tokenizer_dir(tmp_path,
                        "{% for m in messages %}{% for p in m.content %}{{ p | tojson }}\n{% endfor %}{% endfor %}")
    rendered = tok.render_chat(chat(user(image(PNG, cache_control={"type": "ephemeral"}), text("hi"))))
    assert [json.loads(line) for line in rendered.splitlines()] == [
        {"type": "image", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "hi"},
    ]


def test_string_template_gets_placeholders_in_front_of_the_text(qwen_string: ModelTokenizer):
    tok = qwen_string
    rendered = tok.render_chat(chat(user(text("one"), image(PNG), text("two"), image(PNG))))
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    assert f"user\n{placeholder}\n{placeholder}\none\ntwo<|im_end|>" in rendered


def test_string_template_keeps_a_placeholder_the_user_typed(qwen_string: ModelTokenizer):
    tok = qwen_string
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    rendered = tok.render_chat(chat(user(text(f"see {placeholder} here"), image(PNG))))
    assert rendered.count(placeholder) == 1


def test_more_typed_placeholders_than_images_is_vllms_400(qwen_string: ModelTokenizer):
    tok = qwen_string
    placeholder = "<|vision_start|><|image_pad|><|vision_end|>"
    with pytest.raises(CountError, match="Found more"):
        tok.count_chat(chat(user(text(placeholder * 2), image(PNG))))


@pytest.mark.parametrize(
    "part,reason",
    [
        (image("https://example.com/cat.png"), "remote_url"),
        (image("file:///srv/cat.png"), "remote_url"),
        ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}, "modality"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}, "modality"),
        ({"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,AAAA"}}, "modality"),
        ({"type": "image_embeds", "image_embeds": "AAAA"}, "modality"),
        ({"type": "image_url", "image_url": {"url": PNG}, "uuid": "cached-1"}, None),
        ({"type": "input_image", "detail": "auto", "file_id": "file-1"}, "modality"),
        (image(tiff_url()), "image_format"),
    ],
    ids=["https", "file", "video", "input_audio", "audio_url", "image_embeds", "uuid-with-url", "file-id", "tiff"],
)
def test_media_brimful_cannot_count_is_not_a_400(qwen: ModelTokenizer, part: dict, reason: str | None):
    body = chat(user(text("look"), part))
    if reason is None:  # a uuid next to a URL: vLLM still loads the URL, so it counts
        assert qwen.count_chat(body) == qwen.count_chat(chat(user(text("look"), image(PNG))))
        return
    with pytest.raises(MediaNotCountable) as caught:
        qwen.count_chat(body)
    assert caught.value.reason == reason
    assert caught.value.where == "messages[0].content[1]"
    assert "example.com" not in caught.value.message and "AAAA" not in caught.value.message


def test_a_model_without_multimodal_arithmetic_does_not_count_images(tmp_path: Path):
    tok = tokenizer_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    tok = load_model_tokenizer(tmp_path)
    assert tok.media_family is None and "Qwen2ForCausalLM" in tok.media_unsupported
    with pytest.raises(MediaNotCountable) as caught:
        tok.count_chat(chat(user(image(PNG))))
    assert caught.value.reason == "model"
    assert tok.count_chat(chat(user(text("text still counts")))) > 0


@pytest.mark.parametrize(
    "part,match",
    [
        ({"type": "image_url", "image_url": PNG}, "must be an object"),
        ({"type": "image_url", "image_url": {}}, "must be an object"),
        ({"type": "image_url", "image_url": {"url": PNG, "detail": "ultra"}}, "detail"),
        ({"type": "input_image", "image_url": PNG}, "detail"),
        (image("data:image/png;base64,iVBORw0KGgo"), "Non-base64"),
        (image("gopher://x/y.png"), "HTTP, data or file URL"),
        (image(data_url((402, 2))), "aspect ratio"),
    ],
    ids=["url-not-object", "no-url", "bad-detail", "input-image-no-detail", "bad-base64", "scheme", "aspect"],
)
def test_media_vllm_refuses_is_a_count_error(qwen: ModelTokenizer, part: dict, match: str):
    with pytest.raises(CountError, match=match):
        qwen.count_chat(chat(user(part)))


def test_unknown_processor_kwargs_are_not_guessed(qwen: ModelTokenizer):
    with pytest.raises(MediaNotCountable) as caught:
        qwen.count_chat(chat(user(image(PNG)), mm_processor_kwargs={"patch_size": 16}))
    assert caught.value.reason == "kwargs"


def test_pixel_bounds_from_processor_config_json_win_over_preprocessor_config(tmp_path: Path):
    nested = {"image_processor": {"image_processor_type": "Qwen2VLImageProcessorFast", "patch_size": 16,
                                  "merge_size": 2, "size": {"shortest_edge": 65536, "longest_edge": 16777216}}}
    tok = tokenizer_dir(tmp_path, processor_config=nested)
    # Qwen3-VL-style numbers: 640x480 -> factor 32 -> 640x480 stays -> 40x30 patches -> 300 tokens
    assert tok.count_chat(chat(user(image(PNG)))) - tok.count_chat(chat(user())) == 3 - 1 + 300


def test_an_image_request_is_counted_without_decoding_the_image(qwen: ModelTokenizer):
    """A 40 MB payload whose middle is not even valid base64: only the header is read."""
    header = base64.b64decode(PNG.partition(",")[2])
    body = base64.b64encode(header).decode()
    huge = "data:image/png;base64," + body[:64] + "!" * 40_000_000 + body[64:]
    # the first chunks (signature, IHDR) decode; the chunk walk then meets a length past the end
    with pytest.raises(CountError):
        qwen.count_chat(chat(user(image(huge))))


GRIDS = json.loads((Path(__file__).resolve().parents[1] / "data" / "qwen_vl_grids.json").read_text())


@pytest.mark.parametrize("name", sorted(GRIDS))
def test_published_pixel_bounds_match_transformers_image_processor(tmp_path: Path, name: str):
    """tests/support/qwen_grid_cases.py ran transformers' processor at the published bounds (up to 16,384 tokens)."""
    config = {"image_processor_type": "Qwen2VLImageProcessor", **GRIDS[name]["config"]}
    tok = tokenizer_dir(tmp_path, processor_config={"image_processor": config})
    model, _ = load_media_model(tmp_path, tok.tokenizer, {})
    assert isinstance(model, QwenVL)
    for width, height, tokens in GRIDS[name]["cases"]:
        assert model.image_tokens((width, height), model.min_pixels, model.max_pixels) == tokens, (width, height)
