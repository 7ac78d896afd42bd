"""The restricted unpickler of TransferQueue's controller state (unpickling): what it holds loads, nothing else runs."""

from __future__ import annotations

import io
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from trainingrun_runtime.dataplane import unpickling
from trainingrun_runtime.errors import CheckpointCorrupt

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures/bundle-format-1/compat/step_2/data_plane/controller_state.pkl"


class _Marker:
    """Unpickling this runs `call(marker)`, which creates the marker file: proof that a pickle ran."""

    def __init__(self, call: Any, arg: Any) -> None:
        self.call, self.arg = call, arg

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.call, (self.arg,))


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in sorted(value)] if isinstance(value, set) else [_plain(v) for v in value]
    if hasattr(value, "__dict__"):
        return (type(value).__qualname__, _plain(vars(value)))
    return value


def test_a_controller_state_written_by_transferqueue_loads_as_plain_pickle_loads_it() -> None:
    state = unpickling.load_controller_state(FIXTURE)  # a real one: main at 58dd19e, four groups of rows
    with open(FIXTURE, "rb") as f:
        assert _plain(state) == _plain(pickle.load(f))
    partition = state["partitions"]["rollouts"]
    assert partition.production_status.dtype == torch.int8 and partition.production_status.shape == (8, 4)
    assert partition.field_metadata["tokens"].dtype == torch.int64
    unpickling.check_controller_state(FIXTURE)


def test_every_torch_dtype_is_allowed_and_nothing_else_from_torch() -> None:
    dtypes = [torch.int64, torch.bfloat16, torch.bool, torch.float8_e4m3fn, torch.complex64]
    assert unpickling.ControllerUnpickler(io.BytesIO(pickle.dumps(dtypes)), "x").load() == dtypes
    with pytest.raises(
        CheckpointCorrupt, match=r"x: references torch\.serialization\.load, which a TransferQueue controller"
    ):
        unpickling.ControllerUnpickler(io.BytesIO(pickle.dumps(torch.load)), "x").load()


@pytest.mark.parametrize(
    ("make", "forbidden"),
    [
        (lambda m: _Marker(os.system, f"touch {m}"), "posix.system"),
        (lambda m: _Marker(exec, f"open({str(m)!r}, 'w').close()"), "builtins.exec"),
        (lambda m: _Marker(Path.touch, m), "pathlib.Path.touch"),
        (lambda m: _Marker(shutil.copy, (str(FIXTURE), str(m))), "shutil.copy"),
    ],
)
def test_a_pickle_naming_any_other_global_is_refused_naming_it_before_it_runs(
    tmp_path: Path, make: Any, forbidden: str
) -> None:
    marker = tmp_path / "ran"
    if forbidden != "shutil.copy":  # proof that the payload creates the marker when plainly unpickled
        pickle.loads(pickle.dumps(make(marker)))
        assert marker.exists()
        marker.unlink()
    path = tmp_path / "controller_state.pkl"
    state = {"controller_id": "c", "partitions": {"p": make(marker)}, "index_manager": {}, "sampler": {}}
    path.write_bytes(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
    with pytest.raises(CheckpointCorrupt, match=rf"^{path}: references {forbidden}, "):
        unpickling.check_controller_state(path)
    assert not marker.exists()


def test_a_payload_hidden_in_a_tensors_storage_bytes_is_refused_before_it_runs(tmp_path: Path) -> None:
    """`torch.storage._load_from_bytes` is allowed (it rebuilds a tensor's storage), but the bytes it is given go
    through torch's weights-only unpickler, not the unrestricted `torch.load` the stock function calls."""
    marker = tmp_path / "ran"
    inner = pickle.dumps(_Marker(os.system, f"touch {marker}"), protocol=2)
    crafted = _Marker(torch.storage._load_from_bytes, inner)
    with pytest.raises(RuntimeError, match="Invalid magic number"):  # the stock function runs it, then fails
        pickle.loads(pickle.dumps(crafted))
    assert marker.exists()
    marker.unlink()
    path = tmp_path / "controller_state.pkl"
    path.write_bytes(pickle.dumps({"controller_id": "c", "partitions": crafted}, protocol=pickle.HIGHEST_PROTOCOL))
    with pytest.raises(CheckpointCorrupt, match=rf"^{path}: unreadable controller state \(UnpicklingError: "):
        unpickling.check_controller_state(path)
    assert not marker.exists()


def test_a_damaged_or_foreign_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "controller_state.pkl"
    path.write_bytes(FIXTURE.read_bytes()[:700])
    with pytest.raises(CheckpointCorrupt, match=rf"^{path}: unreadable controller state"):
        unpickling.check_controller_state(path)
    path.write_bytes(pickle.dumps({"something": "else"}))
    with pytest.raises(CheckpointCorrupt, match=rf"^{path}: not a TransferQueue controller state"):
        unpickling.check_controller_state(path)
    with pytest.raises(CheckpointCorrupt, match=rf"^{tmp_path / 'absent'}: unreadable controller state"):
        unpickling.check_controller_state(tmp_path / "absent")
