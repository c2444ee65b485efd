"""Image loading with errors that say which file failed and why.

Every loader here either returns a fully decoded RGB ``PIL.Image.Image`` or raises
:class:`MediaError`; a truncated or corrupt file fails *here*, not later inside a
processor or a collate function.

Frames: the pixel frame of a returned image is the frame of the stored pixels (EXIF
orientation is *not* applied, matching how COCO-style annotations are written). When
``max_side`` shrinks an image, the original size is kept in ``image.info["orig_size"]``
so that boxes given in the original pixel frame can still be converted correctly.
"""

from __future__ import annotations

from pathlib import Path

from PIL import Image

#: Modes that :func:`load_image` converts to RGB. Anything else (e.g. 16-bit "I;16")
#: is refused rather than silently mangled.
SUPPORTED_MODES = frozenset({"1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "RGBa", "CMYK", "YCbCr", "La"})

#: Key in ``Image.info`` holding the (W, H) before ``max_side`` shrank the image.
ORIG_SIZE_KEY = "orig_size"


class MediaError(Exception):
    """An image could not be loaded.

    Attributes:
        path: the file (or a description of an in-memory image) that failed.
        reason: a readable reason, e.g. ``"file not found"``.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot load image {self.path}: {reason}")


def _describe(src: object) -> str:
    """Name used for ``src`` in error messages."""
    if isinstance(src, Image.Image):
        return f"<in-memory {src.mode} image {src.size[0]}x{src.size[1]}>"
    return str(src)


def _open(path: Path) -> Image.Image:
    """Open ``path`` lazily (header only), translating every failure to MediaError."""
    if not path.exists():
        raise MediaError(path, "file not found")
    if path.is_dir():
        raise MediaError(path, "is a directory, not an image file")
    try:
        return Image.open(path)
    except Image.DecompressionBombError as exc:
        raise MediaError(path, f"image too large ({exc})") from exc
    except Image.UnidentifiedImageError as exc:
        raise MediaError(path, "not a recognised image format (corrupt or not an image)") from exc
    except OSError as exc:
        raise MediaError(path, f"cannot read file ({exc})") from exc


def _check_nonempty(img: Image.Image, name: str) -> None:
    if img.size[0] <= 0 or img.size[1] <= 0:
        raise MediaError(name, f"zero-size image ({img.size[0]}x{img.size[1]})")


def _to_rgb(img: Image.Image, name: str) -> Image.Image:
    """Convert a decoded image to RGB; transparent pixels are composited onto white."""
    if img.mode not in SUPPORTED_MODES:
        raise MediaError(name, f"unsupported image mode {img.mode!r} (supported: {', '.join(sorted(SUPPORTED_MODES))})")
    if img.mode == "RGB":
        return img
    has_alpha = img.mode in {"RGBA", "LA", "PA", "RGBa", "La"} or (img.mode == "P" and "transparency" in img.info)
    if has_alpha:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def _shrink(img: Image.Image, max_side: int) -> Image.Image:
    """Downscale so that the longer side is ``max_side`` (aspect kept); never upscale."""
    w, h = img.size
    longest = max(w, h)
    if longest <= max_side:
        return img
    scale = max_side / longest
    new_size = (max(1, round(w * scale)), max(1, round(h * scale)))
    out = img.resize(new_size, Image.Resampling.BICUBIC)
    out.info[ORIG_SIZE_KEY] = (w, h)
    return out


def load_image(src: str | Path | Image.Image, *, max_side: int | None = None) -> Image.Image:
    """Load ``src`` as a fully decoded RGB image.

    Args:
        src: a path, or an in-memory PIL image (converted to RGB; the caller's object is
            not modified).
        max_side: if given, shrink the image so its longer side is at most this many
            pixels (never enlarges). The pre-shrink size is stored in
            ``image.info["orig_size"]``: boxes in the "pixels" frame refer to that size.

    Raises:
        MediaError: missing file, directory, corrupt/truncated bytes, unknown format,
            zero-size image, unsupported mode (e.g. 16-bit), or a bad ``max_side``.
    """
    name = _describe(src)
    if max_side is not None and (not isinstance(max_side, int) or max_side < 1):
        raise MediaError(name, f"max_side must be a positive int, got {max_side!r}")
    if isinstance(src, Image.Image):
        img = src
        _check_nonempty(img, name)
        try:
            img.load()
        except OSError as exc:
            raise MediaError(name, f"cannot decode in-memory image ({exc})") from exc
        rgb = _to_rgb(img, name)
        if rgb is img:
            rgb = img.copy()
    elif isinstance(src, (str, Path)):
        path = Path(src)
        with _open(path) as opened:
            _check_nonempty(opened, name)
            try:
                opened.load()  # full decode: truncated or corrupt data fails here
            except Image.DecompressionBombError as exc:
                raise MediaError(name, f"image too large ({exc})") from exc
            except (OSError, SyntaxError, ValueError) as exc:
                raise MediaError(name, f"corrupt or truncated image data ({exc})") from exc
            rgb = _to_rgb(opened, name)
            if rgb is opened:
                rgb = opened.copy()
    else:
        raise MediaError(name, f"expected a path or a PIL image, got {type(src).__name__}")
    rgb.info.pop(ORIG_SIZE_KEY, None)
    return _shrink(rgb, max_side) if max_side is not None else rgb


def image_size(src: str | Path | Image.Image) -> tuple[int, int]:
    """Return ``(W, H)`` of ``src``; for a path only the header is read.

    Raises:
        MediaError: missing file, unreadable header, or a zero-size image.
    """
    name = _describe(src)
    if isinstance(src, Image.Image):
        _check_nonempty(src, name)
        return int(src.size[0]), int(src.size[1])
    if not isinstance(src, (str, Path)):
        raise MediaError(name, f"expected a path or a PIL image, got {type(src).__name__}")
    with _open(Path(src)) as opened:
        _check_nonempty(opened, name)
        return int(opened.size[0]), int(opened.size[1])
