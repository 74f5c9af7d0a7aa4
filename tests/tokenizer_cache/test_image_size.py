"""Image sizes read from headers agree with what vLLM's loader (Pillow 13) sees.

The reference is vLLM 0.32's own path: `Image.open(..., formats=...)` then
`ImageOps.exif_transpose` (vllm/multimodal/image.py `open_image`,
`normalize_image`).  Images are generated here with Pillow in many formats,
sizes, orientations and metadata layouts, and a few are built by hand where
Pillow cannot write the layout (a GIF frame larger than its screen, EXIF after
the pixel data, junk between JPEG markers).
"""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from PIL import Image, ImageOps

from tokenizer_cache import CountError, MediaNotCountable
from tokenizer_cache._data_url import Base64Bytes, open_media_url
from tokenizer_cache._image_size import image_size


def vllm_size(data: bytes) -> tuple[int, int]:
    image = Image.open(io.BytesIO(data))
    return ImageOps.exif_transpose(image).size


def header_size(data: bytes) -> tuple[int, int]:
    return image_size(Base64Bytes(base64.b64encode(data).decode()), "messages[0].content[0]")


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def exif_with_orientation(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    exif[0x010F] = "brimful"  # Make: a second IFD0 entry before/after the orientation
    return exif


SIZES = [(1, 1), (3, 200), (640, 480), (481, 1023), (1920, 1080), (28, 28), (4000, 30)]


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize(
    "fmt,params",
    [
        ("PNG", {}),
        ("JPEG", {"quality": 50}),
        ("JPEG", {"progressive": True}),
        ("GIF", {}),
        ("WEBP", {"lossless": True}),
        ("WEBP", {"quality": 40}),
        ("BMP", {}),
    ],
    ids=["png", "jpeg", "jpeg-progressive", "gif", "webp-lossless", "webp-lossy", "bmp"],
)
def test_plain_images(fmt: str, params: dict, size: tuple[int, int]):
    if fmt == "WEBP" and max(size) > 16383:
        pytest.skip("beyond WebP's limit")
    data = encode(Image.new("RGB", size, (200, 30, 90)), fmt, **params)
    assert header_size(data) == vllm_size(data) == size


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_exif_orientation_swaps_the_sides_like_exif_transpose(fmt: str, orientation: int):
    data = encode(Image.new("RGB", (300, 120)), fmt, exif=exif_with_orientation(orientation))
    expected = vllm_size(data)
    assert header_size(data) == expected
    assert expected == ((120, 300) if orientation >= 5 else (300, 120))


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_xmp_orientation_counts_when_exif_has_none(fmt: str):
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    if fmt == "PNG":
        from PIL import PngImagePlugin

        info = PngImagePlugin.PngInfo()
        info.add_itxt("XML:com.adobe.xmp", xmp.decode())
        data = encode(Image.new("RGB", (50, 20)), fmt, pnginfo=info)
    else:
        data = encode(Image.new("RGB", (50, 20)), fmt, xmp=xmp)
    assert header_size(data) == vllm_size(data) == (20, 50)


def test_exif_orientation_wins_over_xmp():
    xmp = b'<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>'
    data = encode(Image.new("RGB", (50, 20)), "JPEG", exif=exif_with_orientation(1), xmp=xmp)
    assert header_size(data) == vllm_size(data) == (50, 20)


def png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">L", len(payload)) + kind + payload + struct.pack(">L", zlib.crc32(kind + payload))


def test_png_exif_after_the_pixel_data_still_rotates():
    """exif_transpose loads the image first, and loading reads the chunks after IDAT."""
    plain = encode(Image.new("RGB", (40, 10)), "PNG")
    exif = exif_with_orientation(8).tobytes()[6:]  # eXIf holds the TIFF data without "Exif\0\0"
    iend = plain.rindex(b"IEND") - 4
    data = plain[:iend] + png_chunk(b"eXIf", exif) + plain[iend:]
    assert header_size(data) == vllm_size(data) == (10, 40)


def test_png_raw_profile_exif_text_chunk():
    exif = exif_with_orientation(6).tobytes()
    text = f"\nexif\n{len(exif):8}\n{exif.hex()}\n".encode()
    plain = encode(Image.new("RGB", (40, 10)), "PNG")
    at = plain.index(b"IDAT") - 4
    data = plain[:at] + png_chunk(b"zTXt", b"Raw profile type exif\x00\x00" + zlib.compress(text)) + plain[at:]
    assert header_size(data) == vllm_size(data) == (10, 40)


def test_jpeg_with_junk_fill_bytes_and_a_big_app_segment():
    plain = encode(Image.new("RGB", (77, 33)), "JPEG")
    app2 = b"\xff\xe2" + struct.pack(">H", 60002) + b"\x00" * 60000
    data = plain[:2] + b"\xff\xff" + app2 + b"junk" + plain[2:]
    assert header_size(data) == vllm_size(data) == (77, 33)


def test_jpeg_exif_after_the_frame_header_counts():
    """Pillow reads every marker up to SOS, so an APP1 after SOF still rotates."""
    plain = encode(Image.new("RGB", (77, 33)), "JPEG")
    sos = plain.index(b"\xff\xda")
    exif = b"Exif\x00\x00" + exif_with_orientation(6).tobytes()[6:]
    app1 = b"\xff\xe1" + struct.pack(">H", len(exif) + 2) + exif
    data = plain[:sos] + app1 + plain[sos:]
    assert header_size(data) == vllm_size(data) == (33, 77)


def test_gif_screen_grows_to_the_first_frame():
    data = bytearray(encode(Image.new("P", (30, 40), 1), "GIF"))
    descriptor = data.index(b"," + struct.pack("<HHHH", 0, 0, 30, 40))
    struct.pack_into("<HH", data, 6, 10, 10)  # logical screen smaller than the frame
    struct.pack_into("<HH", data, descriptor + 1, 5, 2)  # frame offset inside the screen
    assert header_size(bytes(data)) == vllm_size(bytes(data)) == (35, 42)


def test_animated_gif_uses_the_first_frame():
    frames = [Image.new("P", (64, 32), i) for i in range(3)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    data = buffer.getvalue()
    assert header_size(data) == vllm_size(data) == (64, 32)


def test_animated_webp_uses_the_canvas():
    frames = [Image.new("RGB", (90, 45), (i * 40, 0, 0)) for i in range(3)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "WEBP", save_all=True, append_images=frames[1:], duration=50)
    data = buffer.getvalue()
    assert header_size(data) == vllm_size(data) == (90, 45)


def test_top_down_bmp():
    data = bytearray(encode(Image.new("RGB", (12, 7)), "BMP"))
    (height,) = struct.unpack_from("<l", data, 22)
    struct.pack_into("<l", data, 22, -height)
    assert header_size(bytes(data)) == vllm_size(bytes(data)) == (12, 7)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "BMP"])
def test_a_truncated_header_is_what_pillow_refuses(fmt: str):
    data = encode(Image.new("RGB", (64, 64)), fmt)[:12]
    with pytest.raises(OSError):
        vllm_size(data)
    with pytest.raises(CountError, match="cannot identify image file"):
        header_size(data)


def test_12_bit_jpeg_is_refused_like_pillow():
    data = bytearray(encode(Image.new("RGB", (64, 64)), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 4] = 12
    with pytest.raises(OSError):
        vllm_size(bytes(data))
    with pytest.raises(CountError):
        header_size(bytes(data))


@pytest.mark.parametrize("fmt", ["TIFF", "ICO", "PPM", "QOI"])
def test_formats_pillow_opens_but_brimful_does_not_read_are_not_countable(fmt: str):
    data = encode(Image.new("RGB", (32, 32)), fmt)
    assert vllm_size(data) == (32, 32)
    with pytest.raises(MediaNotCountable) as caught:
        header_size(data)
    assert caught.value.reason == "image_format"


def test_bytes_that_are_no_image_are_not_countable():
    """Not a CountError: brimful cannot rule out every format Pillow opens."""
    with pytest.raises(MediaNotCountable):
        header_size(b"definitely not an image, just text")


def test_more_pixels_than_vllm_allows_by_default_is_not_countable():
    data = bytearray(encode(Image.new("RGB", (8, 8)), "PNG"))
    struct.pack_into(">LL", data, 16, 20000, 20000)  # IHDR width/height: 400 M pixels
    with pytest.raises(MediaNotCountable):
        header_size(bytes(data))


# ---------------------------------------------------------------------------
# Data URLs and base64 random access
# ---------------------------------------------------------------------------

def test_base64_random_access_matches_a_full_decode():
    raw = bytes(range(256)) * 7 + b"tail"
    source = Base64Bytes(base64.b64encode(raw).decode())
    assert source.size == len(raw)
    for offset in (0, 1, 2, 3, 100, 1790, len(raw) - 1, len(raw)):
        for count in (1, 2, 3, 4, 17, 5000):
            assert source.read(offset, count) == raw[offset : offset + count]


def test_reading_an_image_decodes_only_its_header():
    """A 40 MB payload with a bad character past the header: only the header is decoded."""
    data = encode(Image.new("RGB", (123, 45)), "JPEG")
    after_scan = (data.index(b"\xff\xda") + 600) // 3 * 4
    text = base64.b64encode(data).decode()
    huge = text[:after_scan] + "A" * 40_000_000 + "!AAA" + text[after_scan:]
    assert image_size(Base64Bytes(huge), "x") == (123, 45)


@pytest.mark.parametrize(
    "url,message",
    [
        ("data:image/png;base64iVBORw0KGgo", "missing ',' separator"),
        ("data:image/png;base64,abc", "Non-base64 digit found"),
        ("data:image/png;base64,iV!ORw0KGgo=", "Non-base64 digit found"),
        ("ftp://example.com/a.png", "The URL must be either a HTTP, data or file URL."),
    ],
)
def test_urls_vllm_refuses_with_400(url: str, message: str):
    with pytest.raises(CountError, match=message):
        source = open_media_url(url, "messages[0].content[0]")
        image_size(source, "messages[0].content[0]")


@pytest.mark.parametrize(
    "url,reason",
    [
        ("https://example.com/a.png", "remote_url"),
        ("HTTP://example.com/a.png", "remote_url"),
        ("file:///tmp/a.png", "remote_url"),
        ("data:image/png,rawbytes", "image_format"),  # vLLM: 501 Only base64 data URLs
        ("data:image/png;BASE64,AAAA", "image_format"),
    ],
)
def test_urls_brimful_does_not_read(url: str, reason: str):
    with pytest.raises(MediaNotCountable) as caught:
        open_media_url(url, "messages[0].content[0]")
    assert caught.value.reason == reason
    assert "example.com" not in caught.value.message


def test_data_url_prefix_is_case_insensitive_and_media_type_free():
    data = encode(Image.new("RGB", (9, 4)), "PNG")
    url = "DATA:;base64," + base64.b64encode(data).decode()
    assert image_size(open_media_url(url, "x"), "x") == (9, 4)
