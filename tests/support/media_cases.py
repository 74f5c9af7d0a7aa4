"""Chat requests with images for the tiny Qwen2-VL model, and their real vLLM counts.

`build_cases()` makes the requests (deterministic: solid-colour images encoded
by Pillow).  `tests/data/media_cases.jsonl` holds the same cases with what vLLM
0.32 answered (`usage.prompt_tokens`, or the error status and message); the
fast tier counts them with brimful (tests/tokenizer_cache/test_media_corpus.py) and the
real-vLLM tier checks that file against a live server
(tests/realvllm/test_media.py).  `build_gemma3_cases()` / `tests/data/media_cases_gemma3.jsonl` and
`build_llava_cases()` / `tests/data/media_cases_llava.jsonl` do the same for
the tiny Gemma 3 and LLaVA-style models.  Regenerate a file with its server running:

    python -m tests.support.media_cases --base-url http://127.0.0.1:PORT [--family gemma3|llava]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from PIL import Image

from tests.realvllm.tiny_vl_model import STRING_TEMPLATE

CORPUS = Path(__file__).resolve().parents[1] / "data" / "media_cases.jsonl"
# 8 grey frames at 5 fps, written once with OpenCV in the vLLM venv (no OpenCV here).
VIDEO = Path(__file__).resolve().parents[1] / "data" / "video-8-frames-200x120.mp4"
GEMMA3_CORPUS = Path(__file__).resolve().parents[1] / "data" / "media_cases_gemma3.jsonl"
MODEL = "tiny-qwen2-vl"
GEMMA3_MODEL = "tiny-gemma3-vl"
LLAVA_CORPUS = Path(__file__).resolve().parents[1] / "data" / "media_cases_llava.jsonl"
LLAVA_MODEL = "tiny-llava"


def data_url(
    size: tuple[int, int],
    fmt: str = "PNG",
    colour: tuple[int, int, int] = (40, 120, 200),
    orientation: int | None = None,
    **params: Any,
) -> str:
    image = Image.new("RGB", size, colour)
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        params["exif"] = exif
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    mime = {"JPEG": "jpeg", "PNG": "png", "GIF": "gif", "WEBP": "webp", "BMP": "bmp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buffer.getvalue()).decode()


def animated_gif(size: tuple[int, int], frames: int) -> str:
    images = [Image.new("P", size, i) for i in range(frames)]
    buffer = io.BytesIO()
    images[0].save(buffer, "GIF", save_all=True, append_images=images[1:], duration=40, loop=0)
    return "data:image/gif;base64," + base64.b64encode(buffer.getvalue()).decode()


def image(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}, **extra}


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def user(*parts: Any) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def build_cases() -> list[dict[str, Any]]:
    """Each case: id, template ("openai" or "string"), request (without model/max_tokens),
    and "brimful": "not_countable" where brimful must forward instead of counting."""
    cases: list[dict[str, Any]] = []

    def add(case_id: str, request: dict[str, Any], template: str = "openai", brimful: str = "count") -> None:
        case = {"id": case_id, "template": template, "request": request}
        if brimful != "count":
            case["brimful"] = brimful  # what brimful does instead of counting
        cases.append(case)

    # One image: sizes and aspect ratios across smart_resize's branches
    # (rounding, below min_pixels, above max_pixels, extreme ratios).
    for width, height in [
        (640, 480), (480, 640), (1, 1), (27, 29), (28, 28), (42, 42), (56, 56), (100, 100),
        (333, 777), (1023, 1025), (1920, 1080), (2000, 2000), (3000, 40), (40, 3000),
        (5000, 26), (199, 1), (1, 150), (701, 13),
    ]:  # fmt: skip
        add(f"size-{width}x{height}",
            {"messages": [user(text("What is in this image?"), image(data_url((width, height))))]})

    # Formats and orientation: what the header reader must get right.
    add("jpeg", {"messages": [user(image(data_url((800, 600), "JPEG", quality=60)), text("Describe."))]})
    add("jpeg-progressive", {"messages": [user(image(data_url((1000, 230), "JPEG", progressive=True)))]})
    add("gif-animated", {"messages": [user(image(animated_gif((300, 120), 3)))]})
    add("webp-lossy", {"messages": [user(image(data_url((512, 300), "WEBP", quality=30)))]})
    add("webp-lossless", {"messages": [user(image(data_url((77, 555), "WEBP", lossless=True)))]})
    add("bmp", {"messages": [user(image(data_url((321, 123), "BMP")))]})
    for orientation in (3, 6, 8):
        add(f"jpeg-exif-orientation-{orientation}",
            {"messages": [user(image(data_url((900, 300), "JPEG", orientation=orientation)))]})  # fmt: skip
    add("png-exif-orientation-6", {"messages": [user(image(data_url((900, 300), "PNG", orientation=6)))]})
    add("webp-exif-orientation-5", {"messages": [user(image(data_url((900, 300), "WEBP", orientation=5)))]})

    # Several images, part shapes and positions.
    add("two-images-one-message", {"messages": [user(
        text("Compare"), image(data_url((640, 480))), text("with"), image(data_url((300, 900), "JPEG")))]})  # fmt: skip
    add("images-in-two-turns", {"messages": [
        user(image(data_url((200, 200))), text("First?")),
        {"role": "assistant", "content": "A square."},
        user(text("And this one?"), image(data_url((1200, 400), "JPEG"))),
    ]})  # fmt: skip
    add("five-images", {"messages": [user(*[image(data_url((100 + 150 * i, 90 + 40 * i))) for i in range(5)])]})
    add("system-then-image", {"messages": [
        {"role": "system", "content": "You look at pictures."},
        user(image(data_url((450, 450), "WEBP", quality=50)), text("Count the colours.")),
    ]})  # fmt: skip
    add("input-image-part", {"messages": [user(
        {"type": "input_image", "image_url": data_url((640, 360)), "detail": "auto"}, text("and?"))]})  # fmt: skip
    add("untyped-image-url", {"messages": [user({"image_url": data_url((222, 111))})]})
    add("image-with-detail-low", {"messages": [user(
        {"type": "image_url", "image_url": {"url": data_url((640, 480)), "detail": "low"}})]})  # fmt: skip
    add("image-with-cache-control",
        {"messages": [user(image(data_url((640, 480)), cache_control={"type": "ephemeral"}))]})
    add("typed-image-pad-in-text", {"messages": [user(text("a <|image_pad|> b"), image(data_url((300, 300))))]})
    add("vision-ids", {"messages": [user(image(data_url((64, 64))), image(data_url((640, 64))), text("Which?"))],
                       "chat_template_kwargs": {"add_vision_id": True}})  # fmt: skip
    add("no-generation-prompt", {"messages": [user(image(data_url((128, 256))))], "add_generation_prompt": False})

    # Request-level processor options (the server runs with --trust-request-mm-kwargs).
    add("kwargs-max-pixels", {"messages": [user(image(data_url((1920, 1080))))],
                              "mm_processor_kwargs": {"max_pixels": 50000}})
    add("kwargs-min-pixels", {"messages": [user(image(data_url((30, 30))))],
                              "mm_processor_kwargs": {"min_pixels": 200000}})
    add("kwargs-size", {"messages": [user(image(data_url((1920, 1080))))],
                        "mm_processor_kwargs": {"size": {"shortest_edge": 3136, "longest_edge": 100000}}})  # fmt: skip
    add("kwargs-images-kwargs", {"messages": [user(image(data_url((1920, 1080))))],
                                 "mm_processor_kwargs": {"images_kwargs": {"max_pixels": 80000}}})  # fmt: skip
    add("kwargs-scoped-wins", {"messages": [user(image(data_url((1920, 1080))))],
                               "mm_processor_kwargs": {"max_pixels": 300000,
                                                       "images_kwargs": {"max_pixels": 60000}}})  # fmt: skip

    # A template that prints content as a string: placeholders go first.
    add("string-one-image", {"messages": [user(text("Describe this."), image(data_url((640, 480))))]}, "string")
    add("string-two-images", {"messages": [user(
        image(data_url((640, 480))), text("and"), image(data_url((100, 900), "JPEG")), text("?"))]},
        "string")  # fmt: skip
    add("string-image-only", {"messages": [user(image(data_url((300, 300))))]}, "string")
    add("string-placeholder-typed", {"messages": [user(
        text("Here: <|vision_start|><|image_pad|><|vision_end|> what?"), image(data_url((640, 480))))]},
        "string")  # fmt: skip

    # Served by vLLM, not counted by brimful: forwarded uncounted, never refused.
    video = "data:video/mp4;base64," + base64.b64encode(VIDEO.read_bytes()).decode()
    add("video-not-countable",
        {"messages": [user(text("What happens?"), {"type": "video_url", "video_url": {"url": video}})]},
        brimful="not_countable")
    add("video-and-image-not-countable", {"messages": [user(
        image(data_url((300, 300))), {"type": "video_url", "video_url": {"url": video}})]},
        brimful="not_countable")  # fmt: skip

    # What vLLM refuses.
    add("error-aspect-ratio-201", {"messages": [user(image(data_url((201, 1))))]})
    add("error-bad-base64", {"messages": [user(image("data:image/png;base64,iVBO!w0KGgo="))]})
    png = base64.b64decode(data_url((64, 64)).partition(",")[2])
    add("error-truncated-png",
        {"messages": [user(image("data:image/png;base64," + base64.b64encode(png[:45]).decode()))]})
    add("error-no-comma", {"messages": [user(image("data:image/png;base64"))]})
    return cases


def build_gemma3_cases() -> list[dict[str, Any]]:
    """Gemma 3: a fixed image budget, newline merging around each image, pan-and-scan crops."""
    cases: list[dict[str, Any]] = []

    def add(case_id: str, request: dict[str, Any]) -> None:
        cases.append({"id": case_id, "template": "openai", "request": request})

    add("image-only", {"messages": [user(image(data_url((640, 480))))]})
    add("text-then-image", {"messages": [user(text("Describe this:"), image(data_url((300, 900), "JPEG")))]})
    add("image-then-text", {"messages": [user(image(data_url((1, 1))), text("What colour?"))]})
    add("text-newline-image", {"messages": [user(text("Look\n"), image(data_url((64, 64))), text("\nthen answer"))]})
    add("two-images-adjacent", {"messages": [user(image(data_url((100, 100))), image(data_url((2000, 100), "WEBP")))]})
    add("three-images-with-text", {"messages": [user(
        text("a"), image(data_url((100, 100))), text("b"), image(data_url((50, 500))), text("c"),
        image(data_url((999, 333), "GIF")))]})  # fmt: skip
    add("system-prefix-then-image", {"messages": [
        {"role": "system", "content": "You describe images."},
        user(image(data_url((400, 400))), text("Go.")),
    ]})  # fmt: skip
    add("images-in-two-turns", {"messages": [
        user(image(data_url((200, 200))), text("First?")),
        {"role": "assistant", "content": "A square."},
        user(text("And this one?"), image(data_url((1200, 400), "JPEG"))),
    ]})  # fmt: skip
    add("no-generation-prompt", {"messages": [user(image(data_url((128, 256))))], "add_generation_prompt": False})
    add("input-image-part", {"messages": [user(
        {"type": "input_image", "image_url": data_url((640, 360)), "detail": "high"}, text("and?"))]})  # fmt: skip
    for width, height in [(1200, 300), (300, 1000), (500, 500), (400, 200), (550, 500), (2600, 260), (780, 256)]:
        add(f"pan-and-scan-{width}x{height}", {"messages": [user(text("Read it."), image(data_url((width, height))))],
                                              "mm_processor_kwargs": {"do_pan_and_scan": True}})  # fmt: skip
    add("pan-and-scan-max-crops-6", {"messages": [user(image(data_url((3000, 300))))],
                                    "mm_processor_kwargs": {"do_pan_and_scan": True,
                                                            "pan_and_scan_max_num_crops": 6}})  # fmt: skip
    add("pan-and-scan-scoped", {"messages": [user(image(data_url((1200, 300))), image(data_url((300, 300))))],
                               "mm_processor_kwargs": {"images_kwargs": {
                                   "do_pan_and_scan": True, "pan_and_scan_min_crop_size": 100}}})  # fmt: skip
    add("pan-and-scan-off-explicitly", {"messages": [user(image(data_url((1200, 300))))],
                                       "mm_processor_kwargs": {"do_pan_and_scan": False}})  # fmt: skip
    add("error-bad-base64", {"messages": [user(image("data:image/png;base64,iVBO!w0KGgo="))]})
    return cases


def build_llava_cases() -> list[dict[str, Any]]:
    """LLaVA-1.5 style: every image is the same fixed grid, whatever its size."""
    cases: list[dict[str, Any]] = []

    def add(case_id: str, request: dict[str, Any]) -> None:
        cases.append({"id": case_id, "template": "openai", "request": request})

    for width, height in [(1, 1), (336, 336), (640, 480), (2000, 100), (77, 1500)]:
        add(f"size-{width}x{height}", {"messages": [user(text("What is it?"), image(data_url((width, height))))]})
    add("jpeg-and-webp", {"messages": [user(image(data_url((500, 400), "JPEG")), image(data_url((90, 60), "WEBP")))]})
    add("images-in-two-turns", {"messages": [
        user(image(data_url((200, 200))), text("First?")),
        {"role": "assistant", "content": "A square."},
        user(text("And this one?"), image(data_url((1200, 400), "JPEG"))),
    ]})  # fmt: skip
    add("three-images", {"messages": [user(*[image(data_url((50 * (i + 1), 40))) for i in range(3)])]})
    add("error-truncated-png", {"messages": [user(image(
        "data:image/png;base64,"
        + base64.b64encode(base64.b64decode(data_url((64, 64)).partition(",")[2])[:45]).decode()
    ))]})  # fmt: skip
    return cases


def vllm_request(case: dict[str, Any], model: str = MODEL) -> dict[str, Any]:
    """The body sent to vLLM: the case's request plus model, max_tokens and the string template."""
    body = {"model": model, "max_tokens": 1, **case["request"]}
    if case["template"] == "string":
        body["chat_template"] = STRING_TEMPLATE
    return body


def ask_vllm(base_url: str, case: dict[str, Any], model: str = MODEL) -> dict[str, Any]:
    """vLLM's answer as corpus fields: the prompt tokens, or the error status and message."""
    request = urllib.request.Request(
        f"{base_url}/v1/chat/completions",
        json.dumps(vllm_request(case, model)).encode(),
        {"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.loads(response.read())
        return {"expected_prompt_tokens": answer["usage"]["prompt_tokens"], "expected_status": 200,
                "expected_error": None}  # fmt: skip
    except urllib.error.HTTPError as error:
        body = json.loads(error.read() or b"{}")
        message = (body.get("error") or {}).get("message", "")
        return {"expected_prompt_tokens": None, "expected_status": error.code, "expected_error": message}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record a media corpus from a running tiny vision vLLM.")
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--family", choices=("qwen2_vl", "gemma3", "llava"), default="qwen2_vl")
    args = parser.parse_args(argv)
    if args.family == "gemma3":
        out, model, cases = GEMMA3_CORPUS, GEMMA3_MODEL, build_gemma3_cases()
    elif args.family == "llava":
        out, model, cases = LLAVA_CORPUS, LLAVA_MODEL, build_llava_cases()
    else:
        out, model, cases = CORPUS, MODEL, build_cases()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        handle.writelines(
            json.dumps({**case, **ask_vllm(args.base_url, case, model)}, sort_keys=True) + "\n" for case in cases
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
