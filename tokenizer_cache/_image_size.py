"""An image's size as vLLM sees it, read from its header alone.

vLLM 0.32 opens an image with Pillow (`ImageMediaIO.load_bytes`,
vllm/multimodal/media/image.py), rejects more than VLLM_MAX_IMAGE_PIXELS
(default 178,956,970), then applies the EXIF orientation
(`ImageOps.exif_transpose`): orientations 5-8 swap width and height.  Every
processor that follows sees that size.  So this module reads, for PNG, JPEG,
GIF, WebP and BMP, the same header fields Pillow 13 reads, plus the EXIF
orientation wherever Pillow finds one (EXIF first, else an XMP
``tiff:Orientation``):

- PNG: IHDR; eXIf, and tEXt/zTXt/iTXt "Raw profile type exif" and
  "XML:com.adobe.xmp" chunks anywhere in the file (exif_transpose loads the
  image first, which reads the chunks after the pixel data too); a chunk
  that runs past the end of the data is a truncated file Pillow refuses.
- JPEG: the first SOF marker's height and width (SOF0-SOF15 except DHT, JPG,
  DAC); APP1 "Exif" segments (concatenated, as Pillow does) and APP1 XMP.
- GIF: the logical screen, grown to cover the first frame's extent.
- WebP: the VP8/VP8L/VP8X canvas; the EXIF and "XMP " chunks.
- BMP: the DIB header's width and height.

(For Qwen-VL, Gemma 3 and LLaVA-1.5 the token count does not change when
width and height swap; the orientation matters to arithmetic that is not
symmetric, such as Pixtral's rows of patches.)

Work is bounded: the reader only reads headers and chunk/segment lengths and
skips pixel data by offset (`_data_url.Base64Bytes` decodes any byte range on
its own), with caps on how many chunks, segments and metadata bytes it will
look at.  Other formats Pillow opens (TIFF, AVIF, ICO, ...) are reported as
not countable; a recognised format whose header is broken or truncated is
what Pillow refuses too ("cannot identify image file"), a CountError.
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import Protocol

from ._errors import CountError, MediaNotCountable

# vLLM's default VLLM_MAX_IMAGE_PIXELS, equal to Pillow's decompression-bomb
# error threshold (2 x Image.MAX_IMAGE_PIXELS).
MAX_IMAGE_PIXELS = 178_956_970

_MAX_CHUNKS = 200_000  # PNG chunks / JPEG segments / GIF blocks / RIFF chunks walked
_MAX_METADATA_BYTES = 1 << 20  # EXIF / XMP bytes read per image
_CANNOT_IDENTIFY = "Failed to load image: cannot identify image file <_io.BytesIO object>"

_TRANSPOSING = frozenset({5, 6, 7, 8})  # TRANSPOSE, ROTATE_270, TRANSVERSE, ROTATE_90
_XMP_ORIENTATION = re.compile(rb'tiff:Orientation(="|>)([0-9])')


class ByteSource(Protocol):
    @property
    def size(self) -> int: ...

    def read(self, offset: int, count: int) -> bytes: ...


class _Broken(Exception):
    """The header is truncated or malformed where Pillow would refuse it."""


def image_size(source: ByteSource, where: str) -> tuple[int, int]:
    """(width, height) after EXIF orientation.

    Raises CountError when vLLM would refuse the image (not an image Pillow
    can identify), MediaNotCountable for formats this module does not read
    and for images above vLLM's default pixel limit (the operator may raise it).
    """
    kind = _sniff(source.read(0, 32))
    reader = _FORMATS.get(kind) if kind is not None else None
    if reader is None:
        raise MediaNotCountable(
            f"'{where}' holds an image in a format brimful does not read.", reason="image_format", where=where
        )
    try:
        width, height, orientation = reader(source)
    except _Broken:
        raise CountError(_CANNOT_IDENTIFY, param="messages") from None
    if width * height > MAX_IMAGE_PIXELS:
        raise MediaNotCountable(
            f"'{where}' is a {width}x{height} image, more pixels than vLLM accepts by default "
            "(VLLM_MAX_IMAGE_PIXELS).",
            reason="image_format",
            where=where,
        )
    if orientation in _TRANSPOSING:
        return height, width
    return width, height


def _sniff(head: bytes) -> str | None:
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if head.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "gif"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    if head.startswith(b"BM"):
        return "bmp"
    return None


def _exact(source: ByteSource, offset: int, count: int) -> bytes:
    data = source.read(offset, count)
    if len(data) != count:
        raise _Broken
    return data


# ---------------------------------------------------------------------------
# EXIF / XMP orientation (Pillow's Image.getexif and Exif.load)
# ---------------------------------------------------------------------------

def _exif_orientation(exif: bytes) -> int | None:
    """IFD0's Orientation tag (274) from EXIF data, or None if absent or unreadable.

    Pillow strips a leading "Exif\\0\\0", reads the TIFF header and IFD0; a
    value with a count other than 1 is a tuple, which exif_transpose ignores.
    """
    if exif.startswith(b"Exif\x00\x00"):
        exif = exif[6:]
    if exif[:4] == b"II*\x00":
        order = "<"
    elif exif[:4] == b"MM\x00*":
        order = ">"
    else:
        return None
    try:
        (ifd,) = struct.unpack_from(order + "L", exif, 4)
        (entries,) = struct.unpack_from(order + "H", exif, ifd)
        for index in range(entries):
            tag, kind, count = struct.unpack_from(order + "HHL", exif, ifd + 2 + 12 * index)
            if tag != 274:
                continue
            if count != 1:
                return None
            value_at = ifd + 2 + 12 * index + 8
            if kind == 3:  # SHORT
                return int(struct.unpack_from(order + "H", exif, value_at)[0])
            if kind == 4:  # LONG
                return int(struct.unpack_from(order + "L", exif, value_at)[0])
            if kind == 1:  # BYTE
                return int(exif[value_at])
            return None
    except (struct.error, IndexError):
        return None
    return None


def _orientation(exif: bytes | None, xmp: bytes | None) -> int:
    """EXIF's orientation if it has the tag, else the first XMP tiff:Orientation, else 1."""
    if exif:
        value = _exif_orientation(exif)
        if value is not None:
            return value
    if xmp:
        match = _XMP_ORIENTATION.search(xmp)
        if match:
            return int(match[2])
    return 1


# ---------------------------------------------------------------------------
# Formats: each returns (width, height, orientation)
# ---------------------------------------------------------------------------

def _png(source: ByteSource) -> tuple[int, int, int]:
    header = _exact(source, 8, 25)
    length, kind = struct.unpack(">L4s", header[:8])
    if kind != b"IHDR" or length < 13:
        raise _Broken
    width, height = struct.unpack(">LL", header[8:16])
    exif: bytes | None = None
    raw_profile: bytes | None = None
    xmp: bytes | None = None
    offset, budget, seen_data = 8, _MAX_METADATA_BYTES, False
    for _ in range(_MAX_CHUNKS):
        chunk = source.read(offset, 8)
        if len(chunk) < 8:
            if not seen_data:
                raise _Broken  # Pillow's open reads chunks up to IDAT
            break  # no IEND: Pillow stops reading there
        length, kind = struct.unpack(">L4s", chunk)
        if kind == b"IEND":
            break
        if offset + 12 + length > source.size:
            raise _Broken  # a chunk cut short: open or load fails with "truncated"
        seen_data = seen_data or kind == b"IDAT"
        if kind in (b"eXIf", b"tEXt", b"zTXt", b"iTXt") and length <= budget:
            budget -= length
            data = source.read(offset + 8, length)
            if kind == b"eXIf":
                exif = b"Exif\x00\x00" + data
            else:
                keyword, text = _png_text(kind, data)
                if keyword == b"Raw profile type exif" and text is not None:
                    raw_profile = text
                elif keyword == b"XML:com.adobe.xmp" and text is not None:
                    xmp = text
        offset += 12 + length
    else:
        raise MediaNotCountable("The PNG has too many chunks to walk.", reason="image_format")
    if exif is None and raw_profile is not None:
        exif = _raw_profile_exif(raw_profile)
    return width, height, _orientation(exif, xmp)


def _png_text(kind: bytes, data: bytes) -> tuple[bytes, bytes | None]:
    """(keyword, text) of a tEXt, zTXt or iTXt chunk; text None when unreadable."""
    keyword, _, rest = data.partition(b"\x00")
    try:
        if kind == b"tEXt":
            return keyword, rest
        if kind == b"zTXt":
            return keyword, zlib.decompressobj().decompress(rest[1:], _MAX_METADATA_BYTES)
        compressed, _method = rest[0], rest[1]
        _language, _, rest = rest[2:].partition(b"\x00")
        _translated, _, text = rest.partition(b"\x00")
        if compressed:
            text = zlib.decompressobj().decompress(text, _MAX_METADATA_BYTES)
        return keyword, text
    except (IndexError, zlib.error):
        return keyword, None


def _raw_profile_exif(text: bytes) -> bytes | None:
    """ImageMagick's hex "Raw profile type exif": Pillow drops the first three lines."""
    try:
        return bytes.fromhex("".join(text.decode("latin-1").split("\n")[3:]))
    except ValueError:
        return None


# Markers Pillow's JPEG plugin knows (JpegImagePlugin.MARKER): SOF handlers
# (including DHP), markers without a length, and the rest, which carry one.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC} | {0xDE}
_NO_LENGTH = frozenset({0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)})


def _jpeg(source: ByteSource) -> tuple[int, int, int]:
    """Pillow's `JpegImageFile._open`: markers up to SOS; the last SOF sets the size."""
    size: tuple[int, int] | None = None
    exif = b""
    xmp: bytes | None = None
    offset, budget = 2, _MAX_METADATA_BYTES
    for _ in range(_MAX_CHUNKS):
        pair = source.read(offset, 2)
        if len(pair) < 2:
            break
        if pair[0] != 0xFF:
            offset += 1  # junk between markers, skipped a byte at a time
            continue
        code = pair[1]
        if code == 0xFF:
            offset += 1  # fill byte
            continue
        if code == 0x00:
            offset += 2  # an escaped 0xFF
            continue
        if code < 0xC0:
            raise _Broken  # "no marker found"
        if code in _NO_LENGTH:
            offset += 2
            continue
        (length,) = struct.unpack(">H", _exact(source, offset + 2, 2))
        if length < 2:
            raise _Broken
        if code == 0xDA:  # SOS: the header ends here
            break
        if code in _SOF:
            if length < 8:
                raise _Broken
            segment = _exact(source, offset + 4, 6)
            if segment[0] != 8 or segment[5] not in (1, 3, 4):
                raise _Broken  # "cannot handle N-bit layers" / "cannot handle N-layer images"
            height, width = struct.unpack(">HH", segment[1:5])
            size = width, height
        elif code == 0xE1 and length - 2 <= budget:
            budget -= length - 2
            data = _exact(source, offset + 4, length - 2)
            if data.startswith(b"Exif\x00\x00"):
                exif = data if not exif else exif + data[6:]
            elif data.startswith(b"http://ns.adobe.com/xap/1.0/\x00"):
                xmp = data.split(b"\x00", 1)[1]
        elif source.size < offset + 2 + length:
            raise _Broken  # a segment cut short
        offset += 2 + length
    else:
        raise MediaNotCountable("The JPEG has too many segments before its scan.", reason="image_format")
    if size is None:
        raise _Broken
    return size[0], size[1], _orientation(exif or None, xmp)


def _gif(source: ByteSource) -> tuple[int, int, int]:
    screen = _exact(source, 0, 13)
    width, height = struct.unpack("<HH", screen[6:10])
    offset = 13
    if screen[10] & 0x80:
        offset += 3 << ((screen[10] & 7) + 1)
    for _ in range(_MAX_CHUNKS):
        introducer = source.read(offset, 1)
        if introducer in (b"", b";"):
            raise _Broken  # no image at all: Pillow raises "no more images in GIF file"
        if introducer == b"!":
            offset += 2
            offset = _skip_sub_blocks(source, offset)
            continue
        if introducer == b",":
            descriptor = _exact(source, offset + 1, 9)
            x0, y0, frame_width, frame_height = struct.unpack("<HHHH", descriptor[:8])
            return max(width, x0 + frame_width), max(height, y0 + frame_height), 1
        offset += 1  # Pillow ignores other bytes between blocks
    raise MediaNotCountable("The GIF has too many blocks before its first image.", reason="image_format")


def _skip_sub_blocks(source: ByteSource, offset: int) -> int:
    for _ in range(_MAX_CHUNKS):
        size = source.read(offset, 1)
        if not size:
            raise _Broken
        offset += 1 + size[0]
        if size[0] == 0:
            return offset
    raise MediaNotCountable("The GIF has too many data sub-blocks.", reason="image_format")


def _webp(source: ByteSource) -> tuple[int, int, int]:
    head = source.read(0, 30)
    kind = head[12:16]
    if kind == b"VP8 ":
        if len(head) < 30 or head[23:26] != b"\x9d\x01\x2a":
            raise _Broken
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF, 1
    if kind == b"VP8L":
        if len(head) < 25 or head[20] != 0x2F:
            raise _Broken
        (bits,) = struct.unpack("<L", head[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, 1
    if kind != b"VP8X" or len(head) < 30:
        raise _Broken
    width = int.from_bytes(head[24:27], "little") + 1
    height = int.from_bytes(head[27:30], "little") + 1
    exif: bytes | None = None
    xmp: bytes | None = None
    offset, budget = 12, _MAX_METADATA_BYTES
    for _ in range(_MAX_CHUNKS):
        chunk = source.read(offset, 8)
        if len(chunk) < 8:
            break
        name, length = chunk[:4], struct.unpack("<L", chunk[4:])[0]
        if ((name == b"EXIF" and exif is None) or (name == b"XMP " and xmp is None)) and length <= budget:
            budget -= length  # libwebp's mux hands Pillow the first chunk of each kind
            data = source.read(offset + 8, length)
            if name == b"EXIF":
                exif = data
            else:
                xmp = data
        offset += 8 + length + (length & 1)
    return width, height, _orientation(exif, xmp)


def _bmp(source: ByteSource) -> tuple[int, int, int]:
    header = source.read(14, 16)
    if len(header) < 4:
        raise _Broken
    (header_size,) = struct.unpack("<L", header[:4])
    if header_size == 12:
        if len(header) < 8:
            raise _Broken
        width, height = struct.unpack("<HH", header[4:8])
        return width, height, 1
    if header_size in (40, 52, 56, 64, 108, 124):
        if len(header) < 12:
            raise _Broken
        width, height = struct.unpack("<LL", header[4:12])
        if header[11] == 0xFF:  # negative height: a top-down bitmap
            height = 2**32 - height
        return width, height, 1
    raise _Broken


_FORMATS = {"png": _png, "jpeg": _jpeg, "gif": _gif, "webp": _webp, "bmp": _bmp}
