"""Tests for mmrl.data.media: image loading and its errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from mmrl.data.media import ORIG_SIZE_KEY, MediaError, image_size, load_image


def _save(img: Image.Image, path: Path, fmt: str | None = None) -> Path:
    img.save(path, format=fmt)
    return path


@pytest.fixture(autouse=True)
def _strict_truncation(monkeypatch):
    # Another library may have set this globally; our guarantee is for PIL's default.
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", False)


def test_load_png_returns_rgb_with_same_pixels(tmp_path):
    arr = np.arange(4 * 3 * 3, dtype=np.uint8).reshape(3, 4, 3)  # H=3, W=4
    path = _save(Image.fromarray(arr), tmp_path / "a.png")
    img = load_image(path)
    assert img.mode == "RGB" and img.size == (4, 3)
    np.testing.assert_array_equal(np.asarray(img), arr)
    assert load_image(str(path)).size == (4, 3)  # str paths too


def test_rgba_is_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (3, 1))
    rgba.putpixel((0, 0), (10, 20, 30, 255))  # opaque: unchanged
    rgba.putpixel((1, 0), (10, 20, 30, 0))  # transparent: white
    rgba.putpixel((2, 0), (255, 0, 0, 128))  # half: 0*a + 255*(1-a), a = 128/255 -> 127
    img = load_image(_save(rgba, tmp_path / "a.png"))
    px = np.asarray(img).astype(int)
    assert px[0, 0].tolist() == [10, 20, 30]
    assert px[0, 1].tolist() == [255, 255, 255]
    assert px[0, 2, 0] == 255 and abs(px[0, 2, 1] - 127) <= 1 and abs(px[0, 2, 2] - 127) <= 1


def test_grayscale_and_palette_become_rgb(tmp_path):
    gray = Image.new("L", (2, 2), 77)
    assert np.asarray(load_image(_save(gray, tmp_path / "g.png"))).tolist() == [[[77] * 3] * 2] * 2
    pal = Image.new("P", (2, 2), 1)
    pal.putpalette([0, 0, 0, 200, 100, 50])  # index 1 -> (200, 100, 50)
    assert np.asarray(load_image(_save(pal, tmp_path / "p.png")))[0, 0].tolist() == [200, 100, 50]


def test_in_memory_image_is_converted_without_touching_the_original():
    src = Image.new("RGBA", (5, 4), (1, 2, 3, 255))
    out = load_image(src)
    assert out.mode == "RGB" and src.mode == "RGBA" and out is not src
    rgb = Image.new("RGB", (5, 4), (9, 9, 9))
    out2 = load_image(rgb)
    assert out2 is not rgb  # a copy: later edits of the result never change the caller's image
    assert np.asarray(out2).tolist() == np.asarray(rgb).tolist()


def test_missing_file_names_path_and_reason(tmp_path):
    path = tmp_path / "nope.jpg"
    with pytest.raises(MediaError) as err:
        load_image(path)
    assert err.value.path == str(path)
    assert err.value.reason == "file not found"
    assert str(err.value) == f"cannot load image {path}: file not found"
    with pytest.raises(MediaError, match="file not found"):
        image_size(path)


def test_directory_is_refused(tmp_path):
    with pytest.raises(MediaError, match="directory"):
        load_image(tmp_path)


def test_corrupt_bytes_fail(tmp_path):
    path = tmp_path / "bad.jpg"
    path.write_bytes(b"this is not an image at all" * 10)
    with pytest.raises(MediaError, match="not a recognised image format"):
        load_image(path)
    with pytest.raises(MediaError):
        image_size(path)


def test_truncated_file_fails_at_load_but_header_still_reads(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8)
    full = _save(Image.fromarray(arr), tmp_path / "full.png")
    data = full.read_bytes()
    cut = tmp_path / "cut.png"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(MediaError, match="corrupt or truncated"):
        load_image(cut)
    assert image_size(cut) == (64, 64)  # header only: no decode


def test_zero_size_and_unsupported_mode():
    with pytest.raises(MediaError, match="zero-size image"):
        load_image(Image.new("RGB", (0, 5)))
    with pytest.raises(MediaError, match="zero-size image"):
        image_size(Image.new("RGB", (7, 0)))
    with pytest.raises(MediaError, match="unsupported image mode 'I;16'"):
        load_image(Image.new("I;16", (4, 4)))
    with pytest.raises(MediaError, match="unsupported image mode 'F'"):
        load_image(Image.new("F", (4, 4)))


def test_wrong_source_type():
    with pytest.raises(MediaError, match="expected a path or a PIL image, got int"):
        load_image(123)  # type: ignore[arg-type]
    with pytest.raises(MediaError, match="expected a path or a PIL image"):
        image_size(None)  # type: ignore[arg-type]


def test_max_side_shrinks_and_records_original_size(tmp_path):
    path = _save(Image.new("RGB", (400, 200), (5, 5, 5)), tmp_path / "big.png")
    img = load_image(path, max_side=100)
    # longer side 400 -> 100: scale 1/4, so 200 -> 50
    assert img.size == (100, 50)
    assert img.info[ORIG_SIZE_KEY] == (400, 200)
    small = load_image(path, max_side=1000)  # never enlarges
    assert small.size == (400, 200) and ORIG_SIZE_KEY not in small.info
    tall = load_image(Image.new("RGB", (30, 90)), max_side=45)  # 90 -> 45, 30 -> 15
    assert tall.size == (15, 45)
    with pytest.raises(MediaError, match="max_side must be a positive int"):
        load_image(path, max_side=0)


def test_image_size_of_paths_and_images(tmp_path):
    path = _save(Image.new("RGB", (13, 7)), tmp_path / "x.jpg", "JPEG")
    assert image_size(path) == (13, 7)
    assert image_size(Image.new("L", (3, 9))) == (3, 9)
