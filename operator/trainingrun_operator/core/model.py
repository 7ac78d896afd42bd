"""The TrainingRun resource as pydantic models: the boundary between the API server's JSON and our code.

Who calls it: the kopf handlers (`handlers.py`) and the local backend (`local.py`) parse a TrainingRun's
`spec` and `status` here; the decision core (`decision.py`) reads the parsed models and returns a status
patch built from them.

The models mirror `manifests/crd/trainingrun.dev_trainingruns.yaml` field by field (camelCase on the wire,
snake_case in Python), with `extra="forbid"` so a typo or a field the CRD does not know is an error that
names the field. `tests/unit/operator/test_crd.py` fails when the CRD and these models disagree.
Defaults here equal the CRD's defaults; the API server applies the CRD's, these apply in local mode.

Every number, string, map and list under `spec` is bounded, here and in the CRD: generous bounds (a duration of
`MAX_SECONDS`, `MAX_REPLICAS` pods in a group, `config.MAX_STEPS` steps) that no run needs to pass, but finite, so a
value such as a deadline of 10**12 seconds is refused naming its field instead of breaking the arithmetic of every
pass. The status is bounded the other way: what the operator copies into it from elsewhere (KubeRay's and the pods'
messages) is a `Message`, cut to `MESSAGE_CHARS` when it is written.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from trainingrun_runtime.config import MAX_STEPS

__all__ = [
    "API_VERSION",
    "GROUP",
    "HEAD_GRACE_SECONDS",
    "KIND",
    "MAX_BUDGET",
    "MAX_INT_QUANTITY",
    "MAX_REPLICAS",
    "MAX_SECONDS",
    "MAX_TOLERATION_SECONDS",
    "MESSAGE_CHARS",
    "PLURAL",
    "QUANTITY_PATTERN",
    "RAY_FLAG_PATTERN",
    "RAY_RESOURCE_CHARS",
    "RAY_RESOURCE_PATTERN",
    "RAY_VALUE_PATTERN",
    "SIZE_PATTERN",
    "VERSION",
    "AttemptRecord",
    "Backoff",
    "CheckpointRecord",
    "CheckpointSpec",
    "CheckpointsStatus",
    "Condition",
    "DriverSpec",
    "EnvVar",
    "Identity",
    "Message",
    "ObjectMeta",
    "PVCSource",
    "ProgressRate",
    "RayClusterShape",
    "RayGroup",
    "Resources",
    "RestartCounts",
    "RestartPolicy",
    "ResumeSpec",
    "Retention",
    "RuntimeReport",
    "Toleration",
    "TrainingRun",
    "TrainingRunSpec",
    "TrainingRunStatus",
    "WorkerGroup",
]

GROUP = "trainingrun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainingRun"
PLURAL = "trainingruns"

Phase = Literal["Pending", "Queued", "Starting", "Running", "Restarting", "Suspended", "Succeeded", "Failed"]
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A Kubernetes quantity written as a string (`500m`, `4Gi`, `1e3`), as the API server's own schemas check it."""

MAX_SECONDS = 30 * 24 * 3600
"""The longest duration under spec (a deadline, a backoff, a bound on waiting): 30 days."""
MAX_REPLICAS = 1000
"""The most pods in one worker group."""
MAX_BUDGET = 1_000_000
"""The largest restart budget (preemptions, consecutive failures): a million, which no run reaches."""
MAX_INT_QUANTITY = 2**50
"""The largest quantity written as an integer (1Pi bytes of memory); a larger one is written with a suffix, as a
string (`4Pi`)."""
MAX_TOLERATION_SECONDS = 365 * 24 * 3600
"""The longest a toleration of NoExecute keeps a pod on a tainted node: a year."""

RAY_FLAG_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A `rayStartParams` key: a `ray start` flag without its `--` (`num-cpus`, `object-store-memory`), at most 63
characters. KubeRay writes `--<key>=<value>` into the pod's shell command line unquoted, so nothing else is safe."""
RAY_VALUE_PATTERN = r"^[A-Za-z0-9._:/=+,@%-]*$"
"""A `rayStartParams` value other than `resources`: no space, quote, `;`, `&`, `|`, `$`, backtick, `<`, `>`,
parenthesis, glob, newline or backslash, which the shell would read (`8`, `0.0.0.0`, `/tmp/ray`, `a=1,b=2`)."""
RAY_RESOURCE_CHARS = r"""^[A-Za-z0-9_.:,{}"' +-]*$"""
"""What `rayStartParams.resources` (a JSON object of numbers, which the shell reads too) may be written with: the
characters of such an object of `RAY_RESOURCE_PATTERN` names, and the quotes KubeRay trims around it."""
RAY_RESOURCE_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$"
"""A Ray custom resource's name in `rayStartParams.resources` (`spot`, `accelerator_type:A100`)."""

MESSAGE_CHARS = 1024
"""The longest message the operator writes into the status; a longer one (KubeRay's, a pod's) is cut, marked."""
_CUT = " ...[truncated]"


def _bounded(text: str) -> str:
    """`text` if it is at most MESSAGE_CHARS long, else its start with a mark that it was cut, MESSAGE_CHARS long."""
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - len(_CUT)] + _CUT


Message = Annotated[str, AfterValidator(_bounded), PlainSerializer(_bounded, return_type=str)]
"""A status message: cut to MESSAGE_CHARS when it is read and when it is written (a copy made with `model_copy`
is not validated again, so the wire form is cut too)."""


def _in_words(words: str) -> WrapValidator:
    """One problem in the CRD's words instead of pydantic's (one per branch of a union: `cpu.int`, `cpu.str`)."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f"{words} (got {value!r:.60})") from None

    return WrapValidator(validate)


Quantity = Annotated[
    Annotated[int, Field(ge=0, le=MAX_INT_QUANTITY)]
    | Annotated[str, StringConstraints(max_length=64, pattern=QUANTITY_PATTERN)],
    _in_words(
        f"must be a Kubernetes quantity: an integer from 0 to {MAX_INT_QUANTITY}, or a string like 500m, 4Gi or 1e3 of "
        "at most 64 characters"
    ),
]
ResourceName = Annotated[
    str,
    StringConstraints(pattern=r"^(cpu|memory|ephemeral-storage|hugepages-.*|.*/.*)$"),
    _in_words(
        "a container resource is cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource with a "
        "domain (example.com/gpu)"
    ),
]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")]
RayStartParams = dict[str, Annotated[str, StringConstraints(max_length=1024)]]
"""`ray start` flags and values; what is safe on the shell's command line is `validation.py`'s check (the CRD's CEL
rules say the same). A value is at most 1024 characters: the CEL rule over 64 values of every group must fit the API
server's cost budget."""
SIZE_PATTERN = r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)([KMGTPE]i|[kMGTPE]|[eE][0-9]+)?$"
"""A size in bytes as a Kubernetes quantity (`8Gi`, `500M`, `1e9`); the CRD's shmSize has the same pattern."""
ShmSize = Annotated[int, Field(ge=1, le=MAX_INT_QUANTITY)] | Annotated[str, Field(pattern=SIZE_PATTERN, max_length=32)]


class _Wire(BaseModel):
    """Base of every model: camelCase on the wire, unknown fields rejected, immutable."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
    )

    def wire(self) -> dict[str, Any]:
        """The JSON object as the API server stores it (camelCase, unset optional fields omitted)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ----------------------------------------------------------------------------------------------- spec


class Resources(_Wire):
    """Requests and limits of the Ray container, as in a Pod (`{"cpu": 1, "memory": "2Gi"}`)."""

    requests: dict[ResourceName, Quantity] | None = Field(default=None, max_length=16)
    limits: dict[ResourceName, Quantity] | None = Field(default=None, max_length=16)


class Toleration(_Wire):
    """A Pod toleration."""

    key: str | None = Field(default=None, max_length=317)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(default=None, max_length=63)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0, le=MAX_TOLERATION_SECONDS)


HEAD_GRACE_SECONDS = 30
"""spec.ray.head.terminationGracePeriodSeconds by default: Kubernetes' own default, room for a step and a save of
the example (a few seconds) with time to spare."""


class RayGroup(_Wire):
    """The head group: one pod, which runs all of the run's state (driver, controller, trainer, TransferQueue)."""

    resources: Resources | None = None
    ray_start_params: RayStartParams | None = Field(default=None, max_length=64)
    node_selector: dict[str, LabelValue] | None = Field(default=None, max_length=64)
    tolerations: list[Toleration] | None = Field(default=None, max_length=64)
    termination_grace_period_seconds: int = Field(default=HEAD_GRACE_SECONDS, ge=0, le=3600)
    """The head pod's grace period: its preStop hook asks the driver to save and stop within it (`notice`)."""
    shm_size: ShmSize | None = None
    """sizeLimit of the memory-backed /dev/shm (Ray's object store); None: the pod's memory limit caps it."""
    template: dict[str, Any] | None = None
    """A PodTemplateSpec fragment merged into the head pod (`podtemplate.py`; KubeRay's schema in the CRD)."""


class WorkerGroup(_Wire):
    """A worker group: `replicas` identical pods that run generation workers (role generation: losing one costs no
    restart) or the trainer ranks, one a pod (role trainer: losing one ends the attempt as a preemption)."""

    name: str = Field(pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$", max_length=20)
    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    role: Literal["generation", "trainer"] = "generation"
    resources: Resources | None = None
    ray_start_params: RayStartParams | None = Field(default=None, max_length=64)
    node_selector: dict[str, LabelValue] | None = Field(default=None, max_length=64)
    tolerations: list[Toleration] | None = Field(default=None, max_length=64)
    termination_grace_period_seconds: int | None = Field(default=None, ge=0, le=3600)
    shm_size: ShmSize | None = None
    template: dict[str, Any] | None = None
    """A PodTemplateSpec fragment merged into the group's pods (`podtemplate.py`)."""


class RayClusterShape(_Wire):
    """The Ray cluster of every attempt: a head and zero or more worker groups."""

    ray_version: str = Field(default="2.60.0", max_length=32, pattern=r"^[0-9]+(\.[0-9]+)*([-+.][0-9A-Za-z.]+)?$")
    head: RayGroup
    workers: list[WorkerGroup] | None = Field(default=None, max_length=16)


class PVCSource(_Wire):
    """The PersistentVolumeClaim that holds the checkpoints."""

    claim_name: str = Field(
        min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    )


class Retention(_Wire):
    """Which checkpoints the driver keeps: the newest `keep_last`, plus every multiple of `keep_every`."""

    keep_last: int = Field(default=3, ge=1, le=MAX_STEPS)
    keep_every: int | None = Field(default=None, ge=1, le=MAX_STEPS)


class CheckpointSpec(_Wire):
    """Checkpoint storage (immutable after creation), save period and retention."""

    pvc: PVCSource
    path: str = Field("", max_length=200, pattern=r"^$|^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$")
    save_period: int = Field(ge=1, le=MAX_STEPS)
    retention: Retention = Field(default_factory=Retention)


class ResumeSpec(_Wire):
    """Where the first attempt resumes from: the newest checkpoint (`latest`) or a pinned `step`."""

    policy: Literal["latest", "step"] = "latest"
    step: int | None = Field(default=None, ge=0, le=MAX_STEPS)

    @model_validator(mode="after")
    def _step_iff_pinned(self) -> ResumeSpec:
        if (self.policy == "step") != (self.step is not None):
            raise ValueError("resume.step is required when resume.policy is 'step' and not allowed otherwise")
        return self


class Backoff(_Wire):
    """Delay before a restart after a failure: initial * factor**(n-1), capped at max."""

    initial_seconds: float = Field(default=10.0, ge=0, le=MAX_SECONDS)
    max_seconds: float = Field(default=300.0, ge=0, le=MAX_SECONDS)
    factor: float = Field(default=2.0, ge=1, le=100)

    @model_validator(mode="after")
    def _cap_above_initial(self) -> Backoff:
        if self.max_seconds < self.initial_seconds:
            raise ValueError("restartPolicy.backoff.maxSeconds must be >= restartPolicy.backoff.initialSeconds")
        return self


class RestartPolicy(_Wire):
    """Separate budgets for preemptions (default unlimited) and consecutive failures (default 3), the bounds on
    a lost worker's replacement and on a head whose node stopped reporting, and the stall watchdog's deadlines."""

    preemption_budget: int | None = Field(default=None, ge=1, le=MAX_BUDGET)
    failure_budget: int = Field(default=3, ge=1, le=MAX_BUDGET)
    backoff: Backoff = Field(default_factory=Backoff)
    worker_replacement_seconds: float = Field(default=300.0, ge=0, le=MAX_SECONDS)
    """The driver's bound without any generation worker (runtime `generation.replacementSeconds`)."""
    node_not_ready_seconds: float = Field(default=60.0, ge=0, le=MAX_SECONDS)
    """How long a head on a NotReady node may stay before the attempt ends (`classification`)."""
    progress_deadline_seconds: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    """The longest a Running attempt's driver may go without reporting a new step before the attempt ends as
    Stalled (`watchdog`); unset or 0: no watchdog."""
    startup_deadline_seconds: float = Field(default=600.0, ge=0, le=MAX_SECONDS)
    """With the watchdog on: the longest from the attempt reaching Running to its driver's first report (Ray
    start, restore, the first step); 0: no bound before the first report."""


ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
"""An environment variable's name in spec.driver.env: a shell identifier (the entrypoint is a shell command line)."""
RESERVED_ENV_PREFIX = "TRAININGRUN_"
"""spec.driver.env may not set these: the operator's own (`contract.ATTACH_ENV`)."""


class EnvVar(_Wire):
    """An environment variable of the program, as in a Pod's container (a literal value)."""

    name: str = Field(min_length=1, max_length=128, pattern=ENV_NAME_PATTERN)
    value: str = Field(default="", max_length=4096)

    @model_validator(mode="after")
    def _not_ours(self) -> EnvVar:
        if self.name.startswith(RESERVED_ENV_PREFIX):
            raise ValueError(
                f"env name {self.name!r}: names starting with {RESERVED_ENV_PREFIX} are the operator's (it passes "
                "the attempt in TRAININGRUN_ATTACH); rename it"
            )
        return self


class DriverSpec(_Wire):
    """A program of the user's instead of the built-in GRPO driver: run on the head by the RayJob, attached to the
    attempt through `trainingrun_runtime.sdk` (docs/sdk.md)."""

    entrypoint: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=256
    )
    """The command and its arguments (`["python", "/app/train.py"]`); not a shell line: each item is quoted."""
    env: list[EnvVar] | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _names_once(self) -> DriverSpec:
        names = [e.name for e in self.env or []]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"driver.env names {twice} more than once; keep one of each")
        return self


class TrainingRunSpec(_Wire):
    """What the user asks for."""

    image: str = Field(min_length=1, max_length=512, pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    ray: RayClusterShape
    trainer: dict[str, Any] = Field(default_factory=dict)
    """The built-in driver's GRPO config; with `driver`, the program's settings (handed to it as JSON)."""
    driver: DriverSpec | None = None
    """A program of the user's instead of the built-in driver (None: the built-in GRPO driver)."""
    checkpoint: CheckpointSpec
    resume: ResumeSpec = Field(default_factory=ResumeSpec)
    restart_policy: RestartPolicy = Field(default_factory=RestartPolicy)
    suspend: bool = False


# --------------------------------------------------------------------------------------------- status


class CheckpointRecord(_Wire):
    """One complete checkpoint, as the driver reports it after the rename (`contract.CheckpointReport`)."""

    step: int
    path: str
    attempt: int
    replay_digest: str | None = None
    weights_sha256: str | None = None
    manifest_blake3: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """BLAKE3 of the step's manifest.json: given back to the driver that resumes from the step, which refuses a
    manifest that hashes otherwise (None: a driver from before it was reported)."""
    time: str
    reason: str | None = None
    """A `contract.CheckpointReason`: Periodic, Final or PreemptionNotice (None: a driver from before reasons were
    reported)."""


class BadCheckpoint(_Wire):
    """A checkpoint the driver passed over because it failed verification."""

    step: int
    problem: str | None = None
    """What failed: the file and the mismatch."""


class RuntimeReport(_Wire):
    """`status.runtime`: written only by the driver (merge patch), read by the operator, fenced by attempt. What the
    driver writes is `trainingrun_runtime.contract.RuntimeStatus`; this is the operator's parsed view of it, field
    for field (tests/unit/operator/test_crd.py holds the two and the CRD together)."""

    attempt: int | None = None
    step: int | None = None
    reward: float | None = None
    updated: str | None = None
    last_checkpoint: CheckpointRecord | None = None
    restore_error: str | None = None
    finished: bool | None = None
    metrics: dict[str, float] | None = Field(default=None, max_length=16)
    """A spec.driver program's other figures at its newest reported step (`sdk.Run.report`)."""
    checkpoint_seconds: float | None = Field(default=None, ge=0)
    """Seconds this attempt's saves have kept training waiting so far."""
    bad_checkpoints: list[BadCheckpoint] | None = None
    """Checkpoints this attempt's driver passed over (the pinned step, or older ones) because they failed
    verification; the operator adds them to `checkpoints.bad`."""
    orphaned_checkpoints: list[int] | None = None
    """Steps this attempt's driver set aside as `orphan_step_N` (newer than its resume point, never recorded)."""


class Condition(_Wire):
    """A standard condition (`kubectl wait --for=condition=Succeeded` reads these)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str | None = None
    message: Message | None = None
    last_transition_time: str | None = None
    observed_generation: int | None = None


class Identity(_Wire):
    """Names of the driver's per-run ServiceAccount, Role and RoleBinding."""

    service_account_name: str | None = None
    role_name: str | None = None
    role_binding_name: str | None = None


class AttemptRecord(_Wire):
    """One attempt: its RayJob, when it ran, where it resumed from, the worker pods it lost, and why it ended."""

    number: int = Field(ge=1)
    ray_job_name: str | None = None
    start: str | None = None
    admitted: str | None = None
    """When Kueue admitted the attempt (unsuspended its RayJob); None: not queued, or still waiting."""
    running_since: str | None = None
    """When the attempt reached Running; the stall watchdog's start-up bound counts from here."""
    end: str | None = None
    resumed_from: int | None = None
    reason: str | None = None
    message: Message | None = None
    steps_lost: int | None = None
    workers_lost: int | None = Field(default=None, ge=0)
    lost_worker_pods: list[str] | None = Field(default=None, max_length=100)
    """The pods counted in `workers_lost` (the newest 100), so none is counted twice; not kept in the history."""
    first_step: str | None = None
    """When the attempt's driver first reported a trained step (its `updated`): the end of its start (`goodput`)."""
    last_report: str | None = None
    """The time of the attempt's newest report, kept when it ends (a stall counts from it)."""
    step_seconds: float | None = Field(default=None, ge=0)
    """Seconds a step took at the recent rate when the attempt ended: what each step it lost costs to train again."""
    checkpoint_seconds: float | None = Field(default=None, ge=0)
    """Seconds its saves kept training waiting, as its driver reported them (`status.runtime.checkpointSeconds`)."""


class RestartSeconds(_Wire):
    """The seconds of restarts, by whose part: the operator's (an attempt's end to the next one's RayJob, backoff
    included), the Ray cluster's start (to the RayJob running) and the driver's (to its first trained step)."""

    operator: float = 0.0
    cluster: float = 0.0
    driver: float = 0.0


class LostSeconds(_Wire):
    """Seconds that trained nothing kept, by cause (`goodput`)."""

    start: float = 0.0
    """The first attempt's start: the apply (after any queue) to its first trained step."""
    restart: float = 0.0
    """An attempt's end to the next attempt's first trained step (split in `RestartSeconds`)."""
    recompute: float = 0.0
    """Steps trained again after a resume, each at the step time measured before the loss."""
    stall: float = 0.0
    """A stalled attempt's last report to the stall's detection."""
    checkpoint: float = 0.0
    """Time training waited for saves."""


class Spent(_Wire):
    """Where the seconds of one or more attempts went."""

    productive: float = 0.0
    queued: float = 0.0
    """In Kueue's queue, or suspended: reported apart, not counted against goodput."""
    lost: LostSeconds = Field(default_factory=LostSeconds)
    restart: RestartSeconds = Field(default_factory=RestartSeconds)


class Goodput(_Wire):
    """The share of the run's time (queues and suspensions left out) that went into training it kept
    (`goodput.summarise`), as of `asOf`: the newest time the status knows (a report, an attempt's start or end)."""

    ratio: float | None = None
    elapsed_seconds: float = 0.0
    """The run's start to `asOf`, queued time left out."""
    productive_seconds: float = 0.0
    queued_seconds: float = 0.0
    lost_seconds: LostSeconds = Field(default_factory=LostSeconds)
    restart_seconds: RestartSeconds = Field(default_factory=RestartSeconds)
    as_of: str | None = None
    earlier: Spent | None = None
    """The attempts before the current one, summed when the current one started (the history is bounded; this is
    not)."""


class RestartCounts(_Wire):
    """How many attempts ended, by cause."""

    total: int = 0
    preempted: int = 0
    application_failure: int = 0
    infrastructure_failure: int = 0
    failed_restore: int = 0
    stalled: int = 0


class CheckpointsStatus(_Wire):
    """The newest recorded checkpoint, a bounded history, and steps whose restore failed."""

    latest: CheckpointRecord | None = None
    history: list[CheckpointRecord] | None = None
    bad: list[int] | None = None

    def recorded(self) -> list[CheckpointRecord]:
        """Every record: the history, then the latest (oldest first; a step recorded twice appears twice)."""
        return [*(self.history or []), *([self.latest] if self.latest else [])]


class ProgressRate(_Wire):
    """The driver's report that the run's recent progress rate was last measured at, and that rate (`progress`)."""

    attempt: int
    step: int
    time: str
    steps_per_second: float | None = None


class TrainingRunStatus(_Wire):
    """What the operator (and, in `runtime`, the driver) observed."""

    phase: Phase | None = None
    reason: str | None = None
    message: Message | None = None
    observed_generation: int | None = None
    start_time: str | None = None
    completion_time: str | None = None
    next_attempt_time: str | None = None
    identity: Identity | None = None
    attempt: AttemptRecord | None = None
    attempts: list[AttemptRecord] | None = None
    restarts: RestartCounts | None = None
    consecutive_failures: int | None = None
    checkpoints: CheckpointsStatus | None = None
    runtime: RuntimeReport | None = None
    conditions: list[Condition] | None = None
    progress: str | None = None
    """`<step shown>/<spec.trainer.steps>` (the PROGRESS column; `progress.summarise`)."""
    reward: float | None = None
    """The current attempt's newest reported mean reward, to 3 decimals (REWARD, -o wide)."""
    eta: str | None = None
    """Time left at the recent rate, rounded, while Running (ETA, -o wide)."""
    rate: ProgressRate | None = None
    goodput: Goodput | None = None
    attempt_table: list[str] | None = Field(default=None, max_length=102)
    """One aligned line per attempt under a header, for `kubectl describe`."""


class ObjectMeta(BaseModel):
    """The part of metadata we read; everything else the API server keeps is ignored here."""

    model_config = ConfigDict(extra="ignore", alias_generator=to_camel, populate_by_name=True, frozen=True)

    name: str
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    labels: dict[str, str] | None = None


class TrainingRun(_Wire):
    """A whole TrainingRun object (as read from the API server or from a YAML file in local mode)."""

    api_version: Literal["trainingrun.dev/v1alpha1"]
    kind: Literal["TrainingRun"]
    metadata: ObjectMeta
    spec: TrainingRunSpec
    status: TrainingRunStatus | None = None
