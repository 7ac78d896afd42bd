"""ReplayIndex: reservations, commit order, the state dict round trip, the digest, and every preflight rejection.

Pure: no Ray, no torch, no TransferQueue (a probe checks that importing the module pulls none of them in).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import pytest

from trainingrun_runtime import digest
from trainingrun_runtime.dataplane.replay_index import ReplayIndex
from trainingrun_runtime.errors import DataPlaneError, DigestError, PreflightError


def make_index(groups: int = 3, *, capacity: int = 8) -> ReplayIndex:
    index = ReplayIndex(partition="train", group_size=2, capacity=capacity)
    for g in range(groups):
        index.reserve(f"g{g}", meta={"prompt": g, "version": 1})
        index.commit(f"g{g}")
    return index


def rebuild(state: dict[str, Any], **overrides: Any) -> ReplayIndex:
    kwargs: dict[str, Any] = {"partition": "train", "group_size": 2, "capacity": 8}
    kwargs.update(overrides)
    return ReplayIndex.from_state_dict(state, **kwargs)


def test_the_index_and_the_buffer_import_no_ray_torch_or_transferqueue() -> None:
    probe = (
        "import sys, trainingrun_runtime.dataplane.replay_index, trainingrun_runtime.dataplane.replay_buffer\n"
        "print(','.join(n for n in ('ray', 'torch', 'transfer_queue', 'tensordict') if n in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ""


def test_default_sample_ids_name_the_group_and_member() -> None:
    index = ReplayIndex(partition="train", group_size=3, capacity=4)
    assert index.reserve("g7").sample_ids == ("g7:0", "g7:1", "g7:2")


def test_only_committed_groups_are_stored_and_saved() -> None:
    index = make_index(2)
    index.reserve("pending")
    assert index.stored_sample_ids() == {"g0:0", "g0:1", "g1:0", "g1:1"}
    assert [g["group_id"] for g in index.state_dict()["groups"]] == ["g0", "g1"]
    assert [r.group_id for r in index.reserved()] == ["pending"]


def test_commit_order_is_kept_not_reservation_order() -> None:
    index = ReplayIndex(partition="train", group_size=1, capacity=4)
    for g in ("a", "b", "c"):
        index.reserve(g)
    for g in ("c", "a", "b"):
        index.commit(g)
    assert [r.group_id for r in index.committed()] == ["c", "a", "b"]
    assert [g["group_id"] for g in rebuild(index.state_dict(), group_size=1).state_dict()["groups"]] == ["c", "a", "b"]


def test_state_dict_round_trips_exactly() -> None:
    index = make_index(3)
    index.release("g1")
    state = index.state_dict()
    again = rebuild(copy.deepcopy(state), stored_ids=index.stored_sample_ids(), expected_digest=state["digest"])
    assert again.state_dict() == state
    assert again.digest() == index.digest() == state["digest"]
    assert again.stored_sample_ids() == {"g0:0", "g0:1", "g2:0", "g2:1"}


def test_digest_ignores_key_order_but_not_content() -> None:
    a = ReplayIndex(partition="train", group_size=1, capacity=2)
    a.reserve("g", meta={"x": 1, "y": 2})
    a.commit("g")
    b = ReplayIndex(partition="train", group_size=1, capacity=2)
    b.reserve("g", meta={"y": 2, "x": 1})
    b.commit("g")
    assert a.digest() == b.digest() == digest.sha256_hex(a.groups_payload())
    c = ReplayIndex(partition="train", group_size=1, capacity=2)
    c.reserve("g", meta={"x": 1, "y": 3})
    c.commit("g")
    assert c.digest() != a.digest()


def test_group_meta_must_be_json_values_and_the_error_names_the_field() -> None:
    index = ReplayIndex(partition="train", group_size=1, capacity=2)
    with pytest.raises(DigestError, match=r"reward\.mean"):
        index.reserve("g", meta={"reward": {"mean": float("nan")}})
    assert "g" not in index


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (lambda i: i.reserve("g0"), "already in the replay index"),
        (lambda i: i.reserve("x", sample_ids=["g1:0", "new"]), "already belong to group 'g1'"),
        (lambda i: i.reserve("x", sample_ids=["a"]), "group size is 2"),
        (lambda i: i.reserve("x", sample_ids=["a", "a"]), "duplicate sample ids"),
        (lambda i: i.commit("g0"), "already committed"),
    ],
)
def test_reserve_and_commit_refuse_misuse(action: Any, message: str) -> None:
    index = make_index(2)
    before = index.state_dict()
    with pytest.raises((DataPlaneError, ValueError), match=message):
        action(index)
    assert index.state_dict() == before


def test_reservations_count_against_capacity() -> None:
    index = make_index(1, capacity=2)
    index.reserve("pending")
    with pytest.raises(DataPlaneError, match="full: 2 of 2"):
        index.reserve("more")
    index.release("pending")
    index.reserve("more")


def test_release_frees_the_sample_ids() -> None:
    index = make_index(1)
    index.release("g0")
    assert index.reserve("again", sample_ids=["g0:0", "g0:1"]).sample_ids == ("g0:0", "g0:1")
    with pytest.raises(KeyError, match="'g0' is not in the replay index"):
        index.release("g0")


def tampered(mutate: Any, *, redigest: bool = True) -> dict[str, Any]:
    state = make_index(3).state_dict()
    mutate(state)
    if redigest:
        state["digest"] = digest.sha256_hex(state["groups"])
    return state


@pytest.mark.parametrize(
    ("state", "kwargs", "error", "message"),
    [
        (tampered(lambda s: s.update(format=2)), {}, PreflightError, "unsupported state format 2"),
        (tampered(lambda s: None), {"partition": "eval"}, PreflightError, "partition is 'train'.*uses 'eval'"),
        (tampered(lambda s: None), {"group_size": 4}, PreflightError, "group size is 2, this buffer uses 4"),
        (tampered(lambda s: None), {"capacity": 2}, PreflightError, "3 groups exceed this buffer's capacity of 2"),
        (
            tampered(lambda s: s["groups"][1].update(sample_ids=["g0:0", "x"])),
            {},
            PreflightError,
            r"groups\[1\]: duplicate sample ids \['g0:0'\]",
        ),
        (
            tampered(lambda s: s["groups"][2].update(group_id="g0")),
            {},
            PreflightError,
            r"groups\[2\]: duplicate group id 'g0'",
        ),
        (
            tampered(lambda s: s["groups"][0].update(sample_ids=["only-one"])),
            {},
            PreflightError,
            r"groups\[0\]: has 1 sample ids, the group size is 2",
        ),
        (tampered(lambda s: s["groups"][0].pop("meta")), {}, PreflightError, r"groups\[0\]: must be"),
        (
            tampered(lambda s: s["groups"].pop(), redigest=False),
            {},
            DigestError,
            "digest mismatch: recorded",
        ),
        (tampered(lambda s: None), {"expected_digest": "0" * 64}, DigestError, "does not match the manifest"),
        (
            tampered(lambda s: None),
            {"stored_ids": {"g0:0", "g0:1", "g1:0", "g1:1", "g2:0", "stray"}},
            PreflightError,
            r"1 stored but not indexed \['stray'\], 1 indexed but not stored \['g2:1'\]",
        ),
    ],
    ids=[
        "format",
        "partition",
        "group-size",
        "capacity",
        "duplicate-sample-ids",
        "duplicate-group-id",
        "short-group",
        "malformed-group",
        "own-digest",
        "manifest-digest",
        "inventory",
    ],
)
def test_preflight_rejects_with_a_message_naming_the_problem(
    state: dict[str, Any], kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        rebuild(state, where="step_3/replay_buffer_metadata.pt", **kwargs)
    assert str(caught.value).startswith("step_3/replay_buffer_metadata.pt: ")


def test_preflight_accepts_an_empty_index() -> None:
    state = ReplayIndex(partition="train", group_size=2, capacity=1).state_dict()
    assert len(rebuild(state, stored_ids=[])) == 0
