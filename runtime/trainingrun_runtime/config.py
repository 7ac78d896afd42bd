"""RuntimeConfig: every knob of one training run, with its default, in one place.

Who reads it:
- the operator copies a TrainingRun's `spec.trainer` verbatim into `trainer` and its
  checkpoint settings into `checkpoint`, then passes the JSON to the driver with
  `--config-json` (see `python -m trainingrun_runtime`);
- the driver validates it here, and `config_hash()` stamps every checkpoint manifest,
  so a resume under a configuration that would change the math is refused.

Imports only pydantic and the standard library: the operator imports this module and
must not pull in torch or ray.

JSON keys are accepted in camelCase (`savePeriod`) or snake_case (`save_period`);
unknown keys are an error that names the field (`extra="forbid"`).

Every number has an upper bound as well as a lower one, generous but finite (`MAX_STEPS` for a count of steps,
the widths of a model far larger than this one): the CRD's `spec.trainer` schema is generated from these fields
(`trainingrun_operator.core.crdschema`), so the API server refuses at admission a value no run could use.

The config hash covers ONLY the math-relevant fields, listed in `MATH_FIELDS`:

    trainer.model     trainer.task     trainer.data     trainer.reward     trainer.generation
    trainer.grpo      trainer.sampler  trainer.prompts_per_step            trainer.seed

Fields added after the first checkpoints were written (`ADDED_LATER`) enter the hash only when set away from their
default, so a configuration that does not use them hashes as before. The data file's contents and the model
directory's weights are not in the hash (their paths are); the manifest carries the data's fingerprint.

Deliberately excluded (changing them never changes a trained weight):
`trainer.steps` (the step limit; a run may be extended), `trainer.generation_workers`
(every random draw is derived from (seed, sample id, policy version), so the number of
workers cannot change a sample), `trainer.log_every`, and all of `checkpoint` and `generation`.
`trainer.trainer_workers` is left out too: the ranks compute the same update (the whole batch's), and a
checkpoint resumes on another number of them; only the rounding of the sums differs, so a resume on the same
number is bit-exact and on another one is not.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

__all__ = [
    "ADDED_LATER",
    "DEFAULT_MAX_NEW_TOKENS",
    "GENERATION_RESOURCE",
    "MATH_FIELDS",
    "MAX_SEED",
    "MAX_STEPS",
    "TRAINER_RESOURCE",
    "CheckpointConfig",
    "DataConfig",
    "GRPOConfig",
    "GenerationConfig",
    "ModelConfig",
    "RewardConfig",
    "RuntimeConfig",
    "SamplerConfig",
    "TaskConfig",
    "TextGenerationConfig",
    "TrainerConfig",
    "TrainersConfig",
    "config_hash",
    "math_diff",
    "math_fields",
]


class _Model(BaseModel):
    """Base of every config model: frozen, unknown keys forbidden, camelCase or snake_case keys."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
    )


MAX_STEPS = 10**9
"""The largest count of training steps anywhere in a run's configuration (steps, periods, staleness, prompts in a
dataset): a billion, far past any run, and an exact integer in every JSON reader."""
MAX_SEED = 2**53 - 1
"""The largest seed (seeds are hashed, so any value serves): the largest integer a float64 holds exactly, as the API
server holds a schema's bounds (2**63 - 1, rounded up to 2**63, would refuse every seed)."""


def _cel_model(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """`ModelConfig`'s rules across fields in CEL, for the CRD (trainingrun_operator.core.crdschema): the API server
    checks them at admission. An absent field has its default here, which the rule reads from the model."""
    width, heads = cls.model_fields["d_model"].default, cls.model_fields["n_heads"].default
    sizes = " || ".join(f"has(self.{to_camel(name)})" for name in _BUILTIN_SIZES)
    schema["x-kubernetes-validations"] = [
        {
            "rule": f"(has(self.dModel) ? self.dModel : {width}) % (has(self.nHeads) ? self.nHeads : {heads}) == 0",
            "message": f"nHeads must divide dModel (defaults {heads} and {width})",
            "fieldPath": ".nHeads",
        },
        {"rule": f"!has(self.path) || !({sizes})", "message": _SIZES_WITH_PATH, "fieldPath": ".path"},
        {
            "rule": "has(self.path) || (!has(self.dtype) && !has(self.trustRemoteCode))",
            "message": "dtype and trustRemoteCode apply to a model from `path`; the built-in model is float32",
            "fieldPath": ".path",
        },
    ]


_BUILTIN_SIZES = ("d_model", "n_layers", "n_heads", "d_ff")
_SIZES_WITH_PATH = (
    "dModel, nLayers, nHeads and dFf size the built-in model; a model from `path` has its own sizes in its "
    "config.json: remove them"
)


class ModelConfig(_Model):
    """The policy: the built-in tiny model (sized by these fields), or a Hugging Face causal LM from `path`."""

    model_config = ConfigDict(json_schema_extra=_cel_model)

    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description=(
            "A directory in Hugging Face format (config.json, safetensors weights, tokenizer files), loaded with "
            "local files only: absolute inside the pod (the image, the checkpoint volume at /checkpoints/..., any "
            "volume of the pod template); locally, absolute or relative to the YAML file. A hub id is refused: "
            "copy the model into a volume. Unset: the built-in tiny model. Default unset."
        ),
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="The precision the model from `path` is trained in. Default `float32`."
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Run the Python code the model directory ships (`trust_remote_code`). Default false.",
    )
    d_model: int = Field(
        default=64, ge=8, le=16384, description="Built-in model: width of the residual stream. Default 64."
    )
    n_layers: int = Field(default=2, ge=1, le=1024, description="Built-in model: transformer blocks. Default 2.")
    n_heads: int = Field(
        default=4, ge=1, le=1024, description="Built-in model: attention heads; must divide dModel. Default 4."
    )
    d_ff: int = Field(
        default=128, ge=8, le=65536, description="Built-in model: hidden width of each block's MLP. Default 128."
    )

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must divide d_model ({self.d_model})")
        # Set away from their defaults (a configuration dumped and read again sets every field, at its default).
        away = {name for name in self.model_fields_set if getattr(self, name) != type(self).model_fields[name].default}
        if self.path is not None and away & set(_BUILTIN_SIZES):
            raise ValueError(_SIZES_WITH_PATH)
        if self.path is None and away & {"dtype", "trust_remote_code"}:
            raise ValueError("dtype and trustRemoteCode apply to a model from `path`; the built-in model is float32")
        return self


class TaskConfig(_Model):
    """The synthetic task: map a digit string to an answer string; reward = fraction of positions right."""

    kind: Literal["reverse", "copy", "increment"] = Field(
        default="reverse",
        description=(
            "What the answer is: `reverse` the prompt digits, `copy` them, or `increment` each digit "
            "by one modulo `digits`. Default `reverse`."
        ),
    )
    digits: int = Field(default=6, ge=2, le=64, description="Alphabet size of prompt and answer digits. Default 6.")
    length: int = Field(default=4, ge=1, le=32, description="Digits per prompt (and per answer). Default 4.")
    dataset_size: int = Field(
        default=4096,
        ge=1,
        le=MAX_STEPS,
        description=("Number of distinct prompts in one epoch; prompt i is derived from (seed, i). Default 4096."),
    )


_Beta = Annotated[float, Field(ge=0.0, lt=1.0)]


class GRPOConfig(_Model):
    """Group Relative Policy Optimisation: G samples per prompt, advantages normalised within the group."""

    group_size: int = Field(default=8, ge=2, le=1024, description="Completions sampled per prompt (G). Default 8.")
    clip_eps: float = Field(default=0.2, gt=0.0, le=10.0, description="PPO ratio clip epsilon. Default 0.2.")
    kl_coef: float | None = Field(
        default=None,
        ge=0.0,
        le=1000.0,
        description=(
            "Weight of the KL penalty to the initial policy (k3 estimator); null disables it and "
            "no reference model is kept. Default null."
        ),
    )
    lr: float = Field(default=3e-3, gt=0.0, le=10.0, description="Adam learning rate (constant). Default 3e-3.")
    adam_betas: tuple[_Beta, _Beta] = Field(
        default=(0.9, 0.99), description="Adam betas, each in [0, 1) (as torch requires). Default [0.9, 0.99]."
    )
    weight_decay: float = Field(default=0.0, ge=0.0, le=10.0, description="AdamW weight decay. Default 0.0.")
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1e6, description="Global gradient-norm clip. Default 1.0.")
    temperature: float = Field(
        default=1.0, gt=0.0, le=100.0, description="Sampling temperature of the generators. Default 1.0."
    )
    updates_per_batch: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="Optimizer steps taken on each batch (PPO epochs); >1 makes the clip bite. Default 1.",
    )
    adv_eps: float = Field(
        default=1e-4, gt=0.0, le=1.0, description="Added to the group std before dividing. Default 1e-4."
    )


class SamplerConfig(_Model):
    """How finished groups are chosen for a training step."""

    kind: Literal["in_order", "async"] = Field(
        default="in_order",
        description=(
            "`in_order`: step t trains exactly the prompts the loader handed out for step t, generated "
            "by policy version t (deterministic, exact resume). `async`: step t trains any finished "
            "groups whose policy version is within `max_staleness` of t (overlaps generation with "
            "training). Default `in_order`."
        ),
    )
    max_staleness: int = Field(
        default=1,
        ge=0,
        le=MAX_STEPS,
        description=(
            "`async` only: a group generated by policy version v may train at version t when "
            "t - v <= max_staleness; older groups are dropped and their prompts redispatched. Default 1."
        ),
    )


class DataConfig(_Model):
    """The user's prompts and answers (`grpo.dataset`): row i of the file is dataset index i."""

    path: str = Field(
        min_length=1,
        max_length=4096,
        description=(
            "A `.jsonl` or `.parquet` file: absolute inside the pod (the checkpoint volume at /checkpoints/..., any "
            "volume of the pod template); locally, absolute or relative to the YAML file."
        ),
    )
    prompt_field: str = Field(
        default="prompt", min_length=1, max_length=256, description="The field that holds a prompt. Default `prompt`."
    )
    answer_field: str = Field(
        default="answer",
        min_length=1,
        max_length=256,
        description="The field that holds the answer the reward compares with (text or a number). Default `answer`.",
    )


_FUNCTION = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


def _cel_reward(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """`RewardConfig._function_with_its_kind` in CEL, for the CRD."""
    schema["x-kubernetes-validations"] = [
        {"rule": "(self.kind == 'function') == has(self.function)", "message": _FUNCTION_KIND, "fieldPath": ".function"}
    ]


_FUNCTION_KIND = "`function` is set exactly when kind is `function`"


class RewardConfig(_Model):
    """How a completion is scored against its prompt's answer (`grpo.rewards`)."""

    model_config = ConfigDict(json_schema_extra=_cel_reward)

    kind: Literal["exact", "math", "function"] = Field(
        description=(
            "`exact`: 1 if the completion equals the answer, both stripped. `math`: 1 if the completion's final "
            "number (the last \\boxed{}, else the number after `####`, else the last number) equals the answer "
            "numerically. `function`: the user's `function`. Unset `reward`: the built-in task's partial credit."
        )
    )
    function: str | None = Field(
        default=None,
        max_length=512,
        pattern=_FUNCTION,
        description=(
            "`module:callable`, called as callable(prompt, completion, answer) -> float: importable in the runtime "
            "image on a cluster; locally from the YAML file's directory or PYTHONPATH. Only with kind `function`. "
            "Default unset."
        ),
    )

    @model_validator(mode="after")
    def _function_with_its_kind(self) -> RewardConfig:
        if (self.kind == "function") != (self.function is not None):
            raise ValueError(_FUNCTION_KIND)
        return self


_Stop = Annotated[str, Field(min_length=1, max_length=256)]
DEFAULT_MAX_NEW_TOKENS = 256
"""`generation.maxNewTokens` of a model from `path` when unset."""


class TextGenerationConfig(_Model):
    """How the generation workers sample completions (`grpo.policy.Sampling`)."""

    max_new_tokens: int | None = Field(
        default=None,
        ge=1,
        le=32768,
        description=(
            f"Tokens generated at most per completion. Default {DEFAULT_MAX_NEW_TOKENS} for a model from "
            "`model.path`; the built-in task's completions are `task.length` tokens, and it may not be set there."
        ),
    )
    temperature: float | None = Field(
        default=None,
        gt=0.0,
        le=100.0,
        description="Sampling temperature. Default 1.0 (the older spelling `grpo.temperature` sets it too).",
    )
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling's mass. Default 1.0 (off).")
    stop: tuple[_Stop, ...] = Field(
        default=(),
        max_length=16,
        description=(
            "A completion ends after the first of these strings (kept in it) or the tokenizer's end token. "
            "Default none."
        ),
    )
    chat_template: bool = Field(
        default=False,
        description="Put each prompt through the tokenizer's chat template (as a user turn), if it has one. "
        "Default false.",
    )


_DATA_NEEDS_PATH = "data needs a model from model.path (the built-in model's tokenizer knows only digits)"
_PATH_NEEDS_DATA = "a model from model.path trains on the user's prompts: set data (path, promptField, answerField)"
_TASK_WITH_DATA = "task configures the built-in task, which data replaces: remove task"
_DATA_NEEDS_REWARD = "data needs reward (kind: exact, math or function) to score completions against its answers"
_LENGTH_OF_TASK = "generation.maxNewTokens: the built-in task's completions are task.length tokens; remove it"
_TWO_TEMPERATURES = "generation.temperature and grpo.temperature are the same setting: keep generation.temperature"
_RANKS_WITHOUT_ROWS = (
    "trainerWorkers: each trainer worker needs at least one row of a step (promptsPerStep times grpo.groupSize rows): "
    "lower trainerWorkers or raise promptsPerStep"
)


def _cel_trainer(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """`TrainerConfig._consistent` in CEL, for the CRD: the API server checks it at admission."""
    path = "(has(self.model) && has(self.model.path))"
    prompts = TrainerConfig.model_fields["prompts_per_step"].default
    group = GRPOConfig.model_fields["group_size"].default
    schema["x-kubernetes-validations"] = [
        {"rule": f"!has(self.data) || {path}", "message": _DATA_NEEDS_PATH, "fieldPath": ".data"},
        {"rule": f"has(self.data) || !{path}", "message": _PATH_NEEDS_DATA, "fieldPath": ".model.path"},
        {"rule": "!has(self.data) || !has(self.task)", "message": _TASK_WITH_DATA, "fieldPath": ".task"},
        {"rule": "!has(self.data) || has(self.reward)", "message": _DATA_NEEDS_REWARD, "fieldPath": ".data"},
        {
            "rule": "has(self.data) || !has(self.generation) || !has(self.generation.maxNewTokens)",
            "message": _LENGTH_OF_TASK,
            "fieldPath": ".generation.maxNewTokens",
        },
        {
            "rule": "!(has(self.generation) && has(self.generation.temperature) && has(self.grpo) && "
            "has(self.grpo.temperature))",
            "message": _TWO_TEMPERATURES,
            "fieldPath": ".grpo.temperature",
        },
        {
            "rule": "!has(self.trainerWorkers) || self.trainerWorkers <= "
            f"(has(self.promptsPerStep) ? self.promptsPerStep : {prompts})"
            f" * (has(self.grpo) && has(self.grpo.groupSize) ? self.grpo.groupSize : {group})",
            "message": _RANKS_WITHOUT_ROWS,
            "fieldPath": ".trainerWorkers",
        },
    ]


class TrainerConfig(_Model):
    """The TrainingRun's `spec.trainer`: model, data or task, reward, generation, GRPO, sampler, steps and seed."""

    model_config = ConfigDict(json_schema_extra=_cel_trainer)

    model: ModelConfig = Field(default=ModelConfig(), description="The policy network. Defaults as ModelConfig.")
    task: TaskConfig = Field(
        default=TaskConfig(), description="The built-in synthetic task (when no data). Defaults as TaskConfig."
    )
    data: DataConfig | None = Field(
        default=None, description="The user's prompts and answers, for a model from model.path. Default unset."
    )
    reward: RewardConfig | None = Field(
        default=None,
        description="How completions are scored; required with data. Default unset: the built-in task's score.",
    )
    generation: TextGenerationConfig = Field(
        default=TextGenerationConfig(), description="How completions are sampled. Defaults as its fields."
    )
    grpo: GRPOConfig = Field(default=GRPOConfig(), description="The GRPO loss. Defaults as GRPOConfig.")
    sampler: SamplerConfig = Field(
        default=SamplerConfig(), description="Which groups a step trains on. Defaults as SamplerConfig."
    )
    steps: int = Field(
        default=200,
        ge=1,
        le=MAX_STEPS,
        description="Training steps (optimizer updates of the policy version). Default 200.",
    )
    prompts_per_step: int = Field(
        default=8, ge=1, le=100_000, description="Prompts (groups) trained per step. Default 8."
    )
    generation_workers: int = Field(default=2, ge=1, le=1000, description="Ray generation actors. Default 2.")
    trainer_workers: int = Field(
        default=1,
        ge=1,
        le=1024,
        description=(
            "Data-parallel trainer processes (Ray actors in one torch.distributed group, the policy and optimizer "
            "sharded by FSDP2); each takes its part of a step's rows. A checkpoint resumes on any number. Default 1."
        ),
    )
    seed: int = Field(
        default=0,
        ge=0,
        le=MAX_SEED,
        description="Root of every random draw (init, prompts, shuffles, samples). Default 0.",
    )
    log_every: int = Field(default=10, ge=1, le=MAX_STEPS, description="Log a progress line every N steps. Default 10.")

    @model_validator(mode="after")
    def _consistent(self) -> TrainerConfig:
        has_path = self.model.path is not None
        for broken, message in (
            (self.data is not None and not has_path, _DATA_NEEDS_PATH),
            (self.data is None and has_path, _PATH_NEEDS_DATA),
            (self.data is not None and self.task != TaskConfig(), _TASK_WITH_DATA),
            (self.data is not None and self.reward is None, _DATA_NEEDS_REWARD),
            (self.data is None and self.generation.max_new_tokens is not None, _LENGTH_OF_TASK),
            (self.generation.temperature is not None and self.grpo.temperature != 1.0, _TWO_TEMPERATURES),
            (self.trainer_workers > self.prompts_per_step * self.grpo.group_size, _RANKS_WITHOUT_ROWS),
        ):
            if broken:
                raise ValueError(message)
        return self

    @property
    def temperature(self) -> float:
        """The sampling temperature: `generation.temperature`, else `grpo.temperature` (its older spelling)."""
        return self.grpo.temperature if self.generation.temperature is None else self.generation.temperature


class CheckpointConfig(_Model):
    """When checkpoints are written and which are kept."""

    save_period: int = Field(
        default=10, ge=1, description="Write a checkpoint after every N training steps. Default 10."
    )
    keep_last: int = Field(default=3, ge=1, description="Keep the newest N complete checkpoints. Default 3.")
    keep_every: int | None = Field(
        default=None,
        ge=1,
        description="Also keep every checkpoint whose step is a multiple of N; null keeps none extra. Default null.",
    )


GENERATION_RESOURCE = "trainingrun_generation"
"""The Ray custom resource the operator gives every worker group's nodes; a generation worker asks for one unit of it
when the run has worker groups, so generation runs there and nothing else does (run state stays on the head)."""


class GenerationConfig(_Model):
    """Where the generation workers run, and how long a run waits for a lost one (set by the operator, not the user)."""

    on_worker_groups: bool = Field(
        default=False,
        description=(
            "The run has worker groups (`spec.ray.workers`): generation workers run only there, each asking for one "
            f"unit of the `{GENERATION_RESOURCE}` resource. False: they run beside the driver. Default false."
        ),
    )
    replacement_seconds: float = Field(
        default=300.0,
        ge=0.0,
        description=(
            "How long the driver trains on (async) or waits (in_order) without any generation worker before it "
            "gives up (`spec.restartPolicy.workerReplacementSeconds`); the attempt then ends and the next one "
            "resumes from the newest checkpoint. Default 300."
        ),
    )


TRAINER_RESOURCE = "trainingrun_trainer"
"""The Ray custom resource the operator gives the nodes of a worker group of role `trainer` (one unit a node); each
trainer rank asks for one unit when the run has such a group, so the ranks run there, one a pod."""


class TrainersConfig(_Model):
    """Where the trainer ranks run (set by the operator, not the user)."""

    on_worker_groups: bool = Field(
        default=False,
        description=(
            "The ranks run on the nodes of the worker groups of role trainer (one a node, each asking for one unit "
            "of the trainer resource), not on the head; a rank's node lost ends the attempt as TrainerLost."
        ),
    )


class RuntimeConfig(_Model):
    """Everything the driver needs: `{"trainer", "checkpoint", "generation", "trainers"}` (the `--config-json`
    value)."""

    trainer: TrainerConfig = Field(default=TrainerConfig(), description="The TrainingRun's spec.trainer.")
    checkpoint: CheckpointConfig = Field(default=CheckpointConfig(), description="Save period and retention.")
    generation: GenerationConfig = Field(
        default=GenerationConfig(), description="Where generation runs; never part of the config hash."
    )
    trainers: TrainersConfig = Field(
        default=TrainersConfig(), description="Where the trainer ranks run; never part of the config hash."
    )


MATH_FIELDS: tuple[str, ...] = (
    "trainer.model",
    "trainer.task",
    "trainer.data",
    "trainer.reward",
    "trainer.generation",
    "trainer.grpo",
    "trainer.sampler",
    "trainer.prompts_per_step",
    "trainer.seed",
)
"""Dotted paths (snake_case) of the fields that change the math; only these enter `config_hash`."""

ADDED_LATER: dict[str, Any] = {
    "trainer.model.path": None,
    "trainer.model.dtype": "float32",
    "trainer.model.trust_remote_code": False,
    "trainer.data": None,
    "trainer.reward": None,
    "trainer.generation.max_new_tokens": None,
    "trainer.generation.temperature": None,
    "trainer.generation.top_p": 1.0,
    "trainer.generation.stop": [],
    "trainer.generation.chat_template": False,
}
"""Math fields that came after checkpoints were first written, with their defaults: a field at its default is left
out of `math_fields`, so a configuration that does not use it hashes as it did before it existed (and a checkpoint
of that time still resumes)."""


def math_fields(config: RuntimeConfig) -> dict[str, Any]:
    """The math-relevant fields as a flat JSON-able dict: dotted leaf path -> value."""
    dumped = config.model_dump(mode="json", by_alias=False)
    flat: dict[str, Any] = {}
    for path in MATH_FIELDS:
        node: Any = dumped
        for part in path.split("."):
            node = node[part]
        _flatten(path, node, flat)
    return {key: value for key, value in flat.items() if key not in ADDED_LATER or value != ADDED_LATER[key]}


def _flatten(prefix: str, node: Any, out: dict[str, Any]) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            _flatten(f"{prefix}.{key}", value, out)
    else:
        out[prefix] = node


def config_hash(config: RuntimeConfig) -> str:
    """SHA-256 (hex) of the canonical JSON of `math_fields(config)`; equal hashes mean equal math."""
    blob = json.dumps(math_fields(config), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def math_diff(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Human-readable differences between two `math_fields` dicts, e.g. `trainer.grpo.lr: 0.003 -> 0.01`."""
    lines = []
    for key in sorted(set(saved) | set(current)):
        if saved.get(key, "<absent>") != current.get(key, "<absent>"):
            lines.append(f"{key}: {saved.get(key, '<absent>')!r} -> {current.get(key, '<absent>')!r}")
    return lines
