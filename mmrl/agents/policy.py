"""The multi-turn, tool-using VLM policy (``model.type=vlm_agent``): a :class:`~mmrl.policies.vlm.VLMPolicy` whose
sample is a whole trajectory of policy turns and environment turns.

Rollout, for a batch of trajectories (``G`` per prompt, each with its own :class:`~mmrl.agents.environment.Environment`)::

    prompt = chat template (tools in it) + images -> ONE processor call; vision features once
    repeat up to agent.max_turns:
        every unfinished trajectory's sequence so far -> one batched generate (per-sample seeds, behaviour log-probs)
        env.step(turn text) -> done (final answer), or an observation (tool results: text and/or images)
        observation -> chat template (a tool message + the next assistant header) -> processor -> appended as context

Each turn continues from the previous turn's KV cache (``agent.reuse_cache``, Qwen-VL families,
:mod:`mmrl.agents.kv_cache`): only the tokens the cache does not hold (the observation, its new images) are run; other
families, or ``agent.reuse_cache=false``, prefill the whole sequence so far each turn. Every image's vision features
are computed once, when it enters the trajectory, and reused by later turns and by training (frozen vision tower).

Training (:meth:`AgentVLMPolicy.log_probs`) runs ONE forward per trajectory over the whole sequence with all its images
(those added mid-trajectory by tools included), at the positions generation used, and reads the log-probs of every
token after the prompt; only the generated ones carry mask 1 (:mod:`mmrl.agents.trajectory`). With a frozen tower
the ratio to the behaviour log-probs is 1 (tested within 1e-6 in fp32).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

from mmrl.agents.config import AgentConfig
from mmrl.agents.environment import Environment, Observation, ToolEnvironment
from mmrl.agents.kv_cache import TurnCache
from mmrl.agents.tools import Tool, ToolContext, load_tools
from mmrl.agents.trajectory import GEN, OBS, Segment, Trajectory
from mmrl.policies.base import LogProbOutput, PolicySpec, PromptBatch, Rollout
from mmrl.policies.token_policy import left_pad, right_pad, token_logp_and_entropy
from mmrl.policies.vlm import VLMPolicy, encode_images
from mmrl.policies.vlm_errors import PromptTooLongError
from mmrl.policies.vlm_inputs import PromptInputs
from mmrl.rollout.noise import mix_seed
from mmrl.rollout.token_sampler import generate_completions

EnvironmentFactory = Callable[[dict, dict], Environment]
"""``(item, tools) -> Environment``: a fresh environment for one trajectory on ``item``."""

_TURN_SEED = 0xA6E47
_SYSTEM_PROBE = "mmrl-system-probe"
_ASSISTANT_PROBE = "mmrl-assistant-probe"
_PROBE_SYSTEM = [{"role": "system", "content": [{"type": "text", "text": _SYSTEM_PROBE}]}]


def tools_system_text(schemas: Sequence[dict]) -> str:
    """Qwen's tool instructions (what the Qwen2.5 / Qwen3 chat templates write for ``tools=``), for a processor whose
    chat template does not take ``tools=``."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
        'XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def default_environment(tools: dict[str, Tool], agent: AgentConfig) -> EnvironmentFactory:
    """A factory of :class:`ToolEnvironment` over ``tools`` with the limits of ``agent``."""

    def make(item: dict, _tools: dict) -> Environment:
        return ToolEnvironment(tools, timeout_s=agent.tool_timeout_s, max_tool_chars=agent.max_tool_chars)

    return make


class AgentVLMPolicy(VLMPolicy):
    """Multi-turn tool use over a VLM; one ``[T]`` row per trajectory (see the module docstring)."""

    def __init__(
        self,
        lm,
        processor,
        cfg,
        agent: AgentConfig,
        *,
        tools: dict[str, Tool] | None = None,
        make_env: EnvironmentFactory | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(lm, processor, cfg, **kw)
        agent.validate()
        self.agent = agent
        self.tools = dict(tools or {})
        self.make_env = make_env or default_environment(self.tools, agent)
        template = getattr(processor, "chat_template", None) or ""
        self.template_takes_tools = "tools" in template
        """True when the processor's chat template renders ``tools=`` itself (and ``tool`` messages); otherwise the
        policy writes Qwen's tool instructions into the system turn and tool results as ``<tool_response>`` user
        turns (what Qwen's templates render)."""
        self._turn_sep = self._separator_after_turn()
        self._probe_base = self._render(_PROBE_SYSTEM, generation_prompt=False)
        """The probe system turn alone; :meth:`observation_text` renders a message after it and keeps the delta."""
        self.record_images = False
        """Keep each trajectory's observation images in its sample (``observation_images``, per turn) for the
        evaluation outputs; on inside :meth:`evaluation_outputs`."""
        self.turn_counts = {"continued": 0, "prefilled": 0}
        """Row-turns continued from the previous turn's KV cache vs prefilled from the whole sequence (cumulative)."""

    # ------------------------------------------------------------------ templates
    def _render(self, messages: list[dict], *, generation_prompt: bool, **kw: Any) -> str:
        return self.processor.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **kw
        )

    def _separator_after_turn(self) -> str:
        """What the template writes after an assistant turn's text (e.g. ``<|im_end|>\\n``)."""
        text = self._render(
            _PROBE_SYSTEM + [{"role": "assistant", "content": [{"type": "text", "text": _ASSISTANT_PROBE}]}],
            generation_prompt=False,
        )
        return text[text.rindex(_ASSISTANT_PROBE) + len(_ASSISTANT_PROBE) :]

    def _prompt(self, item: dict, schemas: list[dict]) -> PromptInputs | None:
        """The first prompt of a trajectory: the VLM policy's preprocessing with the tools in the template
        (``tools=``) or in the system turn; None when it is over ``model.max_prompt_tokens`` (skipped and counted, as
        the VLM policy does)."""
        item = dict(item)
        kw: dict[str, Any] = {}
        if schemas and self.template_takes_tools:
            kw["tools"] = schemas
        elif schemas:
            item["system"] = "\n\n".join(s for s in (item.get("system"), tools_system_text(schemas)) if s)
        return self.preprocess([item], skip_too_long=True, template_kwargs=kw)[0]

    def observation_text(self, obs: Observation, *, after_eos: bool) -> str:
        """The text that follows a policy turn: the end of that turn (the template's separator; the end-of-turn token
        too when the turn was cut before it), the tool message with one image placeholder per image, and the next
        ``assistant`` header. Rendered by the processor's chat template (its delta over a probe system turn)."""
        images = [{"type": "image"} for _ in obs.images]
        if self.template_takes_tools:
            msg = {"role": "tool", "content": images + [{"type": "text", "text": obs.text}]}
        else:
            msg = {
                "role": "user",
                "content": [{"type": "text", "text": "<tool_response>\n"}]
                + images
                + [{"type": "text", "text": f"{obs.text}\n</tool_response>"}],
            }
        base = self._probe_base
        full = self._render(_PROBE_SYSTEM + [msg], generation_prompt=True)
        if not full.startswith(base):
            raise ValueError("the chat template renders a system turn differently when a tool message follows it")
        sep = self._turn_sep
        eos = self.tokenizer.eos_token or ""
        if after_eos and eos and sep.startswith(eos):
            sep = sep[len(eos) :]
        return sep + full[len(base) :]

    def _observation_chunk(self, obs: Observation, *, after_eos: bool) -> PromptInputs:
        """The observation as processor-encoded context tokens (image placeholders expanded), with its images' vision
        features computed once (frozen tower)."""
        text = self.observation_text(obs, after_eos=after_eos)
        images = list(obs.images)
        enc = self.processor(text=[text], images=images or None, return_tensors="pt")
        fields = self.family_layer.prompt_fields(self.processor, enc, len(images), 0)
        chunk = PromptInputs(
            text=text,
            images=images,
            input_ids=enc["input_ids"][0].long(),
            orig_sizes=[im.size for im in images],
            **fields,
        )
        if images and not self.vision_trainable:
            with torch.no_grad():
                chunk.features = encode_images(self.module.lm, [chunk], self.device)[0]
        return chunk

    # ------------------------------------------------------------------ rollout
    def _decode(self, ids: Tensor) -> str:
        return self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)

    def rollout(self, batch: PromptBatch, group_size: int, *, greedy: bool = False) -> Rollout:
        # one environment per trajectory, built once; a prompt's tool schemas are its first trajectory's
        groups = [[self.make_env(item, self.tools) for _ in range(group_size)] for item in batch.items]
        prompts = [
            self._prompt(item, [t.schema for t in envs[0].tools.values()]) for item, envs in zip(batch.items, groups)
        ]
        n_too_long = float(sum(p is None for p in prompts))
        plan = [(i, p, j) for i, p in enumerate(prompts) if p is not None for j in range(group_size)]
        if not plan:  # every prompt too long: an empty rollout (the trainer logs an empty step, evaluation skips it)
            empty = torch.zeros(0, 0)
            return Rollout(
                rollout_logp=empty,
                mask=empty.clone(),
                group_id=torch.zeros(0, dtype=torch.long),
                prompt_index=torch.zeros(0, dtype=torch.long),
                samples=[],
                payload={"trajectories": []},
                metrics={"data/too_long": n_too_long},
            )
        distinct = [p for p in prompts if p is not None]
        self._set_train_mode(False)
        if not self.vision_trainable:
            with torch.no_grad():
                for p, f in zip(distinct, encode_images(self.module.lm, distinct, self.device)):
                    p.features = f
        trajs, envs, seeds = [], [], []
        for i, p, j in plan:
            trajs.append(Trajectory(prompt=p))
            env = groups[i][j]
            env.reset(batch.items[i], ToolContext(batch.items[i], list(p.images), list(p.input_sizes), self.box_frame))
            envs.append(env)
            seeds.append(mix_seed(batch.seeds[i], j))
        self._run_turns(trajs, envs, seeds, greedy)
        return self._to_rollout(batch, plan, trajs, n_too_long)

    def _run_turns(self, trajs: list[Trajectory], envs: list[Environment], seeds: list[int], greedy: bool) -> None:
        """The turn loop: batched generation over the unfinished trajectories, then each one's environment turn."""
        agent, image_dim = self.agent, self.family_layer.image_dim
        lm = self.module.lm
        state: TurnCache | None = None
        for turn in range(agent.max_turns):
            active = [k for k, t in enumerate(trajs) if not t.done]
            if not active:
                return
            remaining = [agent.max_tokens - trajs[k].length for k in active]
            inputs = state.continue_inputs(self, active, trajs) if state is not None else None
            self.turn_counts["continued" if inputs is not None else "prefilled"] += len(active)
            if inputs is None:  # the first turn, or the cache cannot continue: the whole sequence so far
                prefixes = [trajs[k].full_inputs(image_dim) for k in active]
                feats = [q.features for q in prefixes]
                cached = all(f is not None or not q.num_images for f, q in zip(feats, prefixes))
                inputs = self._prompt_inputs(prefixes, feats if cached else None)
                if self._reuses_cache(prefixes):
                    from transformers import DynamicCache

                    from mmrl.rollout.token_sampler import cache_kwarg

                    inputs[cache_kwarg(lm)] = DynamicCache(config=self._base_lm().config)
            with torch.no_grad():
                comp = generate_completions(
                    lm,
                    inputs,
                    seeds=[mix_seed(seeds[k], _TURN_SEED, turn) for k in active],
                    max_new_tokens=max(1, min(self.cfg.max_new_tokens, max(remaining))),
                    eos_ids=self.eos_ids,
                    pad_id=self.pad_id,
                    temperature=self.cfg.temperature,
                    top_p=self.cfg.top_p,
                    suppress_ids=self.suppress_ids,
                    greedy=greedy,
                )
            ids, lengths = comp.ids.cpu(), comp.mask.sum(1).long().tolist()
            cache = next((v for key, v in inputs.items() if key in ("cache", "past_key_values")), None)
            state = None
            if cache is not None:
                kept = [min(n, r) for n, r in zip(lengths, remaining)]
                deltas = getattr(getattr(self._base_lm(), "model", None), "rope_deltas", None)
                state = TurnCache.after_generate(cache, active, inputs, ids, kept, deltas)
            for row, k in enumerate(active):
                traj, n = trajs[k], min(lengths[row], remaining[row])
                turn_ids = ids[row, :n].clone()
                ended = n > 0 and int(turn_ids[-1]) in self.eos_ids
                traj.add(Segment(GEN, turn_ids, logp=comp.logp[row, :n].cpu().float()))
                text = self._decode(turn_ids)
                result = envs[k].step(text)
                record = {"text": text, "truncated": not ended, "observation": None, **result.info}
                traj.turns.append(record)
                if result.done:
                    traj.finished = True
                    continue
                if turn == agent.max_turns - 1:
                    traj.over_turn = True
                    continue
                obs = result.observation or Observation()
                chunk = self._observation_chunk(obs, after_eos=ended)
                if traj.length + chunk.input_ids.numel() >= agent.max_tokens:
                    traj.over_budget = True  # no room for the observation and a next turn
                    continue
                traj.add(Segment(OBS, chunk.input_ids, chunk=chunk))
                record["observation"] = obs.text
                record["num_images"] = len(obs.images)

    @contextlib.contextmanager
    def evaluation_outputs(self) -> Iterator[None]:
        """Samples keep their observation images inside this context (written by :mod:`mmrl.agents.outputs`)."""
        before = self.record_images
        self.record_images = True
        try:
            yield
        finally:
            self.record_images = before

    def _base_lm(self):
        lm = self.module.lm
        return lm.get_base_model() if hasattr(lm, "get_base_model") else lm

    def _reuses_cache(self, prefixes: Sequence[PromptInputs]) -> bool:
        """Whether later turns continue from this turn's KV cache (:mod:`mmrl.agents.kv_cache`): ``agent.reuse_cache``,
        a Qwen-VL family (its positions come from ``get_rope_index`` over the masked sequence), cached features."""
        return (
            self.agent.reuse_cache
            and self.agent.max_turns > 1
            and hasattr(getattr(self._base_lm(), "model", None), "get_rope_index")
            and all(q.features is not None or not q.num_images for q in prefixes)
            and not any(q.num_videos for q in prefixes)
        )

    def _sample(self, traj: Trajectory) -> dict:
        """What rewards read of a trajectory: the final turn's ``text`` plus the whole trajectory (turns, tool calls
        with their errors and results' info, how it ended) and the VLM sample fields (sizes, frame)."""
        last = traj.turns[-1] if traj.turns else {"text": "", "truncated": True}
        sample = self._sample_dict(last["text"], traj.length, bool(last["truncated"]), traj.prompt, False)
        final_ids = next((s.ids for s in reversed(traj.segments) if s.kind == GEN), None)
        sample["completion_ids"] = final_ids.tolist() if final_ids is not None else []  # TRL's: the final turn's
        calls = [c for t in traj.turns for c in t.get("tool_calls", [])]
        sample.update(
            turns=[{k: v for k, v in t.items()} for t in traj.turns],
            num_turns=len(traj.turns),
            tool_calls=calls,
            num_tool_calls=len(calls),
            tool_errors=[c["error"] for c in calls if c["error"] is not None],
            finished=traj.finished,
            over_turn=traj.over_turn,
            over_budget=traj.over_budget,
            generated_tokens=int((traj.kinds() == GEN).sum()),
        )
        if self.record_images:  # per turn, the images its observation added (none after the last turn)
            chunks = iter(traj.chunks())
            sample["observation_images"] = [
                list(next(chunks).images) if t.get("observation") is not None else [] for t in traj.turns
            ]
        return sample

    def _to_rollout(self, batch: PromptBatch, plan: list, trajs: list[Trajectory], n_too_long: float) -> Rollout:
        """``[B, T]`` tensors over the tokens after each prompt: behaviour log-probs and mask on the generated tokens
        only (zero on observation tokens and padding; a whole over-turn row with ``agent.over_turn=mask``)."""
        T = max(t.length for t in trajs)
        B = len(trajs)
        logp, mask = torch.zeros(B, T), torch.zeros(B, T)
        for b, t in enumerate(trajs):
            n = t.length
            logp[b, :n] = t.behaviour_logp()
            trained = not (t.over_turn and self.agent.over_turn == "mask")
            mask[b, :n] = (t.kinds() == GEN).float() * float(trained)
        samples = [self._sample(t) for t in trajs]
        prompt_index = torch.tensor([i for i, _, _ in plan], dtype=torch.long)
        metrics = agent_metrics(samples, mask_total=float(sum(t.length for t in trajs)), mask=mask)
        metrics["data/too_long"] = n_too_long
        return Rollout(
            rollout_logp=logp,
            mask=mask,
            group_id=torch.tensor(batch.seeds, dtype=torch.long)[prompt_index],
            prompt_index=prompt_index,
            samples=samples,
            payload={"trajectories": trajs},
            metrics=metrics,
        )

    # ------------------------------------------------------------------ training
    def trajectory_inputs(self, trajs: Sequence[Trajectory], T: int) -> tuple[dict, int]:
        """Model inputs of ONE forward over whole trajectories: left-padded prompts, then the ``T`` tokens after each
        prompt right-padded, every image of the sequence (prompt's and observations') in order; and the width ``P`` of
        the prompt block (token ``t`` after the prompt sits at column ``P + t``)."""
        full = [t.full_inputs(self.family_layer.image_dim) for t in trajs]
        p_ids, p_att = left_pad([t.prompt.input_ids for t in trajs], self.pad_id)
        p_mm, _ = left_pad([t.prompt.mm_token_type_ids for t in trajs], 0)
        lengths = torch.tensor([t.length for t in trajs])
        r_ids = right_pad([t.rest_ids() for t in trajs], self.pad_id, T)
        r_mm = right_pad([t.rest_mm() for t in trajs], 0, T)
        r_att = (torch.arange(T)[None, :] < lengths[:, None]).long()
        dev = self.device
        att = torch.cat([p_att, r_att], 1).to(dev)
        mm = torch.cat([p_mm, r_mm], 1).to(dev)
        feats = self._features(full)
        media = self._media_inputs(full, feats, None)
        inputs: dict[str, Any] = {"input_ids": torch.cat([p_ids, r_ids], 1).to(dev), "attention_mask": att}
        inputs.update(self.family_layer.sequence_inputs(att, mm, media=bool(media), completions=True))
        inputs.update(media)
        return inputs, p_ids.shape[1]

    def _trajectory_logits(self, trajs: Sequence[Trajectory], T: int, *, want_values: bool):
        """ONE forward over whole trajectories: logits [b, T, V] predicting each token after the prompt, those tokens'
        ids [b, T], the values [b, T] (or None) and the ``GEN`` mask [b, T] (True on sampled tokens)."""
        inputs, P = self.trajectory_inputs(trajs, T)
        self._set_train_mode(torch.is_grad_enabled())
        logits, vals = self.model(**inputs, logits_to_keep=T + 1, want_values=want_values)
        comp_logits = logits[:, -(T + 1) : -1] if T > 0 else logits[:, :0]
        ids = right_pad([t.rest_ids() for t in trajs], self.pad_id, T).to(comp_logits.device)
        gen = right_pad([t.kinds() for t in trajs], 0, T).to(comp_logits.device) == GEN
        v = vals[:, P - 1 : P - 1 + T] if vals is not None else None
        return comp_logits, ids, v, gen

    def log_probs(self, rollout: Rollout, *, entropy: bool = False, values: bool = False) -> LogProbOutput:
        trajs: list[Trajectory] = rollout.payload["trajectories"]
        comp_logits, ids, v, gen = self._trajectory_logits(trajs, rollout.mask.shape[1], want_values=values)
        logp, ent = token_logp_and_entropy(
            comp_logits, ids, temperature=self.cfg.temperature, entropy=entropy, suppress_ids=self.suppress_ids
        )
        # observation tokens (and padding) are context: a finite 0 there, whatever the mask says (an image placeholder
        # is a suppressed id: its log-prob is -inf, and -inf * 0 in a masked sum is NaN)
        zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
        logp = torch.where(gen, logp, zero)
        ent = torch.where(gen, ent, zero) if ent is not None else None
        return LogProbOutput(logp=logp, entropy=ent, values=v)

    def teacher_trajectory(self, item: dict, turns: Sequence[str]) -> Trajectory:
        """The trajectory of ``item`` whose policy turns are ``turns`` (each + the end-of-turn token), with the
        environment's real observations in between (a target zoom call gets its real crop)."""
        env = self.make_env(item, self.tools)
        prompt = self._prompt(item, [t.schema for t in env.tools.values()])
        if prompt is None:
            raise PromptTooLongError(f"SFT item {item.get('id', '?')} is over model.max_prompt_tokens")
        if prompt.num_images and not self.vision_trainable:
            with torch.no_grad():
                prompt.features = encode_images(self.module.lm, [prompt], self.device)[0]
        env.reset(item, ToolContext(item, list(prompt.images), list(prompt.input_sizes), self.box_frame))
        traj = Trajectory(prompt=prompt)
        eos = self.tokenizer.eos_token_id
        for k, text in enumerate(turns):
            ids = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos], dtype=torch.long)
            traj.add(Segment(GEN, ids, logp=torch.zeros(ids.numel())))
            if k == len(turns) - 1:
                break
            result = env.step(text)
            if result.done:
                raise ValueError(f"SFT target turn {k + 1} of {len(turns)} ends the trajectory (it calls no tool)")
            chunk = self._observation_chunk(result.observation or Observation(), after_eos=True)
            traj.add(Segment(OBS, chunk.input_ids, chunk=chunk))
        traj.finished = True
        return traj

    def sft_loss(self, batch: PromptBatch, targets: Sequence[str | Sequence[str]]) -> Tensor:
        """Mean token cross-entropy of the target turns (a str: one turn; a list: the turns, with the environment's
        observations in between as context, :meth:`teacher_trajectory`) over their tokens only."""
        if len(targets) != len(batch):
            raise ValueError(f"sft_loss: {len(targets)} targets for {len(batch)} prompts")
        trajs = [
            self.teacher_trajectory(item, [t] if isinstance(t, str) else list(t))
            for item, t in zip(batch.items, targets)
        ]
        comp_logits, ids, _, gen = self._trajectory_logits(trajs, max(t.length for t in trajs), want_values=False)
        logp, _ = token_logp_and_entropy(comp_logits, ids, temperature=1.0)  # the full softmax, as VLMPolicy's SFT
        m = gen.float()
        return -(torch.where(gen, logp, torch.zeros((), dtype=logp.dtype, device=logp.device)) * m).sum() / m.sum()


def agent_metrics(samples: Sequence[dict], *, mask_total: float, mask: Tensor) -> dict[str, float]:
    """Per-rollout agent metrics: turns and tool calls per trajectory, tool-call rate, how trajectories ended, the
    share of trajectory tokens that are trained, and ``count/agent/error_<kind>`` (summed over rollouts)."""
    n = max(1, len(samples))
    out = {
        "agent/turns": sum(s["num_turns"] for s in samples) / n,
        "agent/tool_calls": sum(s["num_tool_calls"] for s in samples) / n,
        "agent/tool_call_rate": sum(s["num_tool_calls"] > 0 for s in samples) / n,
        "agent/finished_frac": sum(s["finished"] for s in samples) / n,
        "agent/over_turn_frac": sum(s["over_turn"] for s in samples) / n,
        "agent/over_budget_frac": sum(s["over_budget"] for s in samples) / n,
        "agent/trained_token_frac": float(mask.sum()) / max(1.0, mask_total),
    }
    kinds: dict[str, float] = {}
    for s in samples:
        for kind in s["tool_errors"]:
            kinds[kind] = kinds.get(kind, 0.0) + 1.0
    for kind, count in kinds.items():
        out[f"count/agent/error_{kind}"] = count
    return out


def load_environment(spec: str) -> EnvironmentFactory:
    """The environment factory of ``agent.environment`` (``FILE.py:NAME`` / ``MODULE:NAME``, loaded like reward
    functions); ConfigError naming ``agent.environment`` when it cannot be loaded or is not callable."""
    from mmrl.rewards.user import resolve_fn

    _, factory = resolve_fn(
        spec,
        key="agent.environment",
        forms="give FILE.py:NAME or MODULE:NAME",
        wants="a callable that returns an environment (reset / step, docs/agents.md)",
    )
    return factory


def build_agent_policy(run_cfg, spec: PolicySpec | None = None) -> AgentVLMPolicy:
    """Policy builder of ``model.type=vlm_agent``: the VLM of ``model``, the limits of ``agent``, the tools of
    ``agent.tools`` (or the task's ``spec.extras["agent_tools"]``), and the environment factory ``(item, tools) ->
    Environment`` of ``agent.environment``, else the task's (``spec.extras["agent_environment"]``), else
    :class:`ToolEnvironment`."""
    from mmrl.policies.vlm import load_run_vlm

    cfg = run_cfg.model
    agent: AgentConfig = run_cfg.agent
    extras = spec.extras if spec is not None else {}
    specs = list(agent.tools or extras.get("agent_tools", []))
    tools = load_tools([] if specs == ["none"] else specs)
    make_env = extras.get("agent_environment")
    if agent.environment:
        make_env = load_environment(agent.environment)
    lm, processor = load_run_vlm(run_cfg)
    return AgentVLMPolicy(
        lm,
        processor,
        cfg,
        agent,
        tools=tools,
        make_env=make_env,
        value_head=run_cfg.algo.advantage == "gae",
        reference=run_cfg.algo.kl_coef > 0,
    )
