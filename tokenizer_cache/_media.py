"""Prompt tokens of images, the way vLLM 0.32's multimodal processors expand them.

How vLLM counts a chat with media (vllm/renderers/chat_utils.py and
vllm/multimodal/processing/processor.py):

1. Each media part becomes, for a template that iterates over content
   ("openai" format), a part ``{"type": "image"}`` (plus any fields vLLM does
   not know, e.g. ``cache_control``); for a "string" template, the model's
   placeholder text (`get_placeholder_str`: Qwen-VL
   ``<|vision_start|><|image_pad|><|vision_end|>``, Gemma 3
   ``<start_of_image>``, LLaVA ``<image>``) goes in front of the message's
   text, one per item not already typed by the user, joined with ``"\\n"``.
2. The template is rendered and the text tokenized as for any chat.
3. The processor replaces, left to right, one occurrence of the modality's
   target token per item with that item's tokens; extra occurrences stay as
   they are, too few is an error.  The count is the length of the result.

What each family puts there (chosen, as vLLM does, by config.json's
``architectures``):

- Qwen2-VL, Qwen2.5-VL, Qwen3-VL (`Qwen2VLMultiModalProcessor`): the target
  ``<|image_pad|>`` becomes grid_t*grid_h*grid_w / merge_size**2 of itself.
  The grid is transformers' `smart_resize(h, w, factor=patch_size*merge_size,
  min_pixels, max_pixels)` / patch_size with grid_t = 1 for an image; the
  numbers come from the image processor's config (``processor_config.json``'s
  nested "image_processor", else ``preprocessor_config.json``; ``min_pixels``
  / ``max_pixels`` override ``size.shortest_edge`` / ``size.longest_edge``)
  and from the request's ``mm_processor_kwargs`` (vLLM refuses those unless
  started with --trust-request-mm-kwargs).  An aspect ratio above 200 is
  smart_resize's ValueError, a 400.
- Gemma 3 (`Gemma3MultiModalProcessor`): ``<start_of_image>`` becomes the
  tokens of ``"\\n\\n<start_of_image>" + "<image_soft_token>" * image_seq_length
  + "<end_of_image>\\n\\n"`` (image_seq_length from processor_config.json,
  default 256), and then vLLM merges adjacent newline tokens ("\\n"+"\\n\\n"
  and "\\n\\n"+"\\n" into "\\n\\n\\n", "\\n\\n"+"\\n\\n" into "\\n\\n\\n\\n")
  so the ids match what the tokenizer would produce.  With pan-and-scan
  (off unless the request's mm_processor_kwargs turn it on: the processor's
  own defaults win over preprocessor_config.json), an image wide or tall
  enough gets crops, each one more image sequence, in a sentence.
- LLaVA-1.5-style (`LlavaMultiModalProcessor` with a CLIP or SigLIP tower):
  ``<image>`` becomes a fixed number of itself whatever the image:
  (image_size / patch_size)**2, plus 1 for CLIP's class token, minus 1 when
  ``vision_feature_select_strategy`` is "default".

Everything else is reported as MediaNotCountable, for these reasons:

- Videos: vLLM decodes the container with OpenCV (frame count from the
  container, checked by seeking to the end, broken frames skipped), samples
  ``num_frames`` (32) or by ``fps`` from --media-io-kwargs, and the video
  processor samples again; the count depends on decoding, not on a header.
- Audio: the count follows the decoded, resampled duration (and not every
  model takes audio); nothing in a header gives it for compressed formats.
- Embeddings (``image_embeds``, ...): the count is the tensor's row count.
- LLaVA-NeXT / OneVision any-resolution tiling, Pixtral, InternVL, ...: not
  reproduced here yet.

Where brimful cannot count, vLLM 0.32 can: ``POST /tokenize`` with the chat
runs the same multimodal processor (media included; measured equal to
``usage.prompt_tokens`` for images and a video), while the render endpoints
(``/v1/chat/completions/render``) answer 403 "Scale-out endpoints are
disabled" unless vLLM runs with --enable-scale-out; with it, the length of
the ``token_ids`` they return equalled ``usage.prompt_tokens`` on all 51
served requests of tests/data/media_cases.jsonl, videos included.  Server-level --mm-processor-kwargs and
--media-io-kwargs are not visible to brimful; the defaults are assumed.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tokenizers import Tokenizer

from ._errors import CountError, MediaNotCountable

Size = tuple[int, int]  # (width, height)


@dataclass(frozen=True)
class MediaItem:
    """One media part of a request, in the order vLLM tracks them."""

    modality: str  # "image", "video", "audio"
    part_type: str  # the content part's type, e.g. "image_url", "input_image"
    url: str | None  # image_url / video_url / audio_url; None for embeddings and input_audio
    where: str  # e.g. "messages[0].content[1]"


class MediaModel(Protocol):
    """One model's multimodal arithmetic: placeholders in, prompt tokens out."""

    @property
    def family(self) -> str: ...

    @property
    def placeholders(self) -> Mapping[str, str]:
        """The text vLLM puts in a "string"-format prompt for each item, per modality."""
        ...

    def count(self, ids: list[int], images: Sequence[Size], kwargs: Mapping[str, Any]) -> int:
        """Prompt tokens once `images` (in request order) replace their placeholders in `ids`."""
        ...


def _placeholder_positions(ids: list[int], target: int, needed: int, where: str) -> None:
    if needed and ids.count(target) < needed:
        raise MediaNotCountable(
            f"The rendered prompt has fewer image placeholders than the request has images ({needed}); "
            "vLLM refuses such a request, or the template drops media.",
            reason="placeholders",
            where=where,
        )


# ---------------------------------------------------------------------------
# Qwen2-VL / Qwen2.5-VL / Qwen3-VL
# ---------------------------------------------------------------------------

def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' qwen2_vl `smart_resize` (5.19), line for line: (height, width)."""
    if max(height, width) / min(height, width) > 200:
        raise CountError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}",
            param="messages",
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


_QWEN_SIZE_KEYS = frozenset({"min_pixels", "max_pixels", "size"})


@dataclass(frozen=True)
class QwenVL:
    family: str
    image_token_id: int
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    placeholders: Mapping[str, str]

    def image_tokens(self, size: Size, min_pixels: int, max_pixels: int) -> int:
        width, height = size
        resized_h, resized_w = smart_resize(
            height, width, self.patch_size * self.merge_size, min_pixels, max_pixels
        )
        grid = (resized_h // self.patch_size) * (resized_w // self.patch_size)
        return grid // (self.merge_size**2)

    def pixel_bounds(self, kwargs: Mapping[str, Any]) -> tuple[int, int]:
        """(min_pixels, max_pixels) after the request's mm_processor_kwargs.

        Flat keys, then the "images_kwargs" scope (which wins); in each,
        ``size`` edges then ``min_pixels``/``max_pixels`` (vLLM's
        `_get_vision_size` and the image processor agree on that order).
        """
        low, high = self.min_pixels, self.max_pixels
        scoped = kwargs.get("images_kwargs")
        for scope in (kwargs, scoped if isinstance(scoped, Mapping) else {}):
            unknown = set(scope) - _QWEN_SIZE_KEYS - {"images_kwargs", "videos_kwargs"}
            if unknown:
                raise MediaNotCountable(
                    f"mm_processor_kwargs {sorted(unknown)} are not reproduced by brimful.", reason="kwargs"
                )
            size = scope.get("size")
            if size is not None:
                if not isinstance(size, Mapping) or set(size) - {"shortest_edge", "longest_edge"}:
                    raise MediaNotCountable("mm_processor_kwargs 'size' is not reproduced by brimful.",
                                            reason="kwargs")
                low = _pixels(size.get("shortest_edge"), low)
                high = _pixels(size.get("longest_edge"), high)
            low = _pixels(scope.get("min_pixels"), low)
            high = _pixels(scope.get("max_pixels"), high)
        return low, high

    def count(self, ids: list[int], images: Sequence[Size], kwargs: Mapping[str, Any]) -> int:
        _placeholder_positions(ids, self.image_token_id, len(images), "messages")
        low, high = self.pixel_bounds(kwargs)
        return len(ids) + sum(self.image_tokens(size, low, high) - 1 for size in images)


def _pixels(value: Any, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise MediaNotCountable("A pixel bound in mm_processor_kwargs is not a positive integer.", reason="kwargs")
    return value


# ---------------------------------------------------------------------------
# Gemma 3
# ---------------------------------------------------------------------------

_PAN_AND_SCAN_KEYS = (
    "do_pan_and_scan",
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "pan_and_scan_min_ratio_to_activate",
)
# Gemma3ProcessorKwargs._defaults["images_kwargs"] (transformers 5.19): they
# win over the image processor's own config in vLLM's `get_num_crops`.
_PAN_AND_SCAN_DEFAULTS: Mapping[str, Any] = {
    "do_pan_and_scan": False,
    "pan_and_scan_min_crop_size": 256,
    "pan_and_scan_max_num_crops": 4,
    "pan_and_scan_min_ratio_to_activate": 1.2,
}


@dataclass(frozen=True)
class Gemma3:
    family: str
    tokenizer: Tokenizer
    boi_token: str
    boi_id: int
    full_image_sequence: str
    newline_ids: tuple[int, int, int, int]  # "\n", "\n\n", "\n\n\n", "\n\n\n\n"
    placeholders: Mapping[str, str]

    def settings(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        settings = dict(_PAN_AND_SCAN_DEFAULTS)
        scoped = kwargs.get("images_kwargs")
        for scope in (kwargs, scoped if isinstance(scoped, Mapping) else {}):
            unknown = set(scope) - set(_PAN_AND_SCAN_KEYS) - {"images_kwargs", "do_convert_rgb"}
            if unknown:
                raise MediaNotCountable(
                    f"mm_processor_kwargs {sorted(unknown)} are not reproduced by brimful.", reason="kwargs"
                )
            settings.update({key: scope[key] for key in _PAN_AND_SCAN_KEYS if key in scope})
        return settings

    def num_crops(self, size: Size, settings: Mapping[str, Any]) -> int:
        """vLLM's `Gemma3ProcessingInfo.get_num_crops`."""
        if not settings["do_pan_and_scan"]:
            return 0
        width, height = size
        min_crop = settings["pan_and_scan_min_crop_size"]
        max_crops = settings["pan_and_scan_max_num_crops"]
        min_ratio = settings["pan_and_scan_min_ratio_to_activate"]
        if width >= height:
            if width / height < min_ratio:
                return 0
            crops_w = min(math.floor(width / min_crop), math.floor(width / height + 0.5))
            crops_w = min(max_crops, max(2, crops_w))
            crops_h = 1
        else:
            if height / width < min_ratio:
                return 0
            crops_h = min(math.floor(height / min_crop), math.floor(height / width + 0.5))
            crops_h = min(max_crops, max(2, crops_h))
            crops_w = 1
        if min(math.ceil(width / crops_w), math.ceil(height / crops_h)) < min_crop:
            return 0
        return int(crops_w * crops_h)

    def replacement(self, crops: int) -> list[int]:
        """`get_image_repl`: the ids one image's boi token becomes."""
        if crops == 0:
            text = self.boi_token
        else:
            crop_tokens = " ".join(self.boi_token for _ in range(crops))
            text = (
                f"Here is the original image {self.boi_token} and here are some "
                f"crops to help you see better {crop_tokens}"
            )
        text = text.replace(self.boi_token, self.full_image_sequence)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def count(self, ids: list[int], images: Sequence[Size], kwargs: Mapping[str, Any]) -> int:
        _placeholder_positions(ids, self.boi_id, len(images), "messages")
        settings = self.settings(kwargs)
        out: list[int] = []
        start = 0
        for size in images:
            at = ids.index(self.boi_id, start)
            out.extend(ids[start:at])
            out.extend(self.replacement(self.num_crops(size, settings)))
            start = at + 1
        out.extend(ids[start:])
        one, two, three, four = self.newline_ids
        out = _replace(out, [one, two], [three])
        out = _replace(out, [two, one], [three])
        out = _replace(out, [two, two], [four])
        return len(out)


def _replace(ids: list[int], match: list[int], new: list[int]) -> list[int]:
    """vLLM's `replace_token_matches`: non-overlapping, left to right."""
    out: list[int] = []
    i, n = 0, len(match)
    while i < len(ids):
        if ids[i : i + n] == match:
            out.extend(new)
            i += n
        else:
            out.append(ids[i])
            i += 1
    return out


# ---------------------------------------------------------------------------
# LLaVA-1.5 style: a fixed grid per image
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FixedGrid:
    family: str
    image_token_id: int
    tokens_per_image: int
    placeholders: Mapping[str, str]

    def count(self, ids: list[int], images: Sequence[Size], kwargs: Mapping[str, Any]) -> int:
        _placeholder_positions(ids, self.image_token_id, len(images), "messages")
        return len(ids) + len(images) * (self.tokens_per_image - 1)


# ---------------------------------------------------------------------------
# Which arithmetic a model directory gets
# ---------------------------------------------------------------------------

_QWEN_ARCHITECTURES = {
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen2_5_VLForConditionalGeneration": "qwen2_5_vl",
    "Qwen3VLForConditionalGeneration": "qwen3_vl",
    "Qwen3VLMoeForConditionalGeneration": "qwen3_vl_moe",
}
_QWEN_PLACEHOLDERS = {
    "image": "<|vision_start|><|image_pad|><|vision_end|>",
    "video": "<|vision_start|><|video_pad|><|vision_end|>",
}
# Qwen2VLImageProcessor's class defaults (transformers 5.19).
_QWEN_DEFAULTS = {"patch_size": 14, "merge_size": 2, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280}


def _json(path: pathlib.Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _image_processor_config(directory: pathlib.Path) -> dict[str, Any] | None:
    """transformers' order: processor_config.json's nested "image_processor", else preprocessor_config.json."""
    processor = _json(directory / "processor_config.json")
    if processor is not None and isinstance(nested := processor.get("image_processor"), dict):
        return nested
    return _json(directory / "preprocessor_config.json")


def _token_id(tokenizer: Tokenizer, token: str) -> int | None:
    return tokenizer.token_to_id(token)


def load_media_model(
    directory: pathlib.Path, tokenizer: Tokenizer, tokenizer_config: Mapping[str, Any]
) -> tuple[MediaModel | None, str]:
    """The model's multimodal arithmetic, or None and why not (for logs)."""
    config = _json(directory / "config.json")
    if config is None:
        return None, "no config.json beside the tokenizer"
    architectures = config.get("architectures") or []
    architecture = next((a for a in architectures if isinstance(a, str)), None)
    if architecture in _QWEN_ARCHITECTURES:
        return _qwen(directory, tokenizer, _QWEN_ARCHITECTURES[architecture])
    if architecture == "Gemma3ForConditionalGeneration":
        return _gemma3(directory, tokenizer, tokenizer_config)
    if architecture == "LlavaForConditionalGeneration":
        return _llava(config, tokenizer)
    return None, f"no multimodal arithmetic for architecture {architecture!r}"


def _qwen(directory: pathlib.Path, tokenizer: Tokenizer, family: str) -> tuple[MediaModel | None, str]:
    processor = _image_processor_config(directory)
    if processor is None:
        return None, "no preprocessor_config.json"
    kind = processor.get("image_processor_type")
    if kind is not None and not str(kind).startswith("Qwen2VLImageProcessor"):
        return None, f"image processor {kind!r} is not Qwen2VLImageProcessor"
    values = dict(_QWEN_DEFAULTS)
    size = processor.get("size")
    if isinstance(size, dict):
        values["min_pixels"] = size.get("shortest_edge", values["min_pixels"])
        values["max_pixels"] = size.get("longest_edge", values["max_pixels"])
    for key in ("patch_size", "merge_size", "min_pixels", "max_pixels"):
        if processor.get(key) is not None:
            values[key] = processor[key]
    if not all(isinstance(value, int) and value > 0 for value in values.values()):
        return None, f"unexpected image processor values {values}"
    image_token_id = _token_id(tokenizer, "<|image_pad|>")
    if image_token_id is None:
        return None, "the tokenizer has no <|image_pad|> token"
    return (
        QwenVL(
            family=family,
            image_token_id=image_token_id,
            patch_size=values["patch_size"],
            merge_size=values["merge_size"],
            min_pixels=values["min_pixels"],
            max_pixels=values["max_pixels"],
            placeholders=_QWEN_PLACEHOLDERS,
        ),
        "",
    )


def _special(tokenizer_config: Mapping[str, Any], key: str, default: str) -> str:
    """A named token: a top-level key, or transformers 5's "extra_special_tokens"."""
    for source in (tokenizer_config, tokenizer_config.get("extra_special_tokens") or {}):
        value = source.get(key) if isinstance(source, Mapping) else None
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            return value
    return default


def _gemma3(
    directory: pathlib.Path, tokenizer: Tokenizer, tokenizer_config: Mapping[str, Any]
) -> tuple[MediaModel | None, str]:
    processor = _json(directory / "processor_config.json") or {}
    seq_length = processor.get("image_seq_length", 256)
    if not isinstance(seq_length, int) or seq_length <= 0:
        return None, "unexpected image_seq_length"
    boi = _special(tokenizer_config, "boi_token", "<start_of_image>")
    eoi = _special(tokenizer_config, "eoi_token", "<end_of_image>")
    image = _special(tokenizer_config, "image_token", "<image_soft_token>")
    boi_id = _token_id(tokenizer, boi)
    newlines = [_token_id(tokenizer, "\n" * n) for n in (1, 2, 3, 4)]
    if boi_id is None or None in newlines or _token_id(tokenizer, image) is None:
        return None, "the tokenizer lacks Gemma 3's image or newline tokens"
    one, two, three, four = (n for n in newlines if n is not None)
    return (
        Gemma3(
            family="gemma3",
            tokenizer=tokenizer,
            boi_token=boi,
            boi_id=boi_id,
            full_image_sequence=f"\n\n{boi}{image * seq_length}{eoi}\n\n",
            newline_ids=(one, two, three, four),
            placeholders={"image": boi},
        ),
        "",
    )


_LLAVA_TOWERS = {"clip_vision_model": 1, "siglip_vision_model": 0}  # extra class token


def _llava(config: Mapping[str, Any], tokenizer: Tokenizer) -> tuple[MediaModel | None, str]:
    """vLLM picks Pixtral's processor for a Pixtral tower and LLaVA's for CLIP/SigLIP
    (`_build_llava_or_pixtral_hf_info`); only the latter is a fixed grid."""
    vision = config.get("vision_config") or {}
    tower = vision.get("model_type", "clip_vision_model")
    image_size, patch_size = vision.get("image_size"), vision.get("patch_size")
    if tower not in _LLAVA_TOWERS or not isinstance(image_size, int) or not isinstance(patch_size, int):
        return None, f"LLaVA vision tower {tower!r} is not a fixed CLIP/SigLIP grid"
    tokens = (image_size // patch_size) ** 2 + _LLAVA_TOWERS[tower]
    strategy = config.get("vision_feature_select_strategy", "default")
    if strategy == "default":
        tokens -= 1
    elif strategy != "full":
        return None, f"vision_feature_select_strategy {strategy!r}"
    image_token_id = config.get("image_token_index", config.get("image_token_id", 32000))
    if not isinstance(image_token_id, int):
        return None, "no image_token_index"
    if tokenizer.id_to_token(image_token_id) is None:
        return None, f"image_token_index {image_token_id} is not in the tokenizer"
    return FixedGrid(family="llava", image_token_id=image_token_id, tokens_per_image=tokens,
                     placeholders={"image": "<image>"}), ""
