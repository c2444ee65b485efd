"""Synthetic grounding scenes: the embedded default data set (no download), deterministic by seed.

Each scene is a small RGB image (plain or lightly noisy light background) with up to
``max_objects`` non-overlapping coloured shapes in two clearly different sizes, and one
referring expression whose target set is unambiguous:

============  ===============================================  =========================
kind          expression                                       target set
============  ===============================================  =========================
``attr``      "the red circle"                                 the only red circle
``size``      "the small blue square"                          one of two blue squares
``relation``  "the green triangle left of the red circle"      one of two green triangles
``multi``     "all yellow squares"                             every yellow square (>= 2)
``negative``  "the red circle" / "the small red circle"        nothing (``boxes`` empty)
============  ===============================================  =========================

Relations use the drawn (tight) boxes: A is *left of* B when ``A.x2 <= B.x1`` (*right of*:
``A.x1 >= B.x2``; *above*: ``A.y2 <= B.y1``; *below*: ``A.y1 >= B.y2``). In a relation
scene the other object matching the target's description lies on the far side of the
anchor's centre, so the phrase is unambiguous under a loose reading of "left of" too.

Boxes are tight boxes of the drawn pixels in continuous pixel coordinates of the image
("pixels" frame): pixel column ``i`` covers ``[i, i + 1)``, so a shape whose leftmost and
rightmost pixels are columns 10 and 29 has ``x1 = 10, x2 = 30``. Shape pixels have exactly
the palette colour (no anti-aliasing); background channels never go below 190, and each
palette colour has a channel below 60, so the two can never be confused.

Each sample's ``extra`` holds ``kind``, the structured ``query`` and every ``object`` (colour,
shape, size, bbox) so that tests and evaluations can check the semantics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageChops, ImageDraw

from mmrl.adapters.grounding.data import GroundingSample

#: RGB of each colour name usable in ``colors``.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 200, 20),
    "purple": (140, 50, 180),
    "orange": (245, 130, 20),
    "cyan": (20, 190, 200),
    "black": (20, 20, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
SIZE_CLASSES: tuple[str, ...] = ("small", "large")

#: Side of an object's square footprint as a fraction of the image's shorter side.
_SIDE_FRACTION = {"small": (0.06, 0.08), "large": (0.17, 0.22)}
#: Weights of the single-target kinds (renormalised over those ``max_objects`` allows).
_SINGLE_KIND_WEIGHTS = {"attr": 0.4, "size": 0.3, "relation": 0.3}
_SINGLE_KIND_MIN_OBJECTS = {"attr": 1, "size": 2, "relation": 3}
#: Probability that a negative scene asks for the wrong size of a present object.
_P_SIZE_NEGATIVE = 0.3
_MIN_SIDE = 96
_EDGE = 2  # empty pixels between an object's footprint and the image border
_GAP = 4  # empty pixels between two footprints
_NOISE = 6  # +- amplitude of background noise in noisy scenes
_PLACE_TRIES = 60
_SCENE_TRIES = 100


@dataclass
class _Obj:
    color: str
    shape: str
    size: str
    side: int
    x: int = 0
    y: int = 0
    box: tuple[int, int, int, int] = (0, 0, 0, 0)  # tight xyxy, exclusive right/bottom

    @property
    def label(self) -> str:
        return f"{self.size} {self.color} {self.shape}"

    @property
    def center(self) -> tuple[float, float]:
        x1, y1, x2, y2 = self.box
        return (x1 + x2) / 2, (y1 + y2) / 2


class _MaskCache:
    """Shape masks by ``(shape, side)``: an "L" image and its tight box within the footprint."""

    def __init__(self) -> None:
        self._masks: dict[tuple[str, int], tuple[Image.Image, tuple[int, int, int, int]]] = {}

    def get(self, shape: str, side: int) -> tuple[Image.Image, tuple[int, int, int, int]]:
        key = (shape, side)
        if key not in self._masks:
            mask = Image.new("L", (side, side), 0)
            draw = ImageDraw.Draw(mask)
            last = side - 1
            if shape == "circle":
                draw.ellipse((0, 0, last, last), fill=255)
            elif shape == "square":
                draw.rectangle((0, 0, last, last), fill=255)
            elif shape == "triangle":
                draw.polygon([(last / 2, 0), (last, last), (0, last)], fill=255)
            else:  # pragma: no cover - shapes are validated up front
                raise ValueError(f"unknown shape {shape!r}")
            bbox = mask.getbbox()
            assert bbox is not None
            self._masks[key] = (mask, bbox)
        return self._masks[key]


def satisfies_relation(a: Sequence[float], b: Sequence[float], relation: str) -> bool:
    """Whether box ``a`` (xyxy) is ``relation`` box ``b``: left of / right of / above / below."""
    if relation == "left of":
        return a[2] <= b[0]
    if relation == "right of":
        return a[0] >= b[2]
    if relation == "above":
        return a[3] <= b[1]
    if relation == "below":
        return a[1] >= b[3]
    raise ValueError(f"unknown relation {relation!r}; expected one of {', '.join(RELATIONS)}")


def _far_side(obj: _Obj, anchor: _Obj, relation: str) -> bool:
    """``obj``'s centre lies on the side of ``anchor``'s centre opposite to ``relation``."""
    (ox, oy), (ax, ay) = obj.center, anchor.center
    return {"left of": ox > ax, "right of": ox < ax, "above": oy > ay, "below": oy < ay}[relation]


def _plural(shape: str) -> str:
    return shape + "es" if shape.endswith(("s", "x", "ch", "sh")) else shape + "s"


def _resolve(query: dict, objects: list[_Obj]) -> list[int]:
    """Indices of the objects ``query`` refers to (the generator's own consistency check)."""

    def matches(o: _Obj, desc: dict) -> bool:
        return o.color == desc["color"] and o.shape == desc["shape"] and desc.get("size") in (None, o.size)

    hits = [i for i, o in enumerate(objects) if matches(o, query)]
    if query.get("relation"):
        anchors = [o for o in objects if matches(o, query["anchor"])]
        if len(anchors) != 1:
            return [-1]  # an ambiguous anchor is never allowed
        hits = [i for i in hits if satisfies_relation(objects[i].box, anchors[0].box, query["relation"])]
    return hits


class _SceneBuilder:
    """Builds one scene from a generator; every random draw comes from ``rng``."""

    def __init__(
        self,
        rng: np.random.Generator,
        size: tuple[int, int],
        colors,
        shapes,
        masks: _MaskCache,
        position_cue: float = 0.0,
        object_scale: float = 1.0,
    ) -> None:
        self.rng = rng
        self.position_cue = position_cue
        self.object_scale = object_scale
        self.w, self.h = size
        self.colors = list(colors)
        self.shapes = list(shapes)
        self.masks = masks
        self.combos = [(c, s) for c in self.colors for s in self.shapes]

    # -- random choices -------------------------------------------------------------------
    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def side(self, size: str) -> int:
        lo, hi = (f * self.object_scale for f in _SIDE_FRACTION[size])
        return max(3, int(round(self.rng.uniform(lo, hi) * min(self.w, self.h))))

    def obj(self, color: str, shape: str, size: str | None = None) -> _Obj:
        size = size if size is not None else self.pick(SIZE_CLASSES)
        return _Obj(color, shape, size, self.side(size))

    def distractors(self, n: int, exclude: set[tuple[str, str]]) -> list[_Obj]:
        allowed = [c for c in self.combos if c not in exclude]
        return [self.obj(*self.pick(allowed)) for _ in range(n)] if allowed else []

    # -- placement -------------------------------------------------------------------------
    def place(self, obj: _Obj, placed: list[_Obj], ok=lambda o: True) -> bool:
        """Put ``obj`` at a random free spot that satisfies ``ok``; False if none found."""
        _, (l, t, r, b) = self.masks.get(obj.shape, obj.side)  # noqa: E741 - left, top, right, bottom
        hi_x, hi_y = self.w - _EDGE - obj.side, self.h - _EDGE - obj.side
        if hi_x < _EDGE or hi_y < _EDGE:
            return False
        for _ in range(_PLACE_TRIES):
            x = int(self.rng.integers(_EDGE, hi_x + 1))
            y = int(self.rng.integers(_EDGE, hi_y + 1))
            free = all(
                x + obj.side + _GAP <= p.x
                or p.x + p.side + _GAP <= x
                or y + obj.side + _GAP <= p.y
                or p.y + p.side + _GAP <= y
                for p in placed
            )
            if not free:
                continue
            obj.x, obj.y, obj.box = x, y, (x + l, y + t, x + r, y + b)
            if ok(obj):
                placed.append(obj)
                return True
        return False

    # -- scene kinds -------------------------------------------------------------------------
    def n_objects(self, required: int, max_objects: int) -> int:
        return int(self.rng.integers(required, max_objects + 1))

    def build(self, kind: str, max_objects: int) -> tuple[list[_Obj], dict] | None:
        """Objects and query for ``kind``, or None when placement failed (caller retries)."""
        placed: list[_Obj] = []
        if kind == "negative":
            color, shape = self.pick(self.combos)
            query = {"color": color, "shape": shape, "size": None}
            n = self.n_objects(1, max_objects)
            if self.rng.random() < _P_SIZE_NEGATIVE:
                asked = self.pick(SIZE_CLASSES)
                present = "large" if asked == "small" else "small"
                query["size"] = asked
                main = [self.obj(color, shape, present)]
                others = self.distractors(n - 1, {(color, shape)})
            else:
                main, others = [], self.distractors(n, {(color, shape)})
            objs = main + others
        elif kind == "multi":
            color, shape = self.pick(self.combos)
            m = int(self.rng.integers(2, min(3, max_objects) + 1))
            n = self.n_objects(m, max_objects)
            objs = [self.obj(color, shape) for _ in range(m)] + self.distractors(n - m, {(color, shape)})
            query = {"color": color, "shape": shape, "size": None, "all": True}
        elif kind == "attr":
            color, shape = self.pick(self.combos)
            n = self.n_objects(1, max_objects)
            objs = [self.obj(color, shape)] + self.distractors(n - 1, {(color, shape)})
            query = {"color": color, "shape": shape, "size": None}
        elif kind == "size":
            color, shape = self.pick(self.combos)
            size = self.pick(SIZE_CLASSES)
            other = "large" if size == "small" else "small"
            n = self.n_objects(2, max_objects)
            objs = [self.obj(color, shape, size), self.obj(color, shape, other)]
            objs += self.distractors(n - 2, {(color, shape)})
            query = {"color": color, "shape": shape, "size": size}
        elif kind == "relation":
            return self.build_relation(max_objects)
        else:  # pragma: no cover
            raise ValueError(kind)
        for o in objs:
            if not self.place(o, placed):
                return None
        return placed, query

    def build_relation(self, max_objects: int) -> tuple[list[_Obj], dict] | None:
        (color, shape), (a_color, a_shape) = (
            self.combos[i] for i in self.rng.choice(len(self.combos), 2, replace=False)
        )
        relation = self.pick(RELATIONS)
        anchor, target, twin = self.obj(a_color, a_shape), self.obj(color, shape), self.obj(color, shape)
        placed: list[_Obj] = []
        if not self.place(anchor, placed):
            return None
        if not self.place(target, placed, lambda o: satisfies_relation(o.box, anchor.box, relation)):
            return None
        if not self.place(twin, placed, lambda o: _far_side(o, anchor, relation)):
            return None
        n = self.n_objects(3, max_objects)
        for o in self.distractors(n - 3, {(color, shape), (a_color, a_shape)}):
            if not self.place(o, placed):
                return None
        query = {
            "color": color,
            "shape": shape,
            "size": None,
            "relation": relation,
            "anchor": {"color": a_color, "shape": a_shape, "size": None},
        }
        return placed, query

    # -- rendering -------------------------------------------------------------------------
    def render(self, objects: list[_Obj]) -> Image.Image:
        grey = int(self.rng.integers(205, 246))
        base = tuple(grey + int(t) for t in self.rng.integers(-8, 9, size=3))
        if self.position_cue > 0:
            img = _position_cue_background(self.w, self.h, self.position_cue)
        elif self.rng.random() < 0.5:
            img = Image.new("RGB", (self.w, self.h), base)
        else:  # grey-level noise in [-_NOISE, _NOISE] added to every channel
            noise = self.rng.integers(0, 2 * _NOISE + 1, size=(self.h, self.w), dtype=np.uint8)
            low = Image.new("RGB", (self.w, self.h), tuple(c - _NOISE for c in base))
            img = ImageChops.add(low, Image.fromarray(noise).convert("RGB"))
        for o in objects:
            mask, _ = self.masks.get(o.shape, o.side)
            img.paste(PALETTE[o.color], (o.x, o.y, o.x + o.side, o.y + o.side), mask)
        return img


def _position_cue_background(w: int, h: int, strength: float) -> Image.Image:
    """A light background whose red channel grows left to right and green channel top to bottom.

    Tiny models built from scratch have no absolute position signal (rotary embeddings are
    relative), so on plain backgrounds they cannot learn *where* an object is within minutes. The
    gradient gives each image patch a readable position; channels stay within [190, 250], so they
    are never confused with the palette colours (each has a channel below 60).
    """
    amp = 30.0 * min(1.0, strength)
    xs = np.linspace(-1.0, 1.0, w, dtype=np.float32)[None, :]
    ys = np.linspace(-1.0, 1.0, h, dtype=np.float32)[:, None]
    arr = np.empty((h, w, 3), dtype=np.float32)
    arr[..., 0] = 220.0 + amp * xs
    arr[..., 1] = 220.0 + amp * ys
    arr[..., 2] = 220.0
    return Image.fromarray(np.clip(arr, 190, 250).round().astype(np.uint8), "RGB")


def expression(query: dict) -> str:
    """The referring expression of a structured query (see the module docstring)."""
    size = f"{query['size']} " if query.get("size") else ""
    if query.get("all"):
        return f"all {size}{query['color']} {_plural(query['shape'])}"
    text = f"the {size}{query['color']} {query['shape']}"
    if query.get("relation"):
        a = query["anchor"]
        text += f" {query['relation']} the {a['color']} {a['shape']}"
    return text


def _validate(n, seed, sizes, colors, shapes, max_objects, p_multi, p_negative) -> None:
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    if not sizes:
        raise ValueError("sizes must list at least one (W, H)")
    for s in sizes:
        if len(s) != 2 or min(s) < _MIN_SIDE or any(int(v) != v for v in s):
            raise ValueError(f"each size must be (W, H) integers >= {_MIN_SIDE}, got {s!r}")
    unknown = [c for c in colors if c not in PALETTE]
    if unknown or not colors or len(set(colors)) != len(colors):
        raise ValueError(f"colors must be distinct names from {', '.join(PALETTE)}; got {list(colors)}")
    bad = [s for s in shapes if s not in SHAPES]
    if bad or not shapes or len(set(shapes)) != len(shapes):
        raise ValueError(f"shapes must be distinct names from {', '.join(SHAPES)}; got {list(shapes)}")
    if len(colors) * len(shapes) < 2:
        raise ValueError("need at least two colour-shape combinations (for negatives and relations)")
    if not isinstance(max_objects, (int, np.integer)) or max_objects < 1:
        raise ValueError(f"max_objects must be a positive int, got {max_objects!r}")
    for name, p in (("p_multi", p_multi), ("p_negative", p_negative)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {p}")
    if p_multi + p_negative > 1.0:
        raise ValueError(f"p_multi + p_negative must be <= 1, got {p_multi + p_negative}")
    if p_multi > 0 and max_objects < 2:
        raise ValueError("multi-target scenes (p_multi > 0) need max_objects >= 2")


def _single_kind(rng: np.random.Generator, max_objects: int) -> str:
    kinds = [k for k, m in _SINGLE_KIND_MIN_OBJECTS.items() if m <= max_objects]
    weights = np.array([_SINGLE_KIND_WEIGHTS[k] for k in kinds])
    return kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]


def generate_scenes(
    n: int,
    *,
    seed: int,
    sizes: Sequence[tuple[int, int]] = ((224, 224), (256, 192), (192, 256)),
    colors: Sequence[str] = ("red", "green", "blue", "yellow"),
    shapes: Sequence[str] = ("circle", "square", "triangle"),
    max_objects: int = 4,
    p_multi: float = 0.15,
    p_negative: float = 0.1,
    position_cue: float = 0.0,
    object_scale: float = 1.0,
) -> list[GroundingSample]:
    """Generate ``n`` synthetic grounding scenes, deterministically from ``seed``.

    ``position_cue`` in [0, 1] replaces the background with a position-coded gradient (see
    :func:`_position_cue_background`): the CPU default of ``task=vqa_grounding`` uses it so that a
    tiny model trained from scratch can learn localisation in minutes. ``object_scale`` multiplies
    the object sizes (small 6-8%, large 17-22% of the shorter side at 1.0).

    Scene ``i`` depends only on ``(seed, i)`` (so the first ``k`` scenes are the same for any
    ``n >= k``). A scene is negative with probability ``p_negative``, multi-target with
    ``p_multi``, otherwise single-target (attribute 40%, size 30%, relation 30%, among the
    kinds ``max_objects`` allows).

    Returns:
        Samples with in-memory PIL images, ``bbox_frame="pixels"``, ``image_size=(W, H)``,
        labels like ``"small red circle"``, ids ``"synth-<seed>-<i>"``, and ``extra`` with
        ``kind``, ``query`` and ``objects``.

    Raises:
        ValueError: invalid arguments (unknown colour/shape, image side < 96, probabilities
            outside [0, 1] or summing above 1, ...).
    """
    _validate(n, seed, sizes, colors, shapes, max_objects, p_multi, p_negative)
    masks = _MaskCache()
    out: list[GroundingSample] = []
    for i in range(int(n)):
        rng = np.random.default_rng([int(seed), i])
        size = tuple(int(v) for v in sizes[int(rng.integers(len(sizes)))])
        u = rng.random()
        kind = "negative" if u < p_negative else "multi" if u < p_negative + p_multi else _single_kind(rng, max_objects)
        builder = _SceneBuilder(rng, size, colors, shapes, masks, position_cue, object_scale)
        for _ in range(_SCENE_TRIES):
            built = builder.build(kind, max_objects)
            if built is not None:
                break
        else:
            raise RuntimeError(f"could not lay out a {kind!r} scene of size {size} with max_objects={max_objects}")
        objects, query = built
        targets = _resolve(query, objects)
        if (kind == "negative") != (len(targets) == 0) or (kind == "multi") != (len(targets) >= 2):
            raise RuntimeError(f"internal error: scene {i} ({kind}) resolves to {targets}")  # pragma: no cover
        image = builder.render(objects)
        out.append(
            GroundingSample(
                id=f"synth-{seed}-{i}",
                image=image,
                question=expression(query),
                boxes=np.array([objects[t].box for t in targets], dtype=np.float64).reshape(-1, 4),
                labels=[objects[t].label for t in targets],
                bbox_frame="pixels",
                image_size=size,
                source=f"synthetic(seed={seed})[{i}]",
                extra={
                    "kind": kind,
                    "query": query,
                    "objects": [
                        {"color": o.color, "shape": o.shape, "size": o.size, "bbox": list(o.box)} for o in objects
                    ],
                },
            )
        )
    return out
