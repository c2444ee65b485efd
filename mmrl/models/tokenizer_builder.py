"""Offline Qwen-style tokenizers: a byte-level BPE trained in memory, wrapped in transformers.

No hub access is needed. The result behaves like the real Qwen2/2.5/3-VL tokenizers where it
matters to mmrl:

* the same pre-tokenizer (Qwen's split regex: every digit is its own pre-token, so a number
  up to 1000 is at most 4 tokens, exactly as with the real models) and byte-level alphabet
  (any text round-trips);
* the same special tokens, appended after the BPE vocabulary in the order of
  :data:`QWEN_VL_SPECIAL_TOKENS`, followed by :data:`NUM_ACTION_TOKENS` reserved action tokens
  ``<|act_0|>`` .. ``<|act_255|>`` that the VLA adapter maps action bins onto;
* ``<|im_end|>`` as eos, ``<|endoftext|>`` as pad, left padding;
* a Qwen-VL chat template (:data:`QWEN_VL_CHAT_TEMPLATE`) that renders an image as
  ``<|vision_start|><|image_pad|><|vision_end|>`` and a video with ``<|video_pad|>``; the
  Qwen processors expand those pads into one token per merged vision patch.

The same builder makes SmolVLM-style tokenizers (:data:`SMOLVLM_SPECIAL_TOKENS`, eos ``<end_of_utterance>``,
:data:`SMOLVLM_CHAT_TEMPLATE`: ``User:<image>...<end_of_utterance>\nAssistant:``), whose processor expands each
``<image>`` into ``<fake_token_around_image><global-img><image>...<image><fake_token_around_image>``.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from transformers import Qwen2Tokenizer

__all__ = [
    "ACTION_TOKEN_FORMAT",
    "DEFAULT_BPE_VOCAB_SIZE",
    "NUM_ACTION_TOKENS",
    "QWEN_VL_CHAT_TEMPLATE",
    "QWEN_VL_SPECIAL_TOKENS",
    "SMOLVLM_CHAT_TEMPLATE",
    "SMOLVLM_EOS_TOKEN",
    "SMOLVLM_SPECIAL_TOKENS",
    "TokenizerBuildError",
    "action_token_ids",
    "build_bpe_tokenizer",
    "default_special_tokens",
    "default_vlm_corpus",
]

QWEN_VL_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
"""Qwen-VL special tokens, in the order (and relative ids) of the real tokenizers."""

SMOLVLM_EOS_TOKEN = "<end_of_utterance>"
SMOLVLM_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    SMOLVLM_EOS_TOKEN,
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
)
"""SmolVLM's special tokens (chat markers, end of turn, the image token and its wrappers), in SmolVLM2's order."""

NUM_ACTION_TOKENS = 256
ACTION_TOKEN_FORMAT = "<|act_{}|>"
DEFAULT_BPE_VOCAB_SIZE = 1536
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"

# One template for the three families. Images/videos may be given as {"type": "image"},
# {"image": ...}, {"image_url": ...} or {"type": "video"}, {"video": ...}; text parts as
# {"type": "text", "text": ...}; a message's content may also be a plain string. No default
# system prompt is inserted (shorter prompts for tiny models); `add_vision_id` numbers media.
QWEN_VL_CHAT_TEMPLATE = (
    "{%- set image_count = namespace(value=0) -%}"
    "{%- set video_count = namespace(value=0) -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}"
    "{%- set image_count.value = image_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Picture ' + image_count.value|string + ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "{%- set video_count.value = video_count.value + 1 -%}"
    "{%- if add_vision_id -%}{{- 'Video ' + video_count.value|string + ': ' -}}{%- endif -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in content -%}"
    "{{- content['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# SmolVLM2's chat template (as transformers' SmolVLMProcessor ships it): "<|im_start|>User:<image>text<end_of_utterance>\n"
# per turn, then "Assistant:"; a message's content may be a string or a list of image / video / text parts.
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'] is string %}{{': ' + message['content']}}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% elif line['type'] == 'video' %}{{ '<video>' }}{% endif %}"
    "{% endfor %}{% endif %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


class TokenizerBuildError(ValueError):
    """Raised when a tokenizer cannot be built from the given corpus or special tokens."""


def default_special_tokens(num_action_tokens: int = NUM_ACTION_TOKENS) -> list[str]:
    """Qwen-VL special tokens followed by ``num_action_tokens`` reserved ``<|act_i|>`` tokens."""
    if num_action_tokens < 0:
        raise TokenizerBuildError(f"num_action_tokens must be >= 0, got {num_action_tokens}")
    return list(QWEN_VL_SPECIAL_TOKENS) + [ACTION_TOKEN_FORMAT.format(i) for i in range(num_action_tokens)]


def action_token_ids(tokenizer, num_action_tokens: int = NUM_ACTION_TOKENS) -> list[int]:
    """Ids of ``<|act_0|>`` .. ``<|act_{n-1}|>`` in ``tokenizer`` (bin ``i`` -> ``ids[i]``).

    Raises :class:`TokenizerBuildError` when one of them is not a token of ``tokenizer``.
    """
    vocab = tokenizer.get_vocab()
    names = [ACTION_TOKEN_FORMAT.format(i) for i in range(num_action_tokens)]
    missing = [n for n in names if n not in vocab]
    if missing:
        raise TokenizerBuildError(
            f"tokenizer lacks {len(missing)} of {num_action_tokens} action tokens (first missing: {missing[0]})"
        )
    return [vocab[n] for n in names]


# ----------------------------------------------------------------------------- corpus

_COLOURS = ("red", "green", "blue", "yellow", "orange", "purple", "black", "white", "gray", "pink", "brown", "cyan")
_SHAPES = ("circle", "square", "triangle", "rectangle", "star", "cube", "ball", "block", "object")
_SIZES = ("small", "large", "big", "tiny")
_RELATIONS = ("left of", "right of", "above", "below", "next to", "on top of", "under", "near")
_VERBS = ("pick up", "put", "place", "push", "open", "close", "move", "lift", "stack", "grasp", "turn on")
_PLACES = ("the bowl", "the plate", "the drawer", "the table", "the basket", "the box", "the shelf")
_GLUE = (
    "the a an all and or of in on is are there it its this that what which where when how many",
    "Locate Output output bbox bounding box JSON format coordinates label point answer question image",
    "video frame second seconds time start end event happens from to find every each no yes none",
    "object objects count number first then final thinking process reasoning tags please give",
    "robot arm gripper task instruction done success fail color shape size position scene picture",
    "cup mug bottle can apple banana orange lemon carrot bread spoon fork knife plate bowl pot pan lid",
    "drawer door cabinet microwave stove oven sink faucet towel sponge cloth basket tray rack shelf table",
    "person man woman child dog cat car bus bike tree house window chair sofa bed laptop phone book bag",
    "walks runs opens closes sits stands holds takes puts eats drinks throws catches jumps turns looks",
    "top bottom middle center corner front back inside outside between behind beside across along over",
    "one two three four five six seven eight nine ten zero first second third last next previous",
    "correct wrong true false maybe because so therefore since however also only same different other",
    "left right up down forward backward rotate clockwise counterclockwise gripper open close stop",
    "solve step calculate total sum difference area length width height distance angle degree",
    "Describe Identify Detect Determine Select Choose Return Provide Give Answer Explain Count Find",
)
_PROMPTS = (
    "Locate the {obj} in the image and output its bbox coordinates in JSON format.",
    "Locate all {colour} objects. Output the bbox_2d of each as JSON.",
    "Find the {obj} {rel} the {obj2}. Output the answer in JSON.",
    "How many {colour} objects are there? Answer with a number.",
    "Is there a {obj} in the image? Answer yes or no.",
    "When does the {obj} appear in the video? Output the start and end time in seconds.",
    "What is the colour of the {shape} {rel} the {obj2}?",
    "First output the thinking process in <think> </think> tags and then output the final answer"
    " in <answer> </answer> tags.",
    "In: What action should the robot take to {verb} the {obj} {rel} {place}?\nOut:",
)


def _box(rng: random.Random, high: int = 1000) -> list[int]:
    x1, x2 = sorted(rng.randint(0, high) for _ in range(2))
    y1, y2 = sorted(rng.randint(0, high) for _ in range(2))
    return [x1, y1, x2, y2]


def _object(rng: random.Random) -> str:
    words = [rng.choice(_COLOURS), rng.choice(_SHAPES)]
    if rng.random() < 0.3:
        words.insert(0, rng.choice(_SIZES))
    return " ".join(words)


def default_vlm_corpus(num_samples: int = 2000, seed: int = 0) -> list[str]:
    """A deterministic synthetic corpus of what the mmrl tasks make a VLM read and write.

    Covers scene words (colours, shapes, sizes, spatial relations, robot verbs), grounding
    prompts and JSON answers such as ``[{"bbox_2d": [12, 34, 56, 78], "label": "red circle"}]``,
    ``<think>``/``<answer>`` tags, every integer 0..1000, time spans such as
    ``"12.5 to 20.0 seconds"`` and Qwen3-VL frame stamps ``"<0.5 seconds>"``.
    ``num_samples`` random sentences (from ``seed``) are added to the fixed part.
    """
    if num_samples < 0:
        raise TokenizerBuildError(f"num_samples must be >= 0, got {num_samples}")
    rng = random.Random(seed)
    corpus: list[str] = list(_GLUE) * 3  # every glue word seen at least twice -> merged whole
    corpus += [" ".join(str(n) for n in range(start, min(start + 50, 1001))) for start in range(0, 1001, 50)]
    corpus += [" ".join(f"{n / 2:.1f}" for n in range(start, start + 40)) for start in range(0, 400, 40)]
    corpus += [" ".join(f"{c} {s}" for s in _SHAPES) for c in _COLOURS]
    corpus += [f"The {a} is {rel} the {b}." for rel in _RELATIONS for a, b in (("red circle", "blue square"),)]
    for _ in range(num_samples):
        obj, obj2 = _object(rng), _object(rng)
        prompt = rng.choice(_PROMPTS).format(
            obj=obj,
            obj2=obj2,
            colour=rng.choice(_COLOURS),
            shape=rng.choice(_SHAPES),
            rel=rng.choice(_RELATIONS),
            verb=rng.choice(_VERBS),
            place=rng.choice(_PLACES),
        )
        boxes = [{"bbox_2d": _box(rng), "label": _object(rng)} for _ in range(rng.randint(1, 3))]
        answer = json.dumps(boxes)
        start = rng.randint(0, 600) / 10
        end = start + rng.randint(5, 300) / 10
        kind = rng.randrange(6)
        if kind == 0:
            text = f"{prompt}\n{answer}"
        elif kind == 1:
            think = f"<think>The {obj} is {rng.choice(_RELATIONS)} the {obj2}.</think>"
            text = f"{prompt}\n{think}\n<answer>{answer}</answer>"
        elif kind == 2:
            span = f"{start:.1f} to {end:.1f}"
            text = f"{prompt}\nThe event happens from {span} seconds. <answer>{span}</answer>"
        elif kind == 3:
            stamps = "".join(f"<{t / 2:.1f} seconds>" for t in range(rng.randint(1, 8)))
            reply = rng.choice(("yes", "no", "none", str(rng.randint(0, 20))))
            text = f"{stamps} {prompt}\n<answer>{reply}</answer>"
        elif kind == 4:
            point = {"point_2d": _box(rng)[:2], "label": obj}
            count = f"There are {rng.randint(0, 12)} objects. No object {rng.choice(_RELATIONS)} it."
            text = f"{prompt}\n[{json.dumps(point)}] {count}"
        else:
            text = f"{rng.choice(_VERBS)} the {obj} {rng.choice(_RELATIONS)} {rng.choice(_PLACES)}. {prompt}"
        corpus.append(text)
    return corpus


# ----------------------------------------------------------------------------- tokenizer


def _train_byte_level_bpe(corpus: list[str], vocab_size: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train a byte-level BPE with Qwen's pre-tokenizer; return (vocab, merges)."""
    from tokenizers import Regex, Tokenizer, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return dict(model["vocab"]), merges


def build_bpe_tokenizer(
    corpus: list[str],
    *,
    vocab_size: int = DEFAULT_BPE_VOCAB_SIZE,
    special_tokens: list[str] | None = None,
    chat_template: str | None = QWEN_VL_CHAT_TEMPLATE,
    eos_token: str = EOS_TOKEN,
    pad_token: str = PAD_TOKEN,
) -> Qwen2Tokenizer:
    """Train a byte-level BPE on ``corpus`` and wrap it as a transformers ``Qwen2Tokenizer``.

    ``vocab_size`` bounds the BPE part (the 256 byte symbols plus merges; the trainer stops
    earlier when the corpus has no pair seen twice). ``special_tokens`` (default
    :func:`default_special_tokens`) get the ids right after the BPE vocabulary, in order; they
    must contain ``pad_token`` (default ``<|endoftext|>``) and ``eos_token`` (default ``<|im_end|>``). Padding is
    on the left.
    """
    if not corpus or not all(isinstance(s, str) for s in corpus):
        raise TokenizerBuildError("corpus must be a non-empty list of strings")
    if vocab_size < 256:
        raise TokenizerBuildError(f"vocab_size must be >= 256 (the byte alphabet), got {vocab_size}")
    specials = default_special_tokens() if special_tokens is None else list(special_tokens)
    if len(set(specials)) != len(specials):
        raise TokenizerBuildError("special_tokens contains duplicates")
    for required in (pad_token, eos_token):
        if required not in specials:
            raise TokenizerBuildError(f"special_tokens must contain {required!r}")

    from transformers import Qwen2Tokenizer

    vocab, merges = _train_byte_level_bpe(corpus, vocab_size)
    clashes = [s for s in specials if s in vocab]
    if clashes:
        raise TokenizerBuildError(f"special tokens already in the BPE vocabulary: {clashes[:5]}")
    # Start with only the first special (so it takes id len(vocab)), then add the rest in order.
    first, rest = specials[0], specials[1:]
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token=first,
        pad_token=first,
        padding_side="left",
    )
    tokenizer.add_special_tokens({"extra_special_tokens": rest})
    tokenizer.eos_token = eos_token
    tokenizer.pad_token = pad_token
    tokenizer.padding_side = "left"
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    for offset, token in enumerate(specials):
        if tokenizer.convert_tokens_to_ids(token) != len(vocab) + offset:
            raise TokenizerBuildError(f"special token {token!r} did not get id {len(vocab) + offset}")
    return tokenizer
